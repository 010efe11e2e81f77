"""The evidence report's shape: writing one from what judging found, and reading one back.

A host's report travels as JSON: `tmi evidence` prints it and posts it, and the allocation
controller's collector exports its figures as metrics. Both sides go through this module (the
judgement renders with `render_report`, the collector reads with `read_report`), so they cannot
disagree on the shape, and a post that does not have it is refused before it can mint label sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from inference_policy.evidence.fields import as_map
from inference_policy.evidence.observations import EvidenceError, GpuDevice, Observation, PodInfo

__all__ = [
    "EVIDENCE_KIND",
    "MAX_LABEL",
    "MAX_ROWS",
    "SCHEMA_VERSION",
    "AllocationRow",
    "GpuRow",
    "Presence",
    "ReportView",
    "read_report",
    "render_report",
]

EVIDENCE_KIND = "tmi.gpu-sharing-evidence"
SCHEMA_VERSION = 1

# Who was on which card: sample index -> GPU uuid -> holder (a Pod uid, or "pid:<n>" for a
# process no known Pod owns) -> the GPU instance ids it used there (None: the whole card).
Presence: TypeAlias = Mapping[int, Mapping[str, Mapping[str, set[int | None]]]]


# -- writing a report ----------------------------------------------------------------------------


def render_report(
    observation: Observation,
    *,
    node: str | None,
    presence: Presence,
    pods: Mapping[str, PodInfo],
    allocations: list[dict[str, Any]],
    overlaps: list[dict[str, Any]],
    bypasses: list[dict[str, Any]],
    idle_pods: list[str],
    job_outcomes: list[dict[str, Any]],
    verdict: dict[str, Any],
) -> dict[str, Any]:
    """The report document for one host, from the judged sections; `pods` maps uid to Pod."""
    return {
        "kind": EVIDENCE_KIND,
        "schemaVersion": SCHEMA_VERSION,
        "node": node or "",
        "source": observation.source,
        "driver": observation.driver,
        "samples": [{"index": s.index, "timestamp": s.timestamp} for s in observation.samples],
        "gpus": _gpus(observation.devices, presence, pods, bypasses),
        "allocations": allocations,
        "overlaps": overlaps,
        "bypasses": bypasses,
        "idlePods": idle_pods,
        "jobOutcomes": job_outcomes,
        "verdict": verdict,
    }


def _gpus(
    devices: Sequence[GpuDevice],
    presence: Presence,
    infos: Mapping[str, PodInfo],
    bypasses: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    out = []
    for device in sorted(devices, key=lambda d: d.index):
        holders: dict[str, set[int | None]] = {}
        for sample in presence.values():
            for holder, instances in sample.get(device.uuid, {}).items():
                holders.setdefault(holder, set()).update(instances)
        pods = [
            {
                "namespace": infos[h].namespace,
                "pod": infos[h].name,
                "podUid": h,
                "migInstances": sorted(i for i in instances if i is not None),
            }
            for h, instances in holders.items()
            if h in infos
        ]
        pods.sort(key=lambda p: (p["namespace"], p["pod"]))
        mine = [b for b in bypasses if b["gpuUuid"] == device.uuid]
        out.append(
            {
                "uuid": device.uuid,
                "index": device.index,
                "name": device.name,
                "memoryTotalBytes": device.memory_total_bytes,
                "migEnabled": device.mig_enabled,
                "migInstances": [
                    {
                        "gpuInstanceId": m.gpu_instance_id,
                        "computeInstanceId": m.compute_instance_id,
                        "uuid": m.uuid,
                        "profile": m.profile,
                        "memoryTotalBytes": m.memory_total_bytes,
                    }
                    for m in device.mig_instances
                ],
                "pods": pods,
                # Which tenants (namespaces) held the card: one, unless the owner let tenants
                # share it (`inference_policy.placing.tenancy`) or something went around the rule.
                "tenants": sorted({str(p["namespace"]) for p in pods}),
                "unaccountedProcesses": len(mine),
                "unaccountedBytes": sum(b["usedBytes"] or 0 for b in mine),
            }
        )
    return out


# -- reading a report back (the collector's side) ------------------------------------------------

MAX_ROWS = 4096
MAX_LABEL = 253


@dataclass(frozen=True, slots=True)
class AllocationRow:
    """One allocation's figures, labelled for export."""

    node: str
    namespace: str
    pod: str
    workload: str
    binding: str
    gpu_uuid: str
    mig_instance: str
    isolation: str
    granted_bytes: int | None
    used_bytes: int | None
    overuse_bytes: int | None
    status: str


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One physical GPU's figures, labelled for export."""

    node: str
    gpu_uuid: str
    pods: int
    unaccounted_processes: int
    unaccounted_bytes: int
    overlapping_pairs: int


