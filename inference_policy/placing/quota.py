"""What the owner lets one tenant hold at once, and whether one more engine Pod fits in it.

The owner release sets each tenant's quota (`owner.quota`, a further tenant's own `quota`): how
many devices of each resource, how many devices of each signed binding, how much accounted VRAM
(the VRAM plugin's `kamiwaza.ai/vram-gb-*` shares, in their whole GB) and how many engine Pods.
It renders them as one ResourceQuota in the tenant namespace, `tmi-quota`, which the tenant's
namespace admin may not write (the built-in `admin` role reads quotas only, and the owner-objects
policy refuses a change to anyone but the owner):

* the device counts per resource as Kubernetes' own `spec.hard` (`requests.nvidia.com/gpu`):
  the API server refuses, at create, any Pod that would take the namespace past them, whatever
  webhook it passed or bypassed;
* what a native quota cannot say, in its annotation `tmi.kamiwaza.ai/quota`: devices per binding
  (bindings share resource names), accounted VRAM summed over the per-GPU names
  (`kamiwaza.ai/vram-gb-gpu-0`, `-gpu-1`, ... are one name per physical GPU), and engine Pods
  (a quota has no label scope). The owner's extender holds every Pod it places to these, and
  to the device counts too.

The decision is one function (`check`), the same in the tenant's webhook and plan API (the
early, clear refusal, `quota-exceeded`) and in the owner's extender (the guarantee, node verdict
`quota`); each counts what a tenant holds with `pod_usage` over the Pods it follows and
`TenantUsage`'s totals. Pure: plain dicts in, decisions out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inference_policy.base import strictjson
from inference_policy.base.access import is_accelerator_resource
from inference_policy.base.codes import RefusalCode
from inference_policy.base.pod_view import ObjectView, PodView
from inference_policy.base.quantity import QuantityError, resource_units
from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION, VRAM_RESOURCE_PREFIX
from inference_policy.placing.ledger import pod_requests
from inference_policy.planning.plan import Plan, PlanError, parse_plan

QUOTA_NAME = "tmi-quota"
QUOTA_ANNOTATION = "tmi.kamiwaza.ai/quota"
# How a native quota names an extended resource's requests.
REQUESTS_PREFIX = "requests."
SCHEMA_VERSION = 1
_ANNOTATION_KEYS = frozenset({"schemaVersion", "bindings", "accountedVramGB", "enginePods"})
_MAX_ANNOTATION_BYTES = 64 * 1024
# Item names, as the owner's values spell them and every message names them.
ENGINE_PODS = "enginePods"
ACCOUNTED_VRAM = "accountedVramGB"


class QuotaError(ValueError):
    """The quota object cannot be read; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One tenant's limits, as read from the owner's ResourceQuota `name`. An absent limit is no
    limit; a limit of 0 allows none."""

    name: str
    devices: Mapping[str, int] = field(default_factory=dict)
    bindings: Mapping[str, int] = field(default_factory=dict)
    accounted_vram_gb: int | None = None
    engine_pods: int | None = None

    @property
    def empty(self) -> bool:
        return not (
            self.devices
            or self.bindings
            or self.accounted_vram_gb is not None
            or self.engine_pods is not None
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """What Pods hold against a quota: accelerator requests by resource, devices by binding,
    accounted VRAM (GB) and engine Pods."""

    devices: Mapping[str, int] = field(default_factory=dict)
    bindings: Mapping[str, int] = field(default_factory=dict)
    vram_gb: int = 0
    engine_pods: int = 0

    @property
    def empty(self) -> bool:
        return not (self.devices or self.bindings or self.vram_gb or self.engine_pods)

    def to_json(self) -> dict[str, Any]:
        return {
            "devices": dict(self.devices),
            "bindings": dict(self.bindings),
            ACCOUNTED_VRAM: self.vram_gb,
            ENGINE_PODS: self.engine_pods,
        }


NOTHING = Usage()


@dataclass(frozen=True, slots=True)
class Excess:
    """One limit a Pod would pass: the item, its limit, what is held now and what is asked."""

    item: str
    limit: int
    held: int
    asked: int

    def describe(self) -> str:
        return f"{self.item}: limit {self.limit}, held now {self.held}, this Pod asks {self.asked}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one more Pod does not fit the tenant's quota, for a message and a node verdict."""

    quota: str
    namespace: str
    excess: tuple[Excess, ...]

    @property
    def reason(self) -> str:
        items = "; ".join(e.describe() for e in self.excess)
        return f"namespace {self.namespace} would pass the owner's quota {self.quota} ({items})"

    def message(self) -> str:
        """The tenant's refusal: the code, the quota named, each limit and what is held."""
        return (
            f"tenant-mode inference (quota-exceeded): {self.reason}; remove an engine Pod of "
            f"the namespace first, or ask the cluster owner to raise the quota"
        )


