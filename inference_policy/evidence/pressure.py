"""How a memory-pressure Pod ended, told apart by what its container left behind.

The memory-pressure kit (manifests/acceptance/cuda_pressure.py) allocates past a Pod's grant and
expects the driver to refuse. A Pod that stops can mean that, or that the kernel killed it for
host memory, or that it was evicted, and only the first says anything about GPU isolation; the
classification reads the container's termination and log so the report names which one it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from inference_policy.base.pod_view import PodView
from inference_policy.evidence.fields import as_map, as_text

__all__ = ["CUDA_OOM_EXIT_CODE", "classify_job_pod"]

# The kit exits with this status when the driver refused an allocation, so a Pod whose log was
# lost is still classified.
CUDA_OOM_EXIT_CODE = 42

# Lines CUDA stacks print when the driver refuses device memory: the driver API, the runtime
# API, PyTorch, and the kit's own marker. None of them appears when the kernel kills a process
# for host memory, which is what the classification must tell apart.
_CUDA_OOM = re.compile(
    r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUDA out of memory|"
    r"OutOfMemoryError|CUDA error: out of memory|tmi-memory-pressure: outcome=cuda-oom"
)
_KIT_SUCCESS = re.compile(r"tmi-memory-pressure: outcome=allocated")


def _terminated(status: Mapping[str, Any], container: str | None) -> tuple[str, Mapping[str, Any]]:
    entries = status.get("containerStatuses")
    for raw in entries if isinstance(entries, list) else ():
        entry = as_map(raw)
        if container is not None and entry.get("name") != container:
            continue
        name = as_text(entry.get("name"))
        for key in ("state", "lastState"):
            terminated = as_map(as_map(entry.get(key)).get("terminated"))
            if terminated:
                return name, terminated
        return name, {}
    return container or "", {}


def classify_job_pod(
    pod: Mapping[str, Any], log: str | None = None, container: str | None = None
) -> dict[str, Any]:
    """How a memory-pressure Pod ended: `cuda-oom` (the driver refused the allocation past the
    grant: what the kit expects), `host-oom-killed` (the kernel killed it for host memory: the
    test measured the wrong limit), `evicted`, `succeeded` (the allocation past the grant went
    through: nothing enforces the share), `failed` (another error) or `not-finished`."""
    view = PodView(pod)
    status = view.status
    name, terminated = _terminated(status, container)
    reason = as_text(terminated.get("reason"))
    exit_code = terminated.get("exitCode")
    exit_code = exit_code if isinstance(exit_code, int) else None
    log_line = _first_match(_CUDA_OOM, log or "")
    outcome: str
    detail: str
    if as_text(status.get("reason")) == "Evicted":
        outcome, detail = "evicted", as_text(status.get("message")) or "the kubelet evicted the Pod"
    elif reason == "OOMKilled":
        outcome = "host-oom-killed"
        detail = (
            "the kernel killed the container for host memory (OOMKilled): raise the container's "
            "memory limit; this says nothing about GPU memory"
        )
    elif not terminated:
        outcome, detail = "not-finished", "the container has not terminated"
    elif log_line is not None or exit_code == CUDA_OOM_EXIT_CODE:
        outcome = "cuda-oom"
        detail = log_line or f"exit code {CUDA_OOM_EXIT_CODE} (the kit's CUDA out-of-memory status)"
    elif exit_code == 0:
        outcome = "succeeded"
        detail = _first_match(_KIT_SUCCESS, log or "") or (
            "the allocation past the grant succeeded: nothing on this GPU enforces the share "
            "(a time-sliced card gives no memory isolation)"
        )
    else:
        outcome = "failed"
        detail = f"terminated with {reason or 'no reason'}, exit code {exit_code}"
    return {
        "namespace": view.namespace or "",
        "pod": view.name or "",
        "container": name,
        "outcome": outcome,
        "expected": "cuda-oom",
        "passed": outcome == "cuda-oom",
        "reason": reason or None,
        "exitCode": exit_code,
        "detail": detail,
    }


def _first_match(pattern: re.Pattern[str], text: str) -> str | None:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:512]
    return None
