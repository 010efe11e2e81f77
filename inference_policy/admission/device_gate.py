"""Whether a Pod may hold a device at all, before any node or grant is judged: one answer.

The tenant's webhook writes the plan, and the tenant can remove or replace that webhook, so what
a plan says of itself proves nothing. A plan whose `path` is `external` places nothing, and a
CPU plan grants no device: a Pod carrying either that still reaches for something (any resource
but the kubelet's own, a RuntimeClass, a claim, a device variable, a CDI annotation: everything
`access.reaches` finds, the engine container's own asks included) holds no grant, whatever it
says. Only a GPU plan can, and then only the one the signed profile gives it, which the grant
check (`grant.check_placement`) decides next. The owner's extender asks this before it judges a
node, and the allocation controller before it checks a running Pod's grant, so the two cannot
disagree on which Pods may hold a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference_policy.base.access import Reach, reaches
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import PLAN_ANNOTATION
from inference_policy.planning.plan import Plan, PlanError, parse_plan


@dataclass(frozen=True, slots=True)
class Gate:
    """What to do with a Pod before its nodes: place it as any Pod (`plan` None, no refusal),
    hold it to its GPU or CPU `plan`'s grant, or refuse it everywhere (`code` and `reason`)."""

    plan: Plan | None = None
    code: NodeVerdictCode | None = None
    reason: str = ""

    @property
    def refused(self) -> bool:
        return self.code is not None


FREE = Gate()


def _fields(found: list[Reach]) -> str:
    return ", ".join(reach.field for reach in found)


def device_gate(pod: Mapping[str, Any], plan: Plan | None = None) -> Gate:
    """The gate for `pod`; `plan` is its plan when the caller has read it already (else it is
    read from the annotation here, by the one plan parser)."""
    if plan is None:
        text = PodView(pod).annotations.get(PLAN_ANNOTATION)
        if text is None:
            found = reaches(pod, plan_annotation=False)
            if found:
                return Gate(
                    code=NodeVerdictCode.UNPLANNED_DEVICE,
                    reason="the Pod asks for an accelerator without a plan ("
                    + _fields(found)
                    + "); only an engine Pod planned by the tenant webhook may",
                )
            return FREE
        if not isinstance(text, str):
            return Gate(
                code=NodeVerdictCode.PLAN_INVALID,
                reason=f"the {PLAN_ANNOTATION} annotation is not a string",
            )
        try:
            plan = parse_plan(text)
        except PlanError as exc:
            return Gate(code=NodeVerdictCode.PLAN_INVALID, reason=str(exc))
    if plan.path == "gpu":
        return Gate(plan=plan)
    found = reaches(pod, plan_annotation=False)
    if found:
        grants = "places nothing" if plan.path == "external" else "grants no device"
        return Gate(
            code=NodeVerdictCode.UNPLANNED_DEVICE,
            reason=f"the Pod's plan is a {plan.path} plan, which {grants}, yet the Pod reaches "
            f"for ({_fields(found)}); only a gpu plan the signed profile grants may hold a "
            "device",
        )
    return FREE if plan.path == "external" else Gate(plan=plan)


__all__ = ["FREE", "Gate", "device_gate"]
