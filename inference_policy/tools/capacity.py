"""Capacity planning: what a list of deployments would get on a profile and a fleet.

An owner asks "what would these deployments get here" before a tenant deploys them. The
answer is the servers' own decisions, replayed in order: each request is planned as the webhook
plans it (`planner.decide`), each plan is joined with its signed binding (`placement.demand_for`)
and judged against every node as the extender judges it (`check_nodes`, `score_nodes`); the
highest-scoring node that fits takes it (ties to the first node by name, where kube-scheduler
would pick at random), and what it holds counts against that node for the next one. Nothing is
released: the replay is arrivals only, as a fill-up.

The report says what is placed where, what waits and why (the verdict of the node that came
closest, as the scheduler's event would), what is refused at admission with its status and
code, and the accelerator capacity left free on each node. Free capacity of a resource on a node
that is the right hardware for a waiting deployment (its binding's identity verdict: architecture,
resource, attested facts) is stranded: it exists, but not in the amount one node had to have.

Each deployment belongs to a tenant (the namespace its Pod is in; by default the profile's), and
tenants are kept apart on accounted shares as the extender keeps them (`tenancy`), with the
profile's `sharing.acrossTenants` standing for every tenant's: the report says which tenant holds
each physical GPU (each accounted bucket; the devices of an isolating resource by count).
Pure: plain dicts in, a report out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference_policy.base.access import is_accelerator_resource
from inference_policy.placing.nodes import NodeFacts, node_facts
from inference_policy.placing.placement import (
    Demand,
    check_nodes,
    demand_for,
    identity_verdict,
    score_nodes,
)
from inference_policy.placing.tenancy import (
    Crosses,
    Tenancy,
    TenantShares,
    crossing,
    gpu_index,
    shares_gpu,
)
from inference_policy.planning.decision import PlanContext
from inference_policy.planning.plan import PlanError
from inference_policy.planning.planner import GpuOptions, decide


@dataclass(frozen=True)
class Deployment:
    """One deployment request to replay, under the name the report gives it."""

    name: str
    request: Any
    # The namespace it would run in ("": the profile's).
    tenant: str = ""


@dataclass(frozen=True)
class Placed:
    name: str
    node: str
    binding: str
    resources: Mapping[str, int]
    # The namespace it holds them for (the profile's where the deployment named none).
    tenant: str = ""


@dataclass(frozen=True)
class Waiting:
    name: str
    binding: str
    reason: str
    code: str
    # The node that came closest, whose verdict the reason is ("" when none was judged).
    node: str = ""


@dataclass(frozen=True)
class Refused:
    name: str
    status: int
    code: str
    detail: str


@dataclass(frozen=True)
class Held:
    """Who holds a physical GPU: an accounted bucket (`gpu` its index, when it names one), or
    the devices of an isolating resource on a node (`gpu` None), by tenant in units."""

    node: str
    resource: str
    gpu: str | None
    isolates: bool
    tenants: Mapping[str, int]


@dataclass(frozen=True)
class Report:
    placed: list[Placed] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    # node -> accelerator resource -> units left free after the replay
    left: dict[str, dict[str, int]] = field(default_factory=dict)
    # resource -> free units of it while a deployment waited for it
    stranded: dict[str, int] = field(default_factory=dict)
    # node -> resource -> the part of `stranded` that is free on that node
    stranded_by_node: dict[str, dict[str, int]] = field(default_factory=dict)
    held: list[Held] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "placed": [
                {
                    "name": p.name,
                    "node": p.node,
                    "binding": p.binding,
                    "resources": dict(p.resources),
                    "tenant": p.tenant,
                }
                for p in self.placed
            ],
            "waiting": [
                {
                    "name": w.name,
                    "binding": w.binding,
                    "code": w.code,
                    "reason": w.reason,
                    "node": w.node,
                }
                for w in self.waiting
            ],
            "refused": [
                {"name": r.name, "status": r.status, "code": r.code, "detail": r.detail}
                for r in self.refused
            ],
            "external": list(self.external),
            "left": {node: dict(res) for node, res in self.left.items()},
            "stranded": dict(self.stranded),
            "strandedByNode": {node: dict(res) for node, res in self.stranded_by_node.items()},
            "gpus": [
                {
                    "node": h.node,
                    "resource": h.resource,
                    "gpu": h.gpu,
                    "isolates": h.isolates,
                    "tenants": dict(h.tenants),
                }
                for h in self.held
            ],
        }


class Fill:
    """The placement half of the replay: demands placed in order on nodes, nothing released.
    `place` one at a time, then `report`; the placement benchmark's trace runs through here."""

    def __init__(
        self,
        nodes: Sequence[NodeFacts],
        report: Report | None = None,
        crosses: Crosses | None = None,
    ) -> None:
        self.facts = sorted(nodes, key=lambda f: f.name)
        self.usage: dict[str, dict[str, int]] = {f.name: {} for f in self.facts}
        self._report = report if report is not None else Report()
        # (node, resource) where a waiting deployment found the right hardware, too little free.
        self._wanted: set[tuple[str, str]] = set()
        # The accounted shares by tenant, which tenants are kept apart by; and every
        # accelerator resource's units by tenant, for the report.
        self.shares = TenantShares()
        self.tenancy = Tenancy(self.shares.get, crosses or (lambda tenant, resource: False))
        self._held: dict[tuple[str, str], dict[str, int]] = {}

    def place(self, name: str, binding: str, demand: Demand) -> str | None:
        """The node the demand goes to (and holds from now on), or None when it waits."""
        verdicts = check_nodes(demand, self.facts, self.usage.__getitem__, self.tenancy)
        fit = [f for f, v in zip(self.facts, verdicts, strict=True) if v is not None and v.fits]
        if not fit:
            self._wanted.update(
                (f.name, resource)
                for f in self.facts
                if identity_verdict(demand, f).fits
                for resource in demand.kind
            )
            self._report.waiting.append(_waiting(name, binding, self.facts, verdicts))
            return None
        scores = score_nodes(demand, fit, self.usage.__getitem__)
        node = fit[max(range(len(fit)), key=lambda i: (scores[i], -i))]
        held = self.usage[node.name]
        for resource, units in demand.requests.items():
            held[resource] = held.get(resource, 0) + units
            if is_accelerator_resource(resource):
                tenants = self._held.setdefault((node.name, resource), {})
                tenants[demand.tenant] = tenants.get(demand.tenant, 0) + units
        self.shares.change(node.name, demand.tenant, demand.requests, 1)
        granted = {k: v for k, v in demand.requests.items() if k in demand.kind}
        self._report.placed.append(Placed(name, node.name, binding, granted, demand.tenant))
        return node.name

    def report(self) -> Report:
        """The report, with what is left free and stranded now."""
        report = self._report
        report.left.clear()
        report.stranded.clear()
        report.stranded_by_node.clear()
        report.held[:] = [
            Held(node, resource, gpu_index(resource), not shares_gpu(resource), dict(tenants))
            for (node, resource), tenants in sorted(self._held.items())
        ]
        for f in self.facts:
            used = self.usage[f.name]
            left = {
                resource: have - used.get(resource, 0)
                for resource, have in sorted(f.allocatable.items())
                if is_accelerator_resource(resource) and have - used.get(resource, 0) > 0
            }
            if left:
                report.left[f.name] = left
                for resource, units in left.items():
                    if (f.name, resource) in self._wanted:
                        report.stranded[resource] = report.stranded.get(resource, 0) + units
                        report.stranded_by_node.setdefault(f.name, {})[resource] = units
        return report


