"""Judging what a GPU host was seen doing against what each Pod was granted.

A profile promises an isolation (a whole device, a MIG slice, an accounted VRAM share) and the
planner grants it, but nothing in admission or scheduling observes what the engines then do on
the card. Here the observation is held against the grants: which Pods share a physical GPU and
whether they share its memory, each allocation's used memory against its grant, the processes no
grant accounts for, and the host's verdict. What the figures mean (and do not) is the owner's
document, docs/sharing-evidence.md: on a time-sliced card an accounted share is honoured only by
the engine staying inside its budget (nothing enforces it), on a MIG slice the hardware enforces
it, and a whole device must carry no one else's process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from inference_policy.base.quantity import GI
from inference_policy.base.wire import MIG_RESOURCE_PREFIX
from inference_policy.evidence.observations import (
    GpuDevice,
    GpuProcess,
    Grant,
    MigInstance,
    Observation,
    PodInfo,
    ProcessOwner,
    Status,
    grant_of,
    pod_info,
)
from inference_policy.evidence.report import Presence, render_report

__all__ = [
    "BYPASS_NOT_IN_POD",
    "BYPASS_NO_GRANT",
    "BYPASS_UNKNOWN_POD",
    "BYPASS_UNPLANNED_CONTAINER",
    "FAILING",
    "INCONCLUSIVE",
    "UNATTRIBUTED",
    "VRAM_UNIT_BYTES",
    "judge",
]

# The planner sizes an accounted share in whole GiB (`share_gib * GI` against usableMemory), so
# one unit of a `kamiwaza.ai/vram-gb-*` request is one GiB of the card.
VRAM_UNIT_BYTES = GI

# Findings that make an allocation not honoured; the rest are notes beside the figures.
FAILING = frozenset(
    {
        "over-grant",
        "device-shared",
        "share-spans-devices",
        "not-on-mig-slice",
        "slice-profile-mismatch",
    }
)
INCONCLUSIVE = frozenset({"memory-unknown", "grant-unknown"})

BYPASS_NOT_IN_POD = "not-in-a-pod"
BYPASS_UNKNOWN_POD = "unknown-pod"
BYPASS_NO_GRANT = "no-gpu-grant"
BYPASS_UNPLANNED_CONTAINER = "unplanned-container"
UNATTRIBUTED = "unattributed"


@dataclass(slots=True)
class _Alloc:
    """One Pod's use of one card (or MIG instance), gathered sample by sample as judging reads
    the processes: mutable only while `judge` fills it in."""

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

    return render_report(
        observation,
        node=node,
        presence=presence,
        pods=infos,
        allocations=allocations,
        overlaps=overlaps,
        bypasses=bypass_list,
        idle_pods=_idle_pods(infos, allocs, node),
        job_outcomes=outcomes,
        verdict=_verdict(allocations, bypass_list, outcomes, sorted(unknown_devices)),
    )


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
    presence: Presence,
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
    if grant.isolation == "accounted-share" and _other_tenants(alloc, presence, infos):
        # A note, not a failing finding: the owner may have let these tenants share the card.
        notes.append("shared-across-tenants")
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


def _other_tenants(alloc: _Alloc, presence: Presence, infos: Mapping[str, PodInfo]) -> set[str]:
    """The other namespaces whose Pods were seen on the allocation's card (MIG instances
    apart: a slice is isolated from the share)."""
    out: set[str] = set()
    for sample in presence.values():
        for holder, instances in sample.get(alloc.gpu.uuid, {}).items():
            info = infos.get(holder)
            if info is not None and info.namespace != alloc.pod.namespace and None in instances:
                out.add(info.namespace)
    return out


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
    presence: Presence,
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