@dataclass(frozen=True, slots=True)
class ReportView:
    """The figures of one host's report that a collector exports."""

    node: str
    status: str
    allocations: tuple[AllocationRow, ...]
    gpus: tuple[GpuRow, ...]


def _label(value: Any, where: str, *, empty: bool = False) -> str:
    if value is None and empty:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise EvidenceError(f"{where} must be a string")
    text = str(value)
    if len(text) > MAX_LABEL or (not text and not empty):
        raise EvidenceError(f"{where} must be 1 to {MAX_LABEL} characters")
    return text


def _bytes(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EvidenceError(f"{where} must be a non-negative integer or null")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_ROWS:
        raise EvidenceError(f"{where} must be a list of at most {MAX_ROWS} entries")
    return value


def read_report(document: Any) -> ReportView:
    """Read the figures a collector exports from a report `judge` produced (and a DaemonSet
    posted): refuses anything else, so a malformed post cannot mint label sets."""
    if not isinstance(document, Mapping):
        raise EvidenceError("a report is a JSON object")
    if document.get("kind") != EVIDENCE_KIND or document.get("schemaVersion") != SCHEMA_VERSION:
        raise EvidenceError(f"not a {EVIDENCE_KIND} report of schema {SCHEMA_VERSION}")
    node = _label(document.get("node"), "node")
    verdict = as_map(document.get("verdict"))
    status = verdict.get("status")
    if status not in ("honoured", "not-honoured", "inconclusive"):
        raise EvidenceError("verdict.status must be honoured, not-honoured or inconclusive")
    rows = []
    for i, raw in enumerate(_list(document.get("allocations"), "allocations")):
        entry = as_map(raw)
        where = f"allocations[{i}]"
        state = entry.get("status")
        if state not in ("honoured", "not-honoured", "inconclusive"):
            raise EvidenceError(f"{where}.status is not a status")
        rows.append(
            AllocationRow(
                node=node,
                namespace=_label(entry.get("namespace"), f"{where}.namespace"),
                pod=_label(entry.get("pod"), f"{where}.pod"),
                workload=_label(entry.get("workload"), f"{where}.workload", empty=True),
                binding=_label(entry.get("bindingId"), f"{where}.bindingId", empty=True),
                gpu_uuid=_label(entry.get("gpuUuid"), f"{where}.gpuUuid"),
                mig_instance=_label(entry.get("migInstance"), f"{where}.migInstance", empty=True),
                isolation=_label(entry.get("isolation"), f"{where}.isolation"),
                granted_bytes=_bytes(entry.get("grantedBytes"), f"{where}.grantedBytes"),
                used_bytes=_bytes(entry.get("usedBytes"), f"{where}.usedBytes"),
                overuse_bytes=_bytes(entry.get("overuseBytes"), f"{where}.overuseBytes"),
                status=str(state),
            )
        )
    overlaps: dict[str, int] = {}
    for i, raw in enumerate(_list(document.get("overlaps"), "overlaps")):
        uuid = _label(as_map(raw).get("gpuUuid"), f"overlaps[{i}].gpuUuid")
        overlaps[uuid] = overlaps.get(uuid, 0) + 1
    gpus = []
    for i, raw in enumerate(_list(document.get("gpus"), "gpus")):
        entry = as_map(raw)
        where = f"gpus[{i}]"
        uuid = _label(entry.get("uuid"), f"{where}.uuid")
        gpus.append(
            GpuRow(
                node=node,
                gpu_uuid=uuid,
                pods=len(_list(entry.get("pods"), f"{where}.pods")),
                unaccounted_processes=_bytes(
                    entry.get("unaccountedProcesses"), f"{where}.unaccountedProcesses"
                )
                or 0,
                unaccounted_bytes=_bytes(entry.get("unaccountedBytes"), f"{where}.unaccountedBytes")
                or 0,
                overlapping_pairs=overlaps.get(uuid, 0),
            )
        )
    return ReportView(node=node, status=str(status), allocations=tuple(rows), gpus=tuple(gpus))