def replay(
    deployments: Sequence[Deployment],
    nodes: Sequence[Mapping[str, Any]],
    ctx: PlanContext,
    options: GpuOptions | None = None,
    done: Callable[[Deployment], None] | None = None,
) -> Report:
    """Plan and place every deployment in order on ``nodes`` (v1.Node objects); `options` is
    the GPU options table the decisions are made with (`planner.decide`), if any; `done` is told
    of each deployment once it is decided, so a caller can show how far a long replay is."""
    report = Report()
    profile = ctx.profile
    trusted = crossing(profile.envelope if profile else None)
    fill = Fill([node_facts(n) for n in nodes], report, lambda _, resource: resource in trusted)
    own = profile.envelope.namespace if profile else ""
    for deployment in deployments:
        _replay_one(deployment, ctx, options, fill, report, own)
        if done is not None:
            done(deployment)
    return fill.report()


def _replay_one(
    deployment: Deployment,
    ctx: PlanContext,
    options: GpuOptions | None,
    fill: Fill,
    report: Report,
    own: str,
) -> None:
    profile = ctx.profile
    decision = decide(deployment.request, ctx, options)
    plan = decision.plan
    if plan is None:
        code = decision.wire_code or (decision.code.value if decision.code else "")
        report.refused.append(Refused(deployment.name, decision.status, code, decision.detail))
        return
    if plan.path == "external":
        report.external.append(deployment.name)
        return
    found = profile.envelope.binding(plan.bindingId or "") if profile else None
    binding = plan.bindingId or plan.path
    try:
        demand = demand_for(
            plan,
            found[1] if found else None,
            None,
            profile.sha256 if profile else "",
            deployment.tenant or own,
        )
    except PlanError as exc:
        report.waiting.append(Waiting(deployment.name, binding, str(exc), "plan-invalid"))
        return
    fill.place(deployment.name, binding, demand)


def _waiting(
    name: str, binding: str, facts: Sequence[NodeFacts], verdicts: Sequence[Any]
) -> Waiting:
    # The closest node: one only busy now (more capacity would help) before one that can never
    # hold the binding; the first by name among equals.
    judged = [(f, v) for f, v in zip(facts, verdicts, strict=True) if v is not None]
    if not judged:
        return Waiting(name, binding, "no node in the fleet", "no-nodes")
    node, verdict = min(judged, key=lambda fv: fv[1].unresolvable)
    return Waiting(name, binding, f"{node.name}: {verdict.reason}", verdict.code.value, node.name)


__all__ = ["Deployment", "Fill", "Held", "Placed", "Refused", "Report", "Waiting", "replay"]
