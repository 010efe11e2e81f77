"""What a GPU host was seen doing and what its Pods were granted, as typed records.

The readers in `tmi_cli` (NVML or nvidia-smi for the processes, `/proc/<pid>/cgroup` for the Pod
each process belongs to, a Pod list for the plans) hand their readings in as these values, so the
judgement (`inference_policy.evidence.judging`) never sees which source spoke and runs on
recorded output alike. Reading a Pod object and its plan into a `PodInfo` and a `Grant` is here
too: it is the Pod side of the same observation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from inference_policy.admission.engine_pod import engine_container_name
from inference_policy.base.pod_view import PodView
from inference_policy.base.quantity import QuantityError, resource_units
from inference_policy.base.wire import (
    ENGINE_LABEL,
    MIG_RESOURCE_PREFIX,
    PLAN_ANNOTATION,
    VRAM_RESOURCE_PREFIX,
    WHOLE_GPU_RESOURCE,
)
from inference_policy.evidence.fields import as_map, as_text
from inference_policy.planning.plan import Plan, PlanError, parse_plan

__all__ = [
    "EvidenceError",
    "GpuDevice",
    "GpuProcess",
    "Grant",
    "Isolation",
    "MigInstance",
    "Observation",
    "PodInfo",
    "ProcessOwner",
    "Sample",
    "Status",
    "grant_of",
    "pod_info",
]

Isolation = Literal["accounted-share", "mig", "whole-device"]
Status = Literal["honoured", "not-honoured", "inconclusive"]


class EvidenceError(ValueError):
    """An observation or a report that cannot be judged or read; the message says why."""


# -- what the readers hand in ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG compute instance of a physical GPU, as the driver lists it."""

    gpu_instance_id: int
    compute_instance_id: int | None = None
    uuid: str | None = None
    profile: str | None = None  # "1g.18gb"
    memory_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Sample:
    """The processes seen at one moment; two Pods overlap when both appear in one sample."""

    index: int
    timestamp: str
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything one reader saw on a host: its devices and the samples taken of them."""

    source: str
    driver: str | None
    devices: tuple[GpuDevice, ...]
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """Where a process lives, from its cgroup: the Pod uid and container id, when it is in one."""

    pod_uid: str | None
    container_id: str | None = None
    cgroup: str = ""


@dataclass(frozen=True, slots=True)
class Grant:
    """What a Pod's plan grants on a GPU, before the card it landed on is known."""

    isolation: Isolation
    resource: str
    quantity: int
    binding_id: str | None
    # vLLM budgets this fraction of the whole card it sees.
    engine_memory_fraction: float | None = None


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the judgement needs of one Pod: who it is, where it runs, its plan and containers."""

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


def pod_info(pod: Mapping[str, Any]) -> PodInfo | None:
    """What the judgement needs from a Pod object; None when it has no uid to be found by."""
    view = PodView(pod)
    uid = (view.uid or "").lower()
    if not uid:
        return None
    annotations = view.annotations
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
    status = view.status
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        entries = status.get(key)
        for raw in entries if isinstance(entries, list) else ():
            entry = as_map(raw)
            match = _CONTAINER_ID.match(as_text(entry.get("containerID")))
            if match and as_text(entry.get("name")):
                ids[match["id"]] = as_text(entry.get("name"))
    return PodInfo(
        uid=uid,
        namespace=view.namespace or "",
        name=view.name or "",
        node=view.node_name,
        workload=view.label(ENGINE_LABEL) or "",
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
