"""Placement: may a planned engine Pod run on a node, and how well does it fit there.

The extender's judgement on top of the scheduler's: a Pod's plan (read by the one plan parser,
`planning.plan`) joined with the binding it names becomes a `Demand`; the node must be the
hardware the binding vouches for (`nodes`) and the binding's resource must have room once the
Pod is added (`ledger` counts what is bound). Pure: plain dicts in, verdicts and scores out.

Scores (0..10, kube-scheduler's extender range) for a GPU Pod are fragmentation-aware when the
caller passes the workload's request distribution (`fragmentation.Workload`): the node where
placing the Pod raises the expected fragmentation least (FGD, Weng et al., ATC '23) wins, and
best fit orders nodes the placement leaves equally fragmented. Without a distribution, or when
every candidate is changed alike (MIG slices: unit requests strand nothing), scores are best
fit: the node the Pod leaves with the least free capacity of the binding's resource scores
highest (10 exactly fills it), linearly down to 0 for leaving as much as the largest candidate
has in all. Small requests therefore fill partly used nodes, and large free devices stay whole
for the requests that need them.

A CPU Pod scores every node that advertises an accelerator at 0 and CPU-only nodes by best fit
from 1 up, so CPU engines use GPU nodes only when no CPU node fits (a score, not a filter) and
never take the CPU or memory a GPU Pod on that node would need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inference_policy.allocation import class_of_resource
from inference_policy.base.access import is_accelerator_resource
from inference_policy.base.bounded import keep
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.quantity import format_units
from inference_policy.placing.fragmentation import Workload, fragmentation_scores
from inference_policy.placing.ledger import pod_requests
from inference_policy.placing.nodes import (
    FITS,
    GpuBinding,
    NodeFacts,
    Verdict,
    busy,
    gfd_verdict,
    node_facts,
    refuse,
)
from inference_policy.placing.tenancy import Tenancy
from inference_policy.planning.plan import Plan, PlanError, parse_plan
from inference_policy.trust.profile import (
    ARCH_KEY,
    AnyBinding,
    CountedBinding,
    CpuBinding,
    DraBinding,
    VramPluginBinding,
    as_claimed,
    as_counted,
)

MAX_SCORE = 10
MAX_MEMO = 256


@dataclass(frozen=True, slots=True)
class Demand:
    """A planned Pod ready to be judged against nodes: its binding and its effective requests.

    `kind` names the resources best fit packs by; `key` identifies everything the node's
    identity verdict (architecture, resource, GFD facts) depends on, for `NodeFacts.static`;
    quantities are left out of it, so shares of every size reuse one verdict per node. `tenancy`
    keeps a `tenant`'s `shared` resources apart (`crosses`: the binding lets them meet others').
    """

    path: Literal["gpu", "cpu"]
    arch: str
    binding: GpuBinding | None
    requests: Mapping[str, int]
    checked: tuple[str, ...]
    kind: tuple[str, ...]
    key: str
    tenant: str = ""
    shared: tuple[str, ...] = ()
    crosses: bool = False


def demand_for(
    plan: Plan,
    binding: AnyBinding | None,
    pod: Mapping[str, Any] | None = None,
    profile_sha256: str = "",
    tenant: str = "",
) -> Demand:
    """Join a plan with the binding it names (from the verified profile) and the Pod's requests.

    `pod` None takes the plan's requests as the Pod's; `tenant` is the Pod's namespace. Raises
    PlanError when the plan, the binding and the Pod disagree: such a Pod cannot be placed
    anywhere.
    """
    if plan.path == "external" or plan.arch is None:
        raise PlanError("an external plan allocates no local resources and is not placed")
    granted_units = plan.request_units()
    if pod is not None:
        try:
            requests = pod_requests(pod)
        except ValueError as exc:
            raise PlanError(f"the Pod's resource requests are unreadable: {exc}") from None
    else:
        requests = granted_units
    if plan.path == "cpu":
        checked = tuple(name for name in ("cpu", "memory") if requests.get(name))
        return Demand(
            path="cpu",
            arch=plan.arch,
            binding=None,
            requests=requests,
            checked=checked,
            kind=checked,
            key="cpu/" + plan.arch + "/" + ",".join(checked),
        )
    if binding is None:
        raise PlanError(
            f"binding {plan.bindingId} is not in the verified profile; the Pod was planned "
            "under a profile revision that no longer grants it"
        )
    if isinstance(binding, CpuBinding):
        raise PlanError(f"the gpu plan names binding {binding.id}, which is a cpu binding")
    if binding.architecture != plan.arch:
        raise PlanError(
            f"the plan places binding {binding.id} on {plan.arch}, but the binding runs on "
            f"{binding.architecture}"
        )
    if (claimed := as_claimed(binding)) is not None:
        return _claimed_demand(plan, claimed, requests, profile_sha256)
    counted = as_counted(binding)
    assert counted is not None, "a binding not claimed is counted"
    resource = counted.resource.name
    granted = granted_units.get(resource)
    if not granted:
        raise PlanError(
            f"the plan does not request {resource}, the resource of binding {binding.id}; the "
            "profile revision changed since the Pod was planned"
        )
    asked = requests.get(resource, 0)
    if asked != granted:
        raise PlanError(
            f"the Pod requests {asked} {resource} but its plan grants {granted}; the Pod was "
            "changed after admission"
        )
    return binding_demand(counted, requests, profile_sha256, tenant)


def binding_demand(
    binding: CountedBinding, requests: Mapping[str, int], profile_sha256: str, tenant: str = ""
) -> Demand:
    """What a device-plugin binding's Pods are judged by: its resource on hardware it vouches
    for (`demand_for` for a Pod; `room` for the binding's free capacity with no Pod at all)."""
    resource = binding.resource.name
    return Demand(
        path="gpu",
        arch=binding.architecture,
        binding=binding,
        requests=requests,
        checked=(resource,),
        kind=(resource,),
        key=f"gpu/{profile_sha256}/{binding.id}",
        tenant=tenant,
        shared=() if binding.allocation.isolates else (resource,),
        crosses=isinstance(binding, VramPluginBinding) and binding.crosses_tenants,
    )


def _claimed_demand(
    plan: Plan, binding: DraBinding, requests: Mapping[str, int], profile_sha256: str
) -> Demand:
    # kube-scheduler allocates a claim's devices from the DeviceClass, which pins the signed
    # facts; nothing is counted here, and the node need only be of the binding's architecture.
    if plan.claim is None:
        raise PlanError(
            f"binding {binding.id} hands out devices through a claim, and the plan names none; "
            "the profile revision changed since the Pod was planned"
        )
    return Demand(
        path="gpu",
        arch=plan.arch or binding.architecture,
        binding=binding,
        requests=requests,
        checked=(),
        kind=(),
        key=f"dra/{profile_sha256}/{binding.id}",
    )


# -- the filter ---------------------------------------------------------------------------------


def _static(demand: Demand, node: NodeFacts) -> Verdict:
    verdict = node.static.get(demand.key)
    if verdict is None:
        # Every profile revision brings new keys.
        verdict = keep(node.static, demand.key, identity_verdict(demand, node), MAX_MEMO)
    return verdict


def _over_capacity(demand: Demand, name: str, want: int, have: int) -> Verdict:
    allocation = class_of_resource(name)
    return refuse(
        NodeVerdictCode.CAPACITY if allocation is None else allocation.over_capacity_code,
        f"the Pod requests {_show(name, want)} {name} but the node's whole allocatable "
        f"is {_show(name, have)}",
    )


def check(demand: Demand, node: NodeFacts, used: Mapping[str, int]) -> Verdict:
    """Does the Pod fit on this node now? The node's identity verdict is memoised on it."""
    verdict = node.static.get(demand.key) or _static(demand, node)
    if not verdict.fits:
        return verdict
    allocatable = node.allocatable
    for name in demand.checked:
        want = demand.requests[name]
        have = allocatable[name]
        if want > have:
            return _over_capacity(demand, name, want, have)
        taken = used.get(name, 0)
        if taken + want > have:
            allocation = class_of_resource(name)
            return busy(
                NodeVerdictCode.INSUFFICIENT if allocation is None else allocation.busy_code,
                _busy_reason(demand, name, want, have - taken, have),
            )
    return FITS


def check_nodes(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
    tenancy: Tenancy | None = None,
) -> list[Verdict | None]:
    """`check` for every candidate (None stays None: a node the caller does not know), and with
    `tenancy`, a share kept off the GPUs where another tenant's shares sit (`tenancy`)."""
    out = _checked(demand, nodes, used_of)
    if tenancy is not None and demand.shared:
        tenancy.keep_apart(demand.tenant, demand.crosses, demand.shared, nodes, out)
    return out


def _checked(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
) -> list[Verdict | None]:
    if len(demand.checked) != 1:
        return [None if n is None else check(demand, n, used_of(n.name)) for n in nodes]
    name = demand.checked[0]
    want = demand.requests[name]
    key = demand.key
    out: list[Verdict | None] = []
    append = out.append
    for node in nodes:
        if node is None:
            append(None)
            continue
        verdict = node.static.get(key) or _static(demand, node)
        if verdict.fits and used_of(node.name).get(name, 0) + want > node.allocatable[name]:
            verdict = check(demand, node, used_of(node.name))
        append(verdict)
    return out


def _busy_reason(demand: Demand, name: str, want: int, free: int, have: int) -> str:
    free = max(free, 0)
    allocation = class_of_resource(name)
    if allocation is not None and allocation.shared_memory:
        binding = demand.binding.id if demand.binding else "the binding"
        return (
            f"accounted VRAM bucket {name} is full: the share of binding {binding} needs {want} "
            f"GB and {free} of {have} GB are free"
        )
    return (
        f"not enough free {name}: the Pod requests {_show(name, want)}, and "
        f"{_show(name, free)} of {_show(name, have)} is free"
    )


def _show(name: str, value: int) -> str:
    return format_units(name, value)


def identity_verdict(demand: Demand, node: NodeFacts) -> Verdict:
    """Is this node hardware the binding vouches for: architecture, resource, GFD facts."""
    binding = demand.binding
    owner = f"binding {binding.id}" if binding is not None else "the plan"
    if node.arch != demand.arch:
        if node.arch is None:
            return refuse(
                NodeVerdictCode.ARCH,
                f"node has no {ARCH_KEY} label; {owner} runs on {demand.arch} nodes only",
            )
        return refuse(
            NodeVerdictCode.ARCH,
            f"node architecture is {node.arch}; {owner} runs on {demand.arch} nodes only",
        )
    for name in demand.checked:
        have = node.allocatable.get(name)
        if not have:
            advertised = "advertises no" if have is None else "advertises 0"
            return refuse(
                NodeVerdictCode.RESOURCE_ABSENT,
                f"node {advertised} {name} in its allocatable resources",
            )
    if binding is not None and binding.accelerator.vendor == "nvidia":
        verdict = gfd_verdict(binding, node.labels)
        if verdict is not None:
            return verdict
    return FITS


# -- best fit -----------------------------------------------------------------------------------


def best_fit_scales(demand: Demand, nodes: Iterable[NodeFacts]) -> dict[str, int]:
    """The score's unit: the largest allocatable of each packed resource among the candidates
    the Pod can use at all (nodes it is statically refused from do not stretch the scale)."""
    scales: dict[str, int] = dict.fromkeys(demand.kind, 0)
    for node in nodes:
        if not (node.static.get(demand.key) or _static(demand, node)).fits:
            continue
        for name in demand.kind:
            scales[name] = max(scales[name], node.allocatable.get(name, 0))
    return scales


def score(
    demand: Demand, node: NodeFacts, used: Mapping[str, int], scales: Mapping[str, int]
) -> int:
    """0..10: 10 when the Pod exactly fills the node's free capacity of its kind, falling linearly
    with what it leaves free, in units of the largest candidate's capacity. A node the Pod does
    not fit on scores 0."""
    if not check(demand, node, used).fits:
        return 0
    total = 0.0
    counted = 0
    for name in demand.kind:
        scale = scales.get(name, 0)
        if scale <= 0:
            continue
        left = node.allocatable.get(name, 0) - used.get(name, 0) - demand.requests.get(name, 0)
        if len(demand.kind) == 1:
            # Integer arithmetic: exactly full is 10, anything left over is at most 9.
            if left <= 0:
                return MAX_SCORE
            return max(0, min(MAX_SCORE - 1, (MAX_SCORE * (scale - left)) // scale))
        total += max(left, 0) / scale
        counted += 1
    if counted == 0:
        return 0
    mean = total / counted
    if mean <= 0:
        return MAX_SCORE
    return max(0, min(MAX_SCORE - 1, math.floor(MAX_SCORE * (1 - mean))))


def score_nodes(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
    workload: Workload | None = None,
) -> list[int]:
    """The 0..10 score of every candidate (None: unknown, scores 0), scaled over the known ones.

    A GPU demand is scored by expected fragmentation when `workload` knows its resource's
    request sizes, by best fit otherwise; a CPU demand is steered off accelerator nodes. The
    arithmetic is unrolled for the usual one-resource demand: prioritize runs it over every
    candidate of a large cluster inside the scheduler's time budget.
    """
    if demand.path == "cpu":
        return _cpu_scores(demand, nodes, used_of)
    if len(demand.kind) != 1 or demand.checked != demand.kind:
        known = [node for node in nodes if node is not None]
        scales = best_fit_scales(demand, known)
        return [0 if n is None else score(demand, n, used_of(n.name), scales) for n in nodes]
    frees, scale = free_capacity(demand, nodes, used_of)
    return scores_from(demand, frees, scale, workload)


def free_capacity(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
) -> tuple[list[int | None], int]:
    """For a one-resource GPU demand: each candidate's free amount of the resource (None where
    the Pod cannot go at all) and the score's unit, the largest such candidate's allocatable.
    A caller that keeps these may recompute only the nodes that changed."""
    name = demand.kind[0]
    key = demand.key
    scale = 0
    frees: list[int | None] = []
    append = frees.append
    for node in nodes:
        if node is None or not (node.static.get(key) or _static(demand, node)).fits:
            append(None)
            continue
        have = node.allocatable[name]
        scale = max(scale, have)
        append(have - used_of(node.name).get(name, 0))
    return frees, scale


def free_of(
    demand: Demand, node: NodeFacts | None, used: Mapping[str, int], tenancy: Tenancy | None = None
) -> tuple[int | None, int]:
    """One candidate's entry of `free_capacity`: its free amount and its allocatable (none free
    to a share whose tenant `tenancy` keeps off the node's GPU)."""
    name = demand.kind[0]
    if node is None or not (node.static.get(demand.key) or _static(demand, node)).fits:
        return None, 0
    have = node.allocatable[name]
    if tenancy and tenancy.verdict(demand.tenant, demand.crosses, demand.shared, node.name):
        return 0, have
    return have - used.get(name, 0), have


def scores_from(
    demand: Demand, frees: Sequence[int | None], scale: int, workload: Workload | None = None
) -> list[int]:
    """The 0..10 scores of a one-resource GPU demand from `free_capacity`'s figures."""
    name = demand.kind[0]
    want = demand.requests.get(name, 0)
    sizes = workload.of(name) if workload is not None else None
    if sizes is not None:
        graded = fragmentation_scores(frees, want, sizes, MAX_SCORE)
        if graded is not None:
            return graded
    return _best_fit(frees, want, scale)


def _best_fit(frees: Sequence[int | None], want: int, scale: int) -> list[int]:
    top = MAX_SCORE - 1
    out: list[int] = []
    append = out.append
    # Compares rather than min() and max(): prioritize scores every candidate of every cycle.
    for free in frees:
        left = -1 if free is None else free - want
        if left < 0:
            append(0)
        elif left == 0:
            append(MAX_SCORE)
        else:
            graded = (MAX_SCORE * (scale - left)) // scale
            append(top if graded > top else 0 if graded < 0 else graded)
    return out


def has_accelerator(node: NodeFacts) -> bool:
    """Does the node advertise any accelerator resource (a GPU, a MIG slice, a VRAM bucket)?"""
    return any(value > 0 and is_accelerator_resource(k) for k, value in node.allocatable.items())


def _cpu_scores(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
) -> list[int]:
    """Accelerator nodes at 0; CPU-only nodes by best fit over CPU and memory, from 1 up."""
    cpu_only = [n for n in nodes if n is not None and not has_accelerator(n)]
    scales = best_fit_scales(demand, cpu_only)
    out: list[int] = []
    for node in nodes:
        if node is None or has_accelerator(node):
            out.append(0)
            continue
        used = used_of(node.name)
        fitting = check(demand, node, used).fits
        out.append(max(1, score(demand, node, used, scales)) if fitting else 0)
    return out


__all__ = [
    "FITS",
    "Demand",
    "NodeFacts",
    "Plan",
    "PlanError",
    "Verdict",
    "best_fit_scales",
    "check",
    "check_nodes",
    "demand_for",
    "free_capacity",
    "free_of",
    "has_accelerator",
    "identity_verdict",
    "node_facts",
    "parse_plan",
    "score",
    "score_nodes",
    "scores_from",
]
