"""What the tenant's webhook answers for a Pod, decided in one place.

The webhook receives every CREATE and UPDATE of a Pod in the namespace it serves. Which rule
applies (an UPDATE keeps its plan and reaches; a Pod with the engine label is planned; any other
Pod may reach for nothing and is shielded) used to be chosen by the server's handler, which then
went back and forth into the core for each rule. Here the whole answer is one function over
values: the webhook checks the envelope (a core/v1 Pod, an operation it reviews, its own
namespace), calls `review_pod` once, and encodes what it returns as a JSONPatch or a refusal.

Planning is the one thing the core cannot do from the Pod alone: the decision comes from the
server's snapshot and its room figures, and the server remembers decisions and plan fields
between Pods. It is passed in as an `EnginePlanning` the server implements, so the order of the
rules, and what each answer is, stays here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from inference_policy.admission.engine_admission import EngineSubject, admitted, engine_subject
from inference_policy.admission.engine_pod import (
    Edit,
    PlanFields,
    PodRefusal,
    admission_refusal,
    shield_edits,
    to_shield,
    update_refusal,
)
from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ENGINE_LABEL
from inference_policy.planning.decision import Decision
from inference_policy.planning.plan import Plan

__all__ = ["Admitted", "EnginePlanning", "review_pod"]

Reason = Literal["not-engine-pod", "unchanged", "planned"]


class EnginePlanning(Protocol):
    """How the server plans an engine Pod's request: `decide` gives the planner's decision on
    the request annotation's text, or why the text is no request (a string); `fields` the
    plan's fields with this install's scheduler and pull Secret (`engine_pod.plan_fields`)."""

    def decide(self, subject: EngineSubject) -> Decision | str: ...

    def fields(self, subject: EngineSubject, plan: Plan) -> PlanFields: ...


@dataclass(frozen=True, slots=True)
class Admitted:
    """The Pod is admitted with these edits; `plan` is an engine Pod's plan on CREATE."""

    reason: Reason
    edits: list[Edit]
    plan: Plan | None = None


def review_pod(
    operation: Literal["CREATE", "UPDATE"],
    pod: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    scheduler_name: str,
    planning: EnginePlanning,
) -> Admitted | PodRefusal:
    """The answer for a Pod of the namespace served: an UPDATE (`old` given) keeps the plan, the
    planned image and every reach; an engine Pod is planned and made its plan; any other Pod may
    reach for no accelerator nor name its node, and every container that holds no grant is
    shielded."""
    if operation == "UPDATE":
        assert old is not None
        refusal = update_refusal(pod, old)
        if refusal is not None:
            return refusal
        return Admitted("unchanged", shield_edits(pod, to_shield(pod, old=old)))
    if ENGINE_LABEL not in PodView(pod).labels:
        refusal = admission_refusal(pod, None, scheduler_name)
        if refusal is not None:
            return refusal
        return Admitted("not-engine-pod", shield_edits(pod, to_shield(pod)))
    subject = engine_subject(pod, scheduler_name)
    if isinstance(subject, PodRefusal):
        return subject
    decision = planning.decide(subject)
    edits = admitted(pod, subject, decision, lambda plan: planning.fields(subject, plan))
    if isinstance(edits, PodRefusal):
        return edits
    assert isinstance(decision, Decision) and decision.plan is not None
    return Admitted("planned", edits, decision.plan)
