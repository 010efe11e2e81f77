"""The admission of an engine Pod, decided in one place: what is refused before it is planned,
what is refused of its plan, and what the plan writes on it.

The webhook's handler used to hold three of these rules itself (the engine container must
exist, the request annotation must be there, an external plan makes no workload) beside the
core's forgery check; a reader following a review went between the server and the core a dozen
times to see what an engine Pod may be. Here they are two functions over values, in the order an
admission applies them, and the webhook parses, calls them and answers:

* `engine_subject`: before planning, the Pod itself: its engine container (the one the
  `kamiwaza.ai/engine-container` annotation names, else the first) must exist, it may not reach
  for an accelerator outside that container or name its node (`engine_pod.admission_refusal`),
  and it must carry its deployment request.
* `admitted`: after planning, the decision: a request that would not parse, a refusal of the
  planner's, and a plan that places nothing (an external endpoint creates no workload in the
  tenant namespace) refuse the Pod; a local plan gives the edits that make the Pod its plan, the
  shield of every container that holds no grant included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inference_policy.admission.engine_pod import (
    Edit,
    PlanFields,
    PodRefusal,
    admission_refusal,
    engine_container_name,
    plan_edits,
    shield_edits,
    to_shield,
)
from inference_policy.base.codes import RefusalCode
from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ENGINE_CONTAINER_ANNOTATION, ENGINE_LABEL, REQUEST_ANNOTATION
from inference_policy.planning.decision import Decision
from inference_policy.planning.plan import Plan

__all__ = ["EngineSubject", "admitted", "engine_subject"]


@dataclass(frozen=True, slots=True)
class EngineSubject:
    """An engine Pod that may be planned: its engine container and the request to plan."""

    engine: str
    index: int
    request: str


def engine_subject(pod: Mapping[str, Any], scheduler_name: str) -> EngineSubject | PodRefusal:
    """The engine Pod's container and request, or why it is refused before any planning."""
    view = PodView(pod)
    engine = engine_container_name(pod)
    index = next(
        (
            position
            for position, container in view.positioned("containers")
            if container.get("name") == engine
        ),
        None,
    )
    if engine is None or index is None:
        return PodRefusal(
            422,
            RefusalCode.ENGINE_CONTAINER,
            f"annotation {ENGINE_CONTAINER_ANNOTATION} names container {engine!r}, which this "
            "Pod does not have",
        )
    refusal = admission_refusal(pod, engine, scheduler_name)
    if refusal is not None:
        return refusal
    text = view.annotations.get(REQUEST_ANNOTATION)
    if not isinstance(text, str):
        return PodRefusal(
            422,
            RefusalCode.REQUEST_MISSING,
            f"engine Pod (label {ENGINE_LABEL}) carries no {REQUEST_ANNOTATION} annotation; the "
            "deployment request must be there for the Pod to be planned",
        )
    return EngineSubject(engine, index, text)


def admitted(
    pod: Mapping[str, Any],
    subject: EngineSubject,
    decision: Decision | str,
    fields: Callable[[Plan], PlanFields],
) -> list[Edit] | PodRefusal:
    """The edits that make the Pod its plan, or why the decision refuses it. `decision` is the
    planner's, or the reason the request could not be read (a string); `fields` gives a local
    plan's fields with this install's scheduler and pull Secret (`engine_pod.plan_fields`),
    which an edge may keep between Pods."""
    if isinstance(decision, str):
        return PodRefusal(
            422, RefusalCode.REQUEST_INVALID, f"invalid deployment request: {decision}"
        )
    plan = decision.plan
    if plan is None:
        assert decision.code is not None
        return PodRefusal(decision.status, decision.code, decision.detail)
    if not plan.local:
        return PodRefusal(
            422,
            RefusalCode.EXTERNAL,
            "external endpoints allocate no local resources and create no workload in the "
            "tenant namespace; this engine Pod's deployment request is external",
        )
    edits = plan_edits(pod, subject.index, plan, fields(plan))
    return edits + shield_edits(pod, to_shield(pod, plan, engine=subject.engine))
