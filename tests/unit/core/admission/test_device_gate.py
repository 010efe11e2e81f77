"""The core's gate before placement and before the grant check
(inference_policy.admission.device_gate).

The extender and the allocation controller both ask it, so a Pod whose plan says it needs no
device but which reaches for one is refused alike by both, whatever the plan says of itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference_policy.admission.device_gate import FREE, device_gate
from inference_policy.base.codes import UNPLANNED_DEVICE_ACCESS, NodeVerdictCode
from inference_policy.base.wire import PLAN_ANNOTATION
from inference_policy.granting.grant import check_grant
from kits.profilekit import NOW, Owner
from kits.webhookkit import plain_pod


@pytest.fixture(scope="module")
def owner() -> Owner:
    return Owner()


EXTERNAL = {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}


def _planned(plan: Any, **container: Any) -> dict[str, Any]:
    pod = plain_pod()
    pod["metadata"]["annotations"] = {PLAN_ANNOTATION: json.dumps(plan)}
    pod["spec"]["containers"][0].update(container)
    return pod


def test_a_pod_that_reaches_for_nothing_and_plans_nothing_passes() -> None:
    assert device_gate(plain_pod()) is FREE
    assert device_gate(_planned(EXTERNAL)) is FREE


REACHES: dict[str, dict[str, Any]] = {
    "gpus": {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
    "neuron": {"resources": {"limits": {"aws.amazon.com/neuroncore": "2"}}},
    "device-variable": {"env": [{"name": "NVIDIA_GDS", "value": "enabled"}]},
    "habana-variable": {"env": [{"name": "HABANA_VISIBLE_DEVICES", "value": "all"}]},
    "env-from": {"envFrom": [{"configMapRef": {"name": "devices"}}]},
}


@pytest.mark.parametrize("container", REACHES.values(), ids=REACHES.keys())
def test_an_external_plan_that_reaches_is_refused(container: dict[str, Any]) -> None:
    gate = device_gate(_planned(EXTERNAL, **container))
    assert gate.refused and gate.code is NodeVerdictCode.UNPLANNED_DEVICE
    assert "external plan, which places nothing" in gate.reason


@pytest.mark.parametrize("container", REACHES.values(), ids=REACHES.keys())
def test_no_plan_and_a_reach_is_refused(container: dict[str, Any]) -> None:
    pod = plain_pod()
    pod["spec"]["containers"][0].update(container)
    gate = device_gate(pod)
    assert gate.code is NodeVerdictCode.UNPLANNED_DEVICE
    assert "without a plan" in gate.reason


def test_pod_level_reaches_count_as_much_as_a_containers() -> None:
    runtime = _planned(EXTERNAL)
    runtime["spec"]["runtimeClassName"] = "nvidia"
    cdi = _planned(EXTERNAL)
    cdi["metadata"]["annotations"]["cdi.k8s.io/gpu"] = "nvidia.com/gpu=all"
    claim = _planned(EXTERNAL)
    claim["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu"}]
    for pod in (runtime, cdi, claim):
        assert device_gate(pod).code is NodeVerdictCode.UNPLANNED_DEVICE


def test_an_unreadable_plan_is_refused() -> None:
    pod = plain_pod()
    pod["metadata"]["annotations"] = {PLAN_ANNOTATION: "{not json"}
    assert device_gate(pod).code is NodeVerdictCode.PLAN_INVALID


def test_a_gpu_plan_goes_on_to_the_grant_check(owner: Owner) -> None:
    from kits.extenderkit import plan_for, request

    plan = plan_for(owner, owner.envelope(), request())
    gate = device_gate(_planned(dict(plan), resources={"limits": {"nvidia.com/gpu": "8"}}))
    assert not gate.refused and gate.plan is not None and gate.plan.path == "gpu"


def test_the_controller_refuses_what_the_gate_refuses(owner: Owner) -> None:
    pod = _planned(EXTERNAL, **REACHES["gpus"])
    state = owner.state(owner.envelope())
    verdict = check_grant(pod, None, state.context(NOW), NOW)
    assert verdict.status == "False" and verdict.reason == UNPLANNED_DEVICE_ACCESS
    assert device_gate(pod).reason == verdict.message
