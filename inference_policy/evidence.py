"""GPU-sharing evidence: which physical GPU each engine Pod holds, who overlaps, and whether each
accounted share is honoured.

A profile promises an isolation (a whole device, a MIG slice, an accounted VRAM share) and the
planner grants it, but nothing in admission or scheduling observes what the engines then do on
the card. This module judges what a GPU host was seen doing against what each Pod was granted:
the readers in `tmi_cli` (NVML or nvidia-smi for the processes, `/proc/<pid>/cgroup` for the Pod
each process belongs to, a Pod list for the plans) hand their observations in as values, and the
report comes out as JSON-ready data. Keeping the judgement here keeps it free of I/O and testable
on recorded output, and the collector that exports the report as metrics reads it back through
`read_report` in this same module, so the two cannot disagree on its shape.

What the figures mean (and do not) is the owner's document, docs/sharing-evidence.md. In short:
memory used is what the driver accounts to a process; on a time-sliced card an accounted share
is honoured only by the engine staying inside its budget (nothing enforces it), on a MIG slice
the hardware enforces it, and a whole device must carry no one else's process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Final, Literal

from inference_policy.engine_pod import engine_container_name
from inference_policy.plan import Plan, PlanError, parse_plan
from inference_policy.quantity import GI, QuantityError, resource_units
from inference_policy.wire import (
    ENGINE_LABEL,
    MIG_RESOURCE_PREFIX,
    PLAN_ANNOTATION,
    VRAM_RESOURCE_PREFIX,
    WHOLE_GPU_RESOURCE,
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

EVIDENCE_KIND: Final = "tmi.gpu-sharing-evidence"
SCHEMA_VERSION: Final = 1
# The planner sizes an accounted share in whole GiB (`share_gib * GI` against usableMemory), so
# one unit of a `kamiwaza.ai/vram-gb-*` request is one GiB of the card.
VRAM_UNIT_BYTES: Final = GI
# The memory-pressure kit (manifests/acceptance/cuda_pressure.py) exits with this status when the
# driver refused an allocation, so a Pod whose log was lost is still classified.
CUDA_OOM_EXIT_CODE: Final = 42

Isolation = Literal["accounted-share", "mig", "whole-device"]
Status = Literal["honoured", "not-honoured", "inconclusive"]


class EvidenceError(ValueError):
    """An observation or a report that cannot be judged or read; the message says why."""


# -- what the readers hand in ------------------------------------------------------------------


@dataclass(frozen=True)
class MigInstance:
    """One MIG compute instance of a physical GPU, as the driver lists it."""

    gpu_instance_id: int
    compute_instance_id: int | None = None
    uuid: str | None = None
    profile: str | None = None  # "1g.18gb"
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU: the UUID is what every figure in the report is keyed by."""

    uuid: str
    index: int
    name: str
    memory_total_bytes: int
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()

    def instance(self, gpu_instance_id: int | None) -> MigInstance | None:
        if gpu_instance_id is None:
            return None
        for found in self.mig_instances:
            if found.gpu_instance_id == gpu_instance_id:
                return found
        return None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a compute context on a GPU (or on one of its MIG instances)."""

    pid: int
    gpu_uuid: str
    # None where the driver would not say (MIG without privileges, some containers).
    used_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm_util_percent: int | None = None
    name: str | None = None


@dataclass(frozen=True)
class Sample:
    """The processes seen at one moment; two Pods overlap when both appear in one sample."""

    index: int
    timestamp: str
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class Observation:
    source: str
    driver: str | None
    devices: tuple[GpuDevice, ...]
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class ProcessOwner:
    """Where a process lives, from its cgroup: the Pod uid and container id, when it is in one."""

    pod_uid: str | None
    container_id: str | None = None
    cgroup: str = ""


@dataclass(frozen=True)
class Grant:
    """What a Pod's plan grants on a GPU, before the card it landed on is known."""

    isolation: Isolation
    resource: str
    quantity: int
    binding_id: str | None
    # vLLM budgets this fraction of the whole card it sees.
    engine_memory_fraction: float | None = None


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str | None
    workload: str
    plan: Plan | None
    plan_error: str | None
    engine_container: str | None
    container_ids: Mapping[str, str] = field(default_factory=dict)  # container id -> name

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


# -- reading Pods --------------------------------------------------------------------------------

