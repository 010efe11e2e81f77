"""GPU-sharing evidence: which physical GPU each engine Pod holds, who overlaps, and whether each
accounted share is honoured.

A profile promises an isolation and the planner grants it, but nothing in admission or
scheduling observes what the engines then do on the card. This package judges what a GPU host
was seen doing against what each Pod was granted, free of I/O so that it runs on recorded output
as well as on a live host. Its parts, one job each:

* `observations`: the typed records the readers in `tmi_cli` hand in (devices, processes per
  sample, each process's cgroup owner), and the Pods and grants read from Pod objects;
* `judging`: `judge`, holding the observation against the grants (overlaps, each allocation's
  used memory against its grant, the processes no grant accounts for, the verdict);
* `report`: the report's shape, rendered from the judgement and read back by the collector
  (`read_report`), so the two cannot disagree on it;
* `pressure`: how a memory-pressure Pod of the acceptance kit ended.

What the figures mean (and do not) is the owner's document, docs/sharing-evidence.md. The names
below are the package's interface; importers need not know which part holds which.
"""

from __future__ import annotations

from inference_policy.evidence.judging import VRAM_UNIT_BYTES, judge
from inference_policy.evidence.observations import (
    EvidenceError,
    GpuDevice,
    GpuProcess,
    Grant,
    MigInstance,
    Observation,
    PodInfo,
    ProcessOwner,
    Sample,
    grant_of,
    pod_info,
)
from inference_policy.evidence.pressure import CUDA_OOM_EXIT_CODE, classify_job_pod
from inference_policy.evidence.report import (
    EVIDENCE_KIND,
    SCHEMA_VERSION,
    AllocationRow,
    GpuRow,
    ReportView,
    read_report,
)

__all__ = [
    "CUDA_OOM_EXIT_CODE",
    "EVIDENCE_KIND",
    "SCHEMA_VERSION",
    "VRAM_UNIT_BYTES",
    "AllocationRow",
    "EvidenceError",
    "GpuDevice",
    "GpuProcess",
    "GpuRow",
    "Grant",
    "MigInstance",
    "Observation",
    "PodInfo",
    "ProcessOwner",
    "ReportView",
    "Sample",
    "classify_job_pod",
    "grant_of",
    "judge",
    "pod_info",
    "read_report",
]