@dataclass(frozen=True, slots=True)
class Headroom:
    """One item of a quota: its limit, what is held, and what is left."""

    item: str
    limit: int
    held: int

    @property
    def left(self) -> int:
        return max(0, self.limit - self.held)

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "limit": self.limit, "held": self.held, "left": self.left}


# -- the quota object ------------------------------------------------------------------------


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**31:
        raise QuotaError(f"{where} must be a whole number from 0, got {value!r}")
    return value


def parse_quota(obj: Mapping[str, Any]) -> Quota:
    """The quota a ResourceQuota sets: its `spec.hard` requests of accelerator resources, and its
    annotation's bindings, accounted VRAM and engine Pods. QuotaError says what is unreadable."""
    view = ObjectView(obj)
    name = view.name or QUOTA_NAME
    hard = view.spec.get("hard")
    devices: dict[str, int] = {}
    if isinstance(hard, Mapping):
        for key, value in hard.items():
            resource = str(key).removeprefix(REQUESTS_PREFIX)
            if not str(key).startswith(REQUESTS_PREFIX) or not is_accelerator_resource(resource):
                continue
            try:
                devices[resource] = resource_units(resource, value)
            except QuantityError as exc:
                raise QuotaError(f"ResourceQuota {name}: spec.hard[{key}]: {exc}") from None
    text = view.annotations.get(QUOTA_ANNOTATION)
    if text is None:
        return Quota(name, devices)
    where = f"ResourceQuota {name} annotation {QUOTA_ANNOTATION}"
    try:
        document = strictjson.loads(str(text), max_bytes=_MAX_ANNOTATION_BYTES, what=where)
    except strictjson.StrictJSONError as exc:
        raise QuotaError(str(exc)) from None
    if not isinstance(document, Mapping):
        raise QuotaError(f"{where} is not a JSON object")
    unknown = sorted(set(document) - _ANNOTATION_KEYS)
    if unknown:
        raise QuotaError(f"{where} has unknown keys: {', '.join(unknown)}")
    if document.get("schemaVersion", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise QuotaError(f"{where}: schemaVersion must be {SCHEMA_VERSION}")
    bindings = document.get("bindings") or {}
    if not isinstance(bindings, Mapping):
        raise QuotaError(f"{where}: bindings must map binding ids to device counts")
    vram, pods = document.get(ACCOUNTED_VRAM), document.get(ENGINE_PODS)
    return Quota(
        name,
        devices,
        {str(k): _whole(v, f"{where}: bindings[{k}]") for k, v in bindings.items()},
        None if vram is None else _whole(vram, f"{where}: {ACCOUNTED_VRAM}"),
        None if pods is None else _whole(pods, f"{where}: {ENGINE_PODS}"),
    )


# -- what a Pod holds ------------------------------------------------------------------------


def _binding_devices(plan: Plan) -> dict[str, int]:
    if plan.path != "gpu" or not plan.bindingId:
        return {}
    count = plan.claim.count if plan.claim is not None else (plan.deviceCount or 1)
    return {plan.bindingId: count}


def _usage(requests: Mapping[str, int], plan: Plan | None, engine: bool) -> Usage:
    devices = {k: v for k, v in requests.items() if is_accelerator_resource(k) and v > 0}
    vram = sum(v for k, v in devices.items() if k.startswith(VRAM_RESOURCE_PREFIX))
    bindings = _binding_devices(plan) if plan is not None else {}
    return Usage(devices, bindings, vram, 1 if engine else 0)


def plan_usage(plan: Plan) -> Usage:
    """What a Pod planned with `plan` will hold: the plan's accelerator requests and devices,
    one engine Pod (what the webhook weighs before the Pod exists)."""
    try:
        requests = plan.request_units()
    except PlanError:
        requests = {}
    return _usage(requests, plan, plan.local)


def pod_usage(pod: Mapping[str, Any]) -> Usage:
    """What a Pod holds against its namespace's quota: its accelerator requests as the scheduler
    counts them (the native quota's count), its plan's binding and devices, and one engine Pod
    when it carries the engine label or a plan. A Pod whose label was removed after admission
    still holds what it was planned, so its plan alone makes it count. Unreadable parts count as
    nothing: the API server validated what it stored."""
    view = PodView(pod)
    text = view.annotations.get(PLAN_ANNOTATION)
    plan: Plan | None = None
    if isinstance(text, str):
        try:
            plan = parse_plan(text)
        except PlanError:
            plan = None
    try:
        requests = pod_requests(pod)
    except ValueError:
        requests = {}
    engine = ENGINE_LABEL in view.labels or text is not None
    return _usage(requests, plan, engine)


def usage_from_json(document: Mapping[str, Any]) -> Usage:
    """A `Usage.to_json()` back (what an informer keeps of a Pod)."""
    return Usage(
        dict(document.get("devices") or {}),
        dict(document.get("bindings") or {}),
        int(document.get(ACCOUNTED_VRAM) or 0),
        int(document.get(ENGINE_PODS) or 0),
    )


def _add_into(total: dict[str, int], more: Mapping[str, int], sign: int) -> None:
    for key, value in more.items():
        left = total.get(key, 0) + sign * value
        if left:
            total[key] = left
        else:
            total.pop(key, None)


class TenantUsage:
    """What the Pods of one namespace hold, by Pod key, with totals an informer event updates
    in a few dictionary operations."""

    def __init__(self) -> None:
        self._pods: dict[str, Usage] = {}
        self._devices: dict[str, int] = {}
        self._bindings: dict[str, int] = {}
        self._vram = 0
        self._engine = 0

    def _clear(self) -> None:
        self._pods.clear()
        self._devices.clear()
        self._bindings.clear()
        self._vram = self._engine = 0

    def __len__(self) -> int:
        return len(self._pods)

    def _apply(self, usage: Usage, sign: int) -> None:
        _add_into(self._devices, usage.devices, sign)
        _add_into(self._bindings, usage.bindings, sign)
        self._vram += sign * usage.vram_gb
        self._engine += sign * usage.engine_pods

    def put(self, key: str, usage: Usage | None) -> None:
        """A Pod's usage now (None or nothing held: it holds nothing any more)."""
        previous = self._pods.pop(key, None)
        if previous is not None:
            self._apply(previous, -1)
        if usage is not None and not usage.empty:
            self._pods[key] = usage
            self._apply(usage, 1)

    def replace(self, pods: Iterable[tuple[str, Usage]]) -> None:
        """Every Pod as a complete list found them."""
        self._clear()
        for key, usage in pods:
            self.put(key, usage)

    def get(self, key: str) -> Usage | None:
        return self._pods.get(key)

    def keys(self) -> set[str]:
        return set(self._pods)

    def total(self) -> Usage:
        return Usage(dict(self._devices), dict(self._bindings), self._vram, self._engine)


def combined(usages: Iterable[Usage]) -> Usage:
    """The sum of several usages."""
    devices: dict[str, int] = {}
    bindings: dict[str, int] = {}
    vram = engine = 0
    for usage in usages:
        _add_into(devices, usage.devices, 1)
        _add_into(bindings, usage.bindings, 1)
        vram += usage.vram_gb
        engine += usage.engine_pods
    return Usage(devices, bindings, vram, engine)


# -- the decision ----------------------------------------------------------------------------


def _items(quota: Quota, held: Usage, asked: Usage) -> Iterable[tuple[str, int, int, int]]:
    """Each limit of the quota: (item, limit, held, asked)."""
    for resource, limit in sorted(quota.devices.items()):
        yield (
            f"{resource} devices",
            limit,
            held.devices.get(resource, 0),
            asked.devices.get(resource, 0),
        )
    for binding, limit in sorted(quota.bindings.items()):
        yield (
            f"binding {binding} devices",
            limit,
            held.bindings.get(binding, 0),
            (asked.bindings.get(binding, 0)),
        )
    if quota.accounted_vram_gb is not None:
        yield ACCOUNTED_VRAM, quota.accounted_vram_gb, held.vram_gb, asked.vram_gb
    if quota.engine_pods is not None:
        yield ENGINE_PODS, quota.engine_pods, held.engine_pods, asked.engine_pods


def check(quota: Quota | None, namespace: str, held: Usage, asked: Usage) -> Refusal | None:
    """None when a Pod asking `asked` fits beside what the namespace's Pods hold (`held`), else
    the refusal naming every limit it would pass. An item the Pod does not ask for never
    refuses it, even where the namespace is already past that limit (a lowered quota holds new
    Pods back; it does not make every Pod wait)."""
    if quota is None or quota.empty:
        return None
    excess = tuple(
        Excess(item, limit, have, more)
        for item, limit, have, more in _items(quota, held, asked)
        if more > 0 and have + more > limit
    )
    return Refusal(quota.name, namespace, excess) if excess else None


def headroom(quota: Quota, held: Usage) -> list[Headroom]:
    """Each limit of the quota with what `held` takes of it and what is left."""
    return [Headroom(item, limit, have) for item, limit, have, _ in _items(quota, held, NOTHING)]


def refusal_body(refusal: Refusal) -> dict[str, Any]:
    """The plan API's refusal body (contract section 3): HTTP 403, the detail, the code."""
    return {"status": 403, "detail": refusal.message(), "code": RefusalCode.QUOTA_EXCEEDED.value}


__all__ = [
    "ACCOUNTED_VRAM",
    "ENGINE_PODS",
    "NOTHING",
    "QUOTA_ANNOTATION",
    "QUOTA_NAME",
    "Excess",
    "Headroom",
    "Quota",
    "QuotaError",
    "Refusal",
    "TenantUsage",
    "Usage",
    "check",
    "combined",
    "headroom",
    "parse_quota",
    "plan_usage",
    "pod_usage",
    "refusal_body",
    "usage_from_json",
]
