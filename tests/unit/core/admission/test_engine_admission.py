"""The admission of an engine Pod, decided by the core alone
(`inference_policy.admission.engine_admission`): each refusal before planning and of the plan, with
its status and stable code, and the edits of a local plan, the shield included. The webhook only
applies what these return."""

from __future__ import annotations

import json
from typing import Any

from inference_policy.admission.engine_admission import EngineSubject, admitted, engine_subject
from inference_policy.admission.engine_pod import PodRefusal, apply_edits, plan_fields
from inference_policy.base.codes import RefusalCode
from inference_policy.base.wire import (
    ENGINE_CONTAINER_ANNOTATION,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
)
from inference_policy.planning.decision import Decision
from inference_policy.planning.plan import Plan
from kits.profilekit import NOW, Owner, request

SCHEDULER = "kamiwaza-inference-scheduler"
STATE = Owner().state()


def engine_pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "engine",
            "labels": {"kamiwaza.ai/deployment-id": "d1"},
            "annotations": {REQUEST_ANNOTATION: json.dumps(request()), **annotations},
        },
        "spec": {
            "containers": [
                {"name": "engine", "image": "placeholder.invalid/e:1"},
                {"name": "sidecar", "image": "placeholder.invalid/s:1"},
            ]
        },
    }


def fields(plan: Plan) -> Any:
    return plan_fields(1, plan, plan.text(), scheduler_name=SCHEDULER, pull_secret=None)


def test_the_engine_container_the_annotation_names_must_exist() -> None:
    refused = engine_subject(engine_pod(**{ENGINE_CONTAINER_ANNOTATION: "gone"}), SCHEDULER)
    assert isinstance(refused, PodRefusal)
    assert (refused.status, refused.code) == (422, RefusalCode.ENGINE_CONTAINER)
    assert "names container 'gone', which this Pod does not have" in refused.message
    named = engine_subject(engine_pod(**{ENGINE_CONTAINER_ANNOTATION: "sidecar"}), SCHEDULER)
    assert isinstance(named, EngineSubject) and (named.engine, named.index) == ("sidecar", 1)


def test_a_pod_that_names_its_node_or_reaches_outside_its_engine_is_a_forgery() -> None:
    pod = engine_pod()
    pod["spec"]["nodeName"] = "gpu-1"
    refused = engine_subject(pod, SCHEDULER)
    assert isinstance(refused, PodRefusal) and refused.code == RefusalCode.FORGERY
    assert f"engine Pods are placed by {SCHEDULER}" in refused.message
    pod = engine_pod()
    pod["spec"]["containers"][1]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    refused = engine_subject(pod, SCHEDULER)
    assert isinstance(refused, PodRefusal) and (refused.status, refused.code) == (
        403,
        RefusalCode.FORGERY,
    )


def test_an_engine_pod_without_its_request_is_refused() -> None:
    pod = engine_pod()
    del pod["metadata"]["annotations"][REQUEST_ANNOTATION]
    refused = engine_subject(pod, SCHEDULER)
    assert isinstance(refused, PodRefusal)
    assert (refused.status, refused.code) == (422, RefusalCode.REQUEST_MISSING)


def test_an_unreadable_request_a_planner_refusal_and_an_external_plan_are_refused() -> None:
    pod = engine_pod()
    subject = engine_subject(pod, SCHEDULER)
    assert isinstance(subject, EngineSubject)
    unreadable = admitted(pod, subject, "line 1: not JSON", fields)
    assert isinstance(unreadable, PodRefusal)
    assert (unreadable.code, unreadable.message) == (
        RefusalCode.REQUEST_INVALID,
        "invalid deployment request: line 1: not JSON",
    )
    refusal = Decision(422, None, "mlx needs Apple silicon", RefusalCode.ENGINE_CAPABILITY)
    refused = admitted(pod, subject, refusal, fields)
    assert refused == PodRefusal(422, RefusalCode.ENGINE_CAPABILITY, "mlx needs Apple silicon")
    external = STATE.decide(request(external=True), NOW)
    assert external.plan is not None and not external.plan.local
    refused = admitted(pod, subject, external, fields)
    assert isinstance(refused, PodRefusal) and (refused.status, refused.code) == (
        422,
        RefusalCode.EXTERNAL,
    )


def test_a_local_plan_makes_the_pod_its_plan_and_shields_the_other_containers() -> None:
    pod = engine_pod(**{ENGINE_CONTAINER_ANNOTATION: "sidecar"})
    subject = engine_subject(pod, SCHEDULER)
    assert isinstance(subject, EngineSubject)
    decision = STATE.decide(request(), NOW)
    assert decision.plan is not None
    edits = admitted(pod, subject, decision, fields)
    assert not isinstance(edits, PodRefusal)
    stored = apply_edits(pod, edits)
    assert stored["metadata"]["annotations"][PLAN_ANNOTATION] == decision.plan.text()
    assert stored["spec"]["schedulerName"] == SCHEDULER
    assert stored["spec"]["containers"][1]["image"] == decision.plan.image
    assert stored["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    ]
