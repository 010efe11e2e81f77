"""The one plan model (inference_policy.planning.plan): its wire form is the contract's, and it has
one reader that every component uses.

Golden checks: the planner's plans for the contract's example request, a forced-CPU request, an
accounted vLLM share and an external endpoint serialise with exactly the contract's fields in its
order, round-trip byte for byte through `parse_plan`, and the same text parses to the same plan
for the extender, the controller and `tmi plan`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from inference_policy.granting import grant
from inference_policy.planning.plan import MAX_PLAN_BYTES, Plan, PlanError, parse_plan
from inference_policy.planning.planner import Decision
from kits.profilekit import NOW, Owner, request

CONTRACT_ORDER = [
    "status",
    "path",
    "derived",
    "profile",
    "bindingId",
    "engine",
    "variantId",
    "image",
    "runtimeClassName",
    "nodeSelector",
    "resources",
    "deviceCount",
    "engineArgs",
    "inferenceResources",
    "bundle",
]


@pytest.fixture(scope="module")
def owner() -> Owner:
    return Owner()


def _decide(owner: Owner, document: dict[str, Any]) -> Decision:
    decision = owner.state().decide(document, NOW)
    assert decision.allowed, decision.body
    return decision


def test_the_contract_example_plan_keeps_its_wire_form(owner: Owner) -> None:
    decision = _decide(owner, request())
    body = decision.body
    assert list(body) == CONTRACT_ORDER
    assert body["status"] == 200 and body["path"] == "gpu"
    assert body["resources"] == {
        "requests": {"nvidia.com/mig-3g.40gb": "1"},
        "limits": {"nvidia.com/mig-3g.40gb": "1"},
    }
    assert body["inferenceResources"] == {
        "schemaVersion": 1,
        "accelerator": {
            "capability": "gpu",
            "count": 1,
            "memory": {"minimum": "7Gi"},
            "isolation": "any-qualified",
            "profile": "nvidia-mig-3g40gb",
        },
        "runtime": {"selection": "automatic"},
    }
    assert set(body["bundle"]) == {"version", "sha256"}


def test_a_cpu_plan_has_no_limits_and_a_null_runtime_class(owner: Owner) -> None:
    body = _decide(owner, request(config__force_cpu=True)).body
    assert list(body) == CONTRACT_ORDER
    assert body["runtimeClassName"] is None
    assert list(body["resources"]) == ["requests"]
    assert set(body["resources"]["requests"]) == {"cpu", "memory"}


def test_an_external_plan_carries_only_four_fields(owner: Owner) -> None:
    body = _decide(owner, request(external=True, inferenceResources=None)).body
    assert body == {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}


@pytest.mark.parametrize(
    "document",
    [
        request(),
        request(config__force_cpu=True),
        request(external=True, inferenceResources=None),
        request("vllm"),
    ],
    ids=["gpu", "cpu", "external", "vllm"],
)
def test_every_plan_round_trips_byte_for_byte(owner: Owner, document: dict[str, Any]) -> None:
    decision = _decide(owner, document)
    assert decision.plan is not None
    text = decision.plan.text()
    assert json.loads(text) == decision.body
    parsed = parse_plan(text)
    assert parsed == decision.plan
    assert Plan.model_validate(decision.body) == decision.plan
    assert parsed.text() == text
    assert parse_plan(text.encode()) == parsed


def test_the_controller_reads_a_pod_plan_with_the_same_parser(owner: Owner) -> None:
    decision = _decide(owner, request())
    assert decision.plan is not None
    pod = {"metadata": {"annotations": {"kamiwaza.ai/plan": decision.plan.text()}}}
    assert grant.read_plan(pod) == decision.plan
    assert grant.plan_revision(pod) == decision.plan.bundle_sha256
    pod["metadata"]["annotations"]["kamiwaza.ai/plan"] = json.dumps({"status": 422})
    assert "status is not 200" in str(grant.read_plan(pod))


def _mutated(owner: Owner, change: Any) -> str:
    decision = _decide(owner, request())
    document = copy.deepcopy(decision.body)
    change(document)
    return json.dumps(document)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(status=201), "status is not 200"),
        (lambda d: d.update(extra=1), "extra: unknown field"),
        (lambda d: d.pop("bundle"), "must carry bundle"),
        (lambda d: d.update(bundle={"version": 1, "sha256": "xyz"}), "bundle.sha256"),
        (lambda d: d["resources"].pop("limits"), "limits must equal its requests"),
        (lambda d: d["resources"]["requests"].update({"nvidia.com/gpu": "one"}), "'one'"),
        (lambda d: d.update(engineArgs={"gpu_memory_utilization": "0.9"}), "engineArgs"),
        (lambda d: d.update(deviceCount=True), "deviceCount"),
        (lambda d: d["inferenceResources"].update(runtime={"selection": "manual"}), "selection"),
        (lambda d: d.update(path="external"), "an external plan carries no local fields"),
    ],
)
def test_a_broken_plan_is_refused_with_the_field(owner: Owner, change: Any, message: str) -> None:
    with pytest.raises(PlanError, match="annotation is not a plan") as caught:
        parse_plan(_mutated(owner, change))
    assert message in str(caught.value)


def test_one_size_cap_and_strict_json() -> None:
    with pytest.raises(PlanError, match=f"more than the limit of {MAX_PLAN_BYTES}"):
        parse_plan(" " * (MAX_PLAN_BYTES + 1))
    with pytest.raises(PlanError, match="duplicate key"):
        parse_plan('{"status":200,"status":200}')
    with pytest.raises(PlanError, match="not UTF-8"):
        parse_plan(b"\xff")
    with pytest.raises(PlanError, match="not a JSON object"):
        parse_plan("[]")


def test_plan_model_is_frozen(owner: Owner) -> None:
    plan = _decide(owner, request()).plan
    assert isinstance(plan, Plan)
    with pytest.raises(ValueError, match="frozen"):
        plan.image = "other"  # type: ignore[misc]
