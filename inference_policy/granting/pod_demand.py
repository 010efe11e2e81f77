"""What a Pod asks the extender to place, once the owner's side has checked it is its plan.

A decision, so it is the core's: the extender parses the Pod, calls `pod_demand` with the
decision's inputs (the plan context of its current snapshot and the followed revisions) and
answers; the plan is read once, by the core's gate (`device_gate`, through `plan.parse_plan`).

The tenant's webhook writes the plan, and the tenant can replace that webhook, so a plan on a
Pod proves nothing by itself. Before any node is judged, the Pod is held to the signed profile
exactly as the allocation controller holds a running one
(`inference_policy.granting.grant.check_grant`: the plan is what the verified revision it names
plans for the Pod's deployment request, and the Pod's accelerator asks, image, RuntimeClass and
shields are the plan's); a Pod that reaches for anything without a GPU plan (none, a CPU plan, or
one that says it places nothing) is refused by the core's gate
(`inference_policy.admission.device_gate`) before that. Either refusal is `Unplaceable`: every node
fails with the reason, which the scheduler writes into the Pod's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference_policy.admission.device_gate import device_gate
from inference_policy.base.access import reaches
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import PLAN_ANNOTATION
from inference_policy.granting.grant import check_placement
from inference_policy.placing.placement import Demand, demand_for
from inference_policy.planning.decision import PlanContext
from inference_policy.planning.plan import Plan, PlanError
from inference_policy.planning.planner import PROFILE_PREFIX, GpuOptions
from inference_policy.trust.signing import VerifiedProfile, usable_profile


class Unplaceable(Exception):
    """The Pod cannot be placed on any node; the reason goes to every node."""

    def __init__(self, reason: str, code: NodeVerdictCode) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def pod_demand(
    pod: Mapping[str, Any],
    ctx: PlanContext,
    revisions: Mapping[str, object],
    options: GpuOptions | None = None,
) -> Demand | None:
    """The Pod's demand; None for a Pod that reaches for nothing and holds no local plan (none,
    or an external one). Raises Unplaceable, first for what the core's gate refuses
    (`inference_policy.admission.device_gate`: a reach without a GPU plan, whatever the plan
    says)."""
    gate = device_gate(pod)
    if gate.code is not None:
        raise Unplaceable(gate.reason, gate.code)
    plan = gate.plan
    if plan is None:
        return None
    profile = current_profile(ctx) if plan.path == "gpu" else None
    # The tenant is the Pod's namespace: the rule keeping tenants apart is by namespace.
    tenant = PodView(pod).namespace or ""
    try:
        if profile is None:
            demand = demand_for(plan, None, pod, tenant=tenant)
        else:
            found = profile.envelope.binding(plan.bindingId or "")
            binding = found[1] if found else None
            demand = demand_for(plan, binding, pod, profile.sha256, tenant)
    except PlanError as exc:
        raise Unplaceable(str(exc), NodeVerdictCode.PLAN_INVALID) from None
    check_plan_is_granted(pod, plan, ctx, revisions, options)
    return demand


def outside_every_tenant(pod: Mapping[str, Any]) -> None:
    """A Pod in no tenant namespace of this extender places nothing: with no plan and no reach
    for an accelerator it passes untouched, and otherwise no signed profile vouches for it, so
    Unplaceable."""
    view = PodView(pod)
    if PLAN_ANNOTATION in view.annotations or reaches(pod):
        namespace = view.namespace
        raise Unplaceable(
            f"namespace {namespace!r} is not a tenant namespace of this extender: no signed "
            "profile vouches for a plan or a device there",
            NodeVerdictCode.PROFILE_REFUSED,
        )


def check_plan_is_granted(
    pod: Mapping[str, Any],
    plan: Plan,
    ctx: PlanContext,
    revisions: Mapping[str, object],
    options: GpuOptions | None = None,
) -> None:
    """The Pod passes the core's placement check (`grant.check_placement`), or Unplaceable
    says how it does not."""
    verdict = check_placement(pod, plan, revisions, ctx.profile, ctx, ctx.now, options)
    if not verdict.verified:
        raise Unplaceable(f"{verdict.reason}: {verdict.message}", NodeVerdictCode.GRANT_MISMATCH)


def current_profile(ctx: PlanContext) -> VerifiedProfile:
    """The verified profile GPU plans are placed under (`signing.usable_profile`, as the planner
    asks it), or Unplaceable with the refusal."""
    usable = usable_profile(ctx.profile, ctx.profile_refusal, ctx.now)
    if isinstance(usable, str):
        raise Unplaceable(PROFILE_PREFIX + usable, NodeVerdictCode.PROFILE_REFUSED)
    return usable


__all__ = [
    "Unplaceable",
    "check_plan_is_granted",
    "current_profile",
    "outside_every_tenant",
    "pod_demand",
]
