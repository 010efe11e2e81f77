"""The webhook's whole answer for a Pod, as the core gives it (`admission.pod_review`): which
rule a Pod meets, in which order, and what each answer is, with planning passed in."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from inference_policy.admission.engine_admission import EngineSubject
from inference_policy.admission.engine_pod import PlanFields, PodRefusal, apply_edits, plan_fields
from inference_policy.admission.pod_review import Admitted, review_pod
from inference_policy.base.codes import RefusalCode
from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION, REQUEST_ANNOTATION
from inference_policy.planning.decision import Decision
from inference_policy.planning.plan import Plan
from kits.profilekit import NOW, Owner, request

SCHEDULER = "kamiwaza-inference-scheduler"
STATE = Owner().state()
VOID = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


@dataclass
class Planning:
    """The server's side, recorded: what was planned and which fields were asked for."""

    answer: Decision | str | None = None
    decided: list[str] = field(default_factory=list)

    def decide(self, subject: EngineSubject) -> Decision | str:
        self.decided.append(subject.request)
        if self.answer is not None:
            return self.answer
        return STATE.decide(json.loads(subject.request), NOW)

    def fields(self, subject: EngineSubject, plan: Plan) -> PlanFields:
        return plan_fields(
            subject.index, plan, plan.text(), scheduler_name=SCHEDULER, pull_secret=None
        )


def pod(engine: bool = True, **spec: Any) -> dict[str, Any]:
    labels = {ENGINE_LABEL: "d1"} if engine else {}
    annotations = {REQUEST_ANNOTATION: json.dumps(request())} if engine else {}
    return {
        "metadata": {"name": "p", "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "engine", "image": "placeholder.invalid/e:1"}], **spec},
    }


def test_a_plain_pod_is_shielded_and_never_planned() -> None:
    planning = Planning()
    verdict = review_pod("CREATE", pod(engine=False), None, SCHEDULER, planning)
    assert isinstance(verdict, Admitted) and verdict.reason == "not-engine-pod"
    assert verdict.plan is None and planning.decided == []
    assert apply_edits(pod(engine=False), verdict.edits)["spec"]["containers"][0]["env"] == VOID


def test_a_plain_pod_that_reaches_is_refused_before_anything_else() -> None:
    planning = Planning()
    reaching = pod(engine=False)
    reaching["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    verdict = review_pod("CREATE", reaching, None, SCHEDULER, planning)
    assert isinstance(verdict, PodRefusal) and verdict.code == RefusalCode.FORGERY
    assert planning.decided == []


def test_an_engine_pod_is_planned_once_and_made_its_plan() -> None:
    planning = Planning()
    created = pod()
    verdict = review_pod("CREATE", created, None, SCHEDULER, planning)
    assert isinstance(verdict, Admitted) and verdict.reason == "planned"
    assert verdict.plan is not None and len(planning.decided) == 1
    stored = apply_edits(created, verdict.edits)
    assert stored["metadata"]["annotations"][PLAN_ANNOTATION] == verdict.plan.text()
    assert stored["spec"]["schedulerName"] == SCHEDULER


def test_an_engine_pod_refused_by_its_subject_or_its_decision_is_refused() -> None:
    planning = Planning()
    missing = pod()
    del missing["metadata"]["annotations"][REQUEST_ANNOTATION]
    verdict = review_pod("CREATE", missing, None, SCHEDULER, planning)
    assert isinstance(verdict, PodRefusal) and verdict.code == RefusalCode.REQUEST_MISSING
    assert planning.decided == []
    unreadable = Planning(answer="not JSON")
    verdict = review_pod("CREATE", pod(), None, SCHEDULER, unreadable)
    assert isinstance(verdict, PodRefusal) and verdict.code == RefusalCode.REQUEST_INVALID


def test_an_update_is_held_to_the_old_pod_and_never_planned() -> None:
    planning = Planning()
    created = pod()
    planned = review_pod("CREATE", created, None, SCHEDULER, planning)
    assert isinstance(planned, Admitted)
    stored = apply_edits(created, planned.edits)
    same = review_pod("UPDATE", copy.deepcopy(stored), stored, SCHEDULER, planning)
    assert isinstance(same, Admitted) and same.reason == "unchanged" and same.plan is None
    forged = copy.deepcopy(stored)
    forged["metadata"]["annotations"][PLAN_ANNOTATION] = "{}"
    refused = review_pod("UPDATE", forged, stored, SCHEDULER, planning)
    assert isinstance(refused, PodRefusal)
    assert len(planning.decided) == 1