_CONTAINER_ID = re.compile(r"^[a-z0-9.+-]+://(?P<id>[0-9a-f]{12,128})$")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def pod_info(pod: Mapping[str, Any]) -> PodInfo | None:
    """What the judgement needs from a Pod object; None when it has no uid to be found by."""
    metadata = _map(pod.get("metadata"))
    uid = _text(metadata.get("uid")).lower()
    if not uid:
        return None
    annotations = _map(metadata.get("annotations"))
    labels = _map(metadata.get("labels"))
    plan: Plan | None = None
    plan_error: str | None = None
    text = annotations.get(PLAN_ANNOTATION)
    if text is None:
        plan_error = f"no {PLAN_ANNOTATION} annotation"
    else:
        try:
            plan = parse_plan(text)
        except PlanError as exc:
            plan_error = str(exc)
    status = _map(pod.get("status"))
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        entries = status.get(key)
        for raw in entries if isinstance(entries, list) else ():
            entry = _map(raw)
            match = _CONTAINER_ID.match(_text(entry.get("containerID")))
            if match and _text(entry.get("name")):
                ids[match["id"]] = _text(entry.get("name"))
    return PodInfo(
        uid=uid,
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        node=_text(_map(pod.get("spec")).get("nodeName")) or None,
        workload=_text(labels.get(ENGINE_LABEL)),
        plan=plan,
        plan_error=plan_error,
        engine_container=engine_container_name(pod),
        container_ids=ids,
    )


def grant_of(plan: Plan | None) -> Grant | None:
    """The GPU grant a plan names: an accounted share, a MIG slice or whole devices; None for a
    CPU or external plan (a GPU process in such a Pod holds no grant at all)."""
    if plan is None or plan.path != "gpu":
        return None
    fraction = (plan.engineArgs or {}).get("gpu_memory_utilization")
    for name, value in plan.requests.items():
        try:
            quantity = resource_units(name, value)
        except QuantityError:  # pragma: no cover - parse_plan already refused it
            continue
        isolation: Isolation
        if name.startswith(VRAM_RESOURCE_PREFIX):
            isolation = "accounted-share"
        elif name.startswith(MIG_RESOURCE_PREFIX):
            isolation = "mig"
        elif name == WHOLE_GPU_RESOURCE:
            isolation = "whole-device"
        else:
            continue
        return Grant(
            isolation=isolation,
            resource=name,
            quantity=quantity,
            binding_id=plan.bindingId,
            engine_memory_fraction=float(fraction) if fraction is not None else None,
        )
    return None


# -- judging -------------------------------------------------------------------------------------

# Findings that make an allocation not honoured; the rest are notes beside the figures.
FAILING: Final = frozenset(
    {
        "over-grant",
        "device-shared",
        "share-spans-devices",
        "not-on-mig-slice",
        "slice-profile-mismatch",
    }
)
INCONCLUSIVE: Final = frozenset({"memory-unknown", "grant-unknown"})

BYPASS_NOT_IN_POD = "not-in-a-pod"
BYPASS_UNKNOWN_POD = "unknown-pod"
BYPASS_NO_GRANT = "no-gpu-grant"
BYPASS_UNPLANNED_CONTAINER = "unplanned-container"
UNATTRIBUTED = "unattributed"


@dataclass
class _Alloc:
    pod: PodInfo
    grant: Grant
    gpu: GpuDevice
    instance: MigInstance | None
    pids: set[int] = field(default_factory=set)
    used: dict[int, int | None] = field(default_factory=dict)  # sample -> bytes
    sm_util: int | None = None


def _mig_profile(resource: str) -> str:
    return resource.removeprefix(MIG_RESOURCE_PREFIX)


def judge(
    observation: Observation,
    owners: Mapping[int, ProcessOwner],
    pods: Iterable[Mapping[str, Any]],
    *,
    node: str | None = None,
    job_outcomes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The evidence report for one host: Pods per physical GPU, overlaps, each allocation's used
    memory against its grant, the processes no grant accounts for, and the verdict.

    ``owners`` maps each observed pid to its cgroup's Pod uid (a pid missing from it could not be
    attributed); ``pods`` are Pod objects as the API serves them.
    """
    devices = {device.uuid: device for device in observation.devices}
    infos: dict[str, PodInfo] = {}
    for pod in pods:
        info = pod_info(pod)
        if info is not None:
            infos[info.uid] = info

    allocs: dict[tuple[str, str, int | None], _Alloc] = {}
    bypasses: dict[tuple[int, str], dict[str, Any]] = {}
    # sample -> gpu uuid -> pod uid -> set of gpu instance ids (None: the whole card)
    presence: dict[int, dict[str, dict[str, set[int | None]]]] = {}
    unknown_devices: set[str] = set()

    for sample in observation.samples:
        seen = presence.setdefault(sample.index, {})
        for proc in sample.processes:
            gpu = devices.get(proc.gpu_uuid)
            if gpu is None:
                unknown_devices.add(proc.gpu_uuid)
                continue
            owner = owners.get(proc.pid)
            info = infos.get(owner.pod_uid) if owner and owner.pod_uid else None
            if info is not None:
                seen.setdefault(gpu.uuid, {}).setdefault(info.uid, set()).add(proc.gpu_instance_id)
            grant = grant_of(info.plan) if info is not None else None
            reason = _bypass_reason(owner, info, grant)
            # `_bypass_reason` is None only with both a Pod and a grant; the test says so to mypy.
            if reason is not None or info is None or grant is None:
                _record_bypass(bypasses, proc, sample.index, owner, info, reason or UNATTRIBUTED)
                if info is None:
                    # Not a Pod we know, but still someone on the card for overlap purposes.
                    holder = f"pid:{proc.pid}"
                    seen.setdefault(gpu.uuid, {}).setdefault(holder, set()).add(
                        proc.gpu_instance_id
                    )
                continue
            instance = gpu.instance(proc.gpu_instance_id)
            key = (info.uid, gpu.uuid, proc.gpu_instance_id)
            alloc = allocs.get(key)
            if alloc is None:
                alloc = allocs[key] = _Alloc(info, grant, gpu, instance)
            alloc.pids.add(proc.pid)
            before = alloc.used.get(sample.index, 0)
            alloc.used[sample.index] = (
                None if before is None or proc.used_bytes is None else before + proc.used_bytes
            )
            if proc.sm_util_percent is not None:
                alloc.sm_util = max(alloc.sm_util or 0, proc.sm_util_percent)

    overlaps = _overlaps(presence, infos)
    allocations = [_judge_alloc(alloc, allocs, presence, infos) for alloc in allocs.values()]
    allocations.sort(key=lambda a: (a["gpuUuid"], a["namespace"], a["pod"], a["migInstance"]))
    bypass_list = sorted(bypasses.values(), key=lambda b: (b["gpuUuid"], b["pid"]))
    outcomes = [dict(outcome) for outcome in job_outcomes]

    report: dict[str, Any] = {
        "kind": EVIDENCE_KIND,
        "schemaVersion": SCHEMA_VERSION,
        "node": node or "",
        "source": observation.source,
        "driver": observation.driver,
        "samples": [{"index": s.index, "timestamp": s.timestamp} for s in observation.samples],
        "gpus": _gpus(observation.devices, presence, infos, bypass_list),
        "allocations": allocations,
        "overlaps": overlaps,
        "bypasses": bypass_list,
        "idlePods": _idle_pods(infos, allocs, node),
        "jobOutcomes": outcomes,
    }
    report["verdict"] = _verdict(allocations, bypass_list, outcomes, sorted(unknown_devices))
    return report


def _bypass_reason(
    owner: ProcessOwner | None, info: PodInfo | None, grant: Grant | None
) -> str | None:
    """Why a process on a GPU holds no grant; None when its Pod's engine container does."""
    if owner is None:
        return UNATTRIBUTED
    if owner.pod_uid is None:
        return BYPASS_NOT_IN_POD
    if info is None:
        return BYPASS_UNKNOWN_POD
    if grant is None:
        return BYPASS_NO_GRANT
    container = info.container_ids.get(owner.container_id or "")
    if container is not None and info.engine_container and container != info.engine_container:
        # The webhook shields every container but the engine's; a context here went around it.
        return BYPASS_UNPLANNED_CONTAINER
    return None


def _record_bypass(
    bypasses: dict[tuple[int, str], dict[str, Any]],
    proc: GpuProcess,
    sample: int,
    owner: ProcessOwner | None,
    info: PodInfo | None,
    reason: str,
) -> None:
    key = (proc.pid, proc.gpu_uuid)
    entry = bypasses.get(key)
    if entry is None:
        entry = bypasses[key] = {
            "pid": proc.pid,
            "gpuUuid": proc.gpu_uuid,
            "migInstance": proc.gpu_instance_id,
            "processName": proc.name,
            "reason": reason,
            "podUid": owner.pod_uid if owner else None,
            "namespace": info.namespace if info else None,
            "pod": info.name if info else None,
            "cgroup": owner.cgroup if owner else None,
            "usedBytes": proc.used_bytes,
            "samples": [],
        }
    if proc.used_bytes is not None and (entry["usedBytes"] or 0) < proc.used_bytes:
        entry["usedBytes"] = proc.used_bytes
    if sample not in entry["samples"]:
        entry["samples"].append(sample)


def _granted_bytes(alloc: _Alloc) -> tuple[int | None, list[str]]:
    grant, findings = alloc.grant, list[str]()
    if grant.isolation == "accounted-share":
        return grant.quantity * VRAM_UNIT_BYTES, findings
    if alloc.instance is not None:
        profile = alloc.instance.profile
        # "nvidia.com/mig-1g.18gb" (the device plugin's mixed strategy) names the slice.
        if grant.isolation == "mig" and profile not in (None, _mig_profile(grant.resource)):
            findings.append("slice-profile-mismatch")
        memory = alloc.instance.memory_total_bytes
        if memory is None:
            findings.append("grant-unknown")
        return memory, findings
    if grant.isolation == "mig":
        findings.append("not-on-mig-slice")
        return None, findings
    return alloc.gpu.memory_total_bytes, findings


def _judge_alloc(
    alloc: _Alloc,
    allocs: Mapping[tuple[str, str, int | None], _Alloc],
    presence: Mapping[int, Mapping[str, Mapping[str, set[int | None]]]],
    infos: Mapping[str, PodInfo],
) -> dict[str, Any]:
    granted, findings = _granted_bytes(alloc)
    known = [value for value in alloc.used.values() if value is not None]
    used: int | None = max(known) if known else None
    if len(known) != len(alloc.used):
        findings.append("memory-unknown")
    overuse = max(0, used - granted) if used is not None and granted is not None else None
    if overuse:
        findings.append("over-grant")
    grant = alloc.grant
    if grant.isolation == "accounted-share":
        spans = {key[1] for key in allocs if key[0] == alloc.pod.uid}
        if len(spans) > 1:
            findings.append("share-spans-devices")
    if grant.isolation == "whole-device" and alloc.instance is None:
        others = {
            holder
            for sample in presence.values()
            for holder in sample.get(alloc.gpu.uuid, {})
            if holder != alloc.pod.uid
        }
        if others:
            findings.append("device-shared")
    notes: list[str] = []
    budget: int | None = None
    if grant.engine_memory_fraction is not None:
        # vLLM sizes its pool as this fraction of the memory of the device it sees.
        seen_total = (
            alloc.instance.memory_total_bytes if alloc.instance else alloc.gpu.memory_total_bytes
        )
        if seen_total is not None:
            budget = int(grant.engine_memory_fraction * seen_total)
            if granted is not None and budget > granted:
                notes.append("engine-budget-exceeds-grant")
    failing = sorted(set(findings) & FAILING)
    status: Status = (
        "not-honoured"
        if failing
        else "inconclusive"
        if set(findings) & INCONCLUSIVE
        else "honoured"
    )
    return {
        "namespace": alloc.pod.namespace,
        "pod": alloc.pod.name,
        "podUid": alloc.pod.uid,
        "workload": alloc.pod.workload,
        "bindingId": grant.binding_id or "",
        "isolation": grant.isolation,
        "resource": grant.resource,
        "quantity": grant.quantity,
        "gpuUuid": alloc.gpu.uuid,
        "gpuIndex": alloc.gpu.index,
        "migInstance": alloc.instance.gpu_instance_id if alloc.instance else None,
        "migUuid": alloc.instance.uuid if alloc.instance else None,
        "migProfile": alloc.instance.profile if alloc.instance else None,
        "memoryIsolation": _memory_isolation(grant, alloc.instance),
        "grantedBytes": granted,
        "usedBytes": used,
        "overuseBytes": overuse,
        "engineBudgetBytes": budget,
        "smUtilPercentMax": alloc.sm_util,
        "pids": sorted(alloc.pids),
        "samples": sorted(alloc.used),
        "findings": sorted(set(findings)),
        "notes": notes,
        "status": status,
    }


def _memory_isolation(grant: Grant, instance: MigInstance | None) -> str:
    if instance is not None:
        return "hardware (MIG slice)"
    if grant.isolation == "accounted-share":
        return "none (time-sliced card: the share holds only while the engine keeps its budget)"
    return "exclusive device (holds only while no other process is on the card)"


def _holder_ref(holder: str, infos: Mapping[str, PodInfo]) -> str:
    info = infos.get(holder)
    return info.ref if info is not None else holder


def _overlaps(
    presence: Mapping[int, Mapping[str, Mapping[str, set[int | None]]]],
    infos: Mapping[str, PodInfo],
) -> list[dict[str, Any]]:
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for index in sorted(presence):
        for uuid, holders in presence[index].items():
            for a, b in combinations(sorted(holders, key=lambda h: _holder_ref(h, infos)), 2):
                key = (uuid, a, b)
                entry = found.get(key)
                if entry is None:
                    # Distinct MIG instances share the card but not its memory.
                    separate = None not in holders[a] | holders[b] and not (holders[a] & holders[b])
                    entry = found[key] = {
                        "gpuUuid": uuid,
                        "holders": [_holder_ref(a, infos), _holder_ref(b, infos)],
                        "sameMemory": not separate,
                        "samples": [],
                    }
                entry["samples"].append(index)
    return sorted(found.values(), key=lambda e: (e["gpuUuid"], e["holders"]))


def _gpus(
    devices: Sequence[GpuDevice],
    presence: Mapping[int, Mapping[str, Mapping[str, set[int | None]]]],
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
                "unaccountedProcesses": len(mine),
                "unaccountedBytes": sum(b["usedBytes"] or 0 for b in mine),
            }
        )
    return out


def _idle_pods(
    infos: Mapping[str, PodInfo],
    allocs: Mapping[tuple[str, str, int | None], _Alloc],
    node: str | None,
) -> list[str]:
    busy = {key[0] for key in allocs}
    return sorted(
        info.ref
        for info in infos.values()
        if grant_of(info.plan) is not None
        and info.uid not in busy
        and (node is None or info.node == node)
    )


def _verdict(
    allocations: Sequence[Mapping[str, Any]],
    bypasses: Sequence[Mapping[str, Any]],
    outcomes: Sequence[Mapping[str, Any]],
    unknown_devices: Sequence[str],
) -> dict[str, Any]:
    def ref(a: Mapping[str, Any]) -> str:
        return f"{a['namespace']}/{a['pod']}@{a['gpuUuid']}"

    not_honoured = [ref(a) for a in allocations if a["status"] == "not-honoured"]
    inconclusive = [ref(a) for a in allocations if a["status"] == "inconclusive"]
    real_bypasses = [b for b in bypasses if b["reason"] != UNATTRIBUTED]
    inconclusive += [f"pid {b['pid']}@{b['gpuUuid']}" for b in bypasses if b not in real_bypasses]
    inconclusive += [f"process on unlisted GPU {uuid}" for uuid in unknown_devices]
    failed_jobs = [f"{o.get('namespace')}/{o.get('pod')}" for o in outcomes if not o.get("passed")]
    status: Status
    if not_honoured or real_bypasses or failed_jobs:
        status = "not-honoured"
    elif inconclusive:
        status = "inconclusive"
    else:
        status = "honoured"
    return {
        "status": status,
        "honoured": status == "honoured",
        "allocations": len(allocations),
        "notHonoured": not_honoured,
        "bypassProcesses": len(real_bypasses),
        "failedJobs": failed_jobs,
        "inconclusive": inconclusive,
    }


# -- the memory-pressure kit's outcome -----------------------------------------------------------

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
        entry = _map(raw)
        if container is not None and entry.get("name") != container:
            continue
        name = _text(entry.get("name"))
        for key in ("state", "lastState"):
            terminated = _map(_map(entry.get(key)).get("terminated"))
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
    metadata = _map(pod.get("metadata"))
    status = _map(pod.get("status"))
    name, terminated = _terminated(status, container)
    reason = _text(terminated.get("reason"))
    exit_code = terminated.get("exitCode")
    exit_code = exit_code if isinstance(exit_code, int) else None
    log_line = _first_match(_CUDA_OOM, log or "")
    outcome: str
    detail: str
    if _text(status.get("reason")) == "Evicted":
        outcome, detail = "evicted", _text(status.get("message")) or "the kubelet evicted the Pod"
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
        "namespace": _text(metadata.get("namespace")),
        "pod": _text(metadata.get("name")),
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


# -- reading a report back (the collector's side) ------------------------------------------------

MAX_ROWS: Final = 4096
MAX_LABEL: Final = 253


@dataclass(frozen=True)
class AllocationRow:
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


@dataclass(frozen=True)
class GpuRow:
    node: str
    gpu_uuid: str
    pods: int
    unaccounted_processes: int
    unaccounted_bytes: int
    overlapping_pairs: int


@dataclass(frozen=True)
class ReportView:
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
    verdict = _map(document.get("verdict"))
    status = verdict.get("status")
    if status not in ("honoured", "not-honoured", "inconclusive"):
        raise EvidenceError("verdict.status must be honoured, not-honoured or inconclusive")
    rows = []
    for i, raw in enumerate(_list(document.get("allocations"), "allocations")):
        entry = _map(raw)
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
        uuid = _label(_map(raw).get("gpuUuid"), f"overlaps[{i}].gpuUuid")
        overlaps[uuid] = overlaps.get(uuid, 0) + 1
    gpus = []
    for i, raw in enumerate(_list(document.get("gpus"), "gpus")):
        entry = _map(raw)
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
