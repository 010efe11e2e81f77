"""What reaches for an accelerator (inference_policy.access) and what an UPDATE may change.

One predicate serves the webhook, the controller and the API server's CEL matchConditions; these
tests hold it to the shared Pod corpus (which the end-to-end test also sends through the real API
server), pin the shipped webhook configuration to the generated CEL, and cover the UPDATE rule
that compares values, not presence.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from inference_policy.access import Reach, cel_condition, new_reaches, reaches
from inference_policy.engine_pod import admission_refusal, update_refusal
from inference_policy.refusals import RefusalCode
from tests.integration.webhookkit import plain_pod
from tests.podcorpus import CORPUS, EPHEMERAL

ROOT = Path(__file__).resolve().parents[2]
CASES = {**CORPUS, **EPHEMERAL}


@pytest.mark.parametrize(("pod", "expected"), CASES.values(), ids=CASES.keys())
def test_the_corpus(pod: dict[str, Any], expected: bool) -> None:
    found = reaches(pod)
    assert bool(found) is expected, found
    refusal = admission_refusal(pod, None, "sched")
    assert (refusal is not None) is expected
    if refusal is not None:
        assert refusal.status == 403 and refusal.code is RefusalCode.FORGERY
        for reach in found:
            assert reach.field in refusal.message


def test_the_shipped_match_condition_is_the_generated_one() -> None:
    manifest = yaml.safe_load((ROOT / "manifests/owner/mutating-webhook.yaml").read_text())
    guard = next(w for w in manifest["webhooks"] if w["name"].startswith("guard."))
    conditions = {c["name"]: c["expression"] for c in guard["matchConditions"]}
    assert conditions["reaches-for-an-accelerator"] == cel_condition()


def test_the_cel_names_every_resource_prefix_and_variable() -> None:
    from inference_policy.access import DEVICE_ENV, RESOURCE_PREFIXES

    text = cel_condition()
    for token in (*RESOURCE_PREFIXES, *DEVICE_ENV, "runtimeClassName", "resourceClaims", "claims"):
        assert token in text
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        assert f"object.spec.{kind}.exists" in text


def test_the_engine_containers_own_asks_belong_to_the_plan() -> None:
    pod = plain_pod(runtimeClassName="nvidia")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert reaches(pod, "engine") == []
    assert [r.kind for r in reaches(pod)] == ["resource", "runtime-class"]
    # The environment is not the plan's: an engine container may not select devices itself.
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert reaches(pod, "engine") == [
        Reach("spec.containers[engine].env[NVIDIA_VISIBLE_DEVICES]", "all", "env")
    ]


def test_an_engine_pod_may_not_name_its_node() -> None:
    pod = plain_pod(nodeName="gpu-1")
    refusal = admission_refusal(pod, "engine", "kamiwaza-inference-scheduler")
    assert refusal is not None
    assert "spec.nodeName (engine Pods are placed by kamiwaza-inference-scheduler)" in (
        refusal.message
    )


def _granted(count: str) -> dict[str, Any]:
    pod = plain_pod()
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": count},
        "limits": {"nvidia.com/gpu": count},
    }
    return pod


def test_an_update_that_raises_a_granted_count_is_refused() -> None:
    old, new = _granted("1"), _granted("7")
    added = new_reaches(new, old)
    assert [(r.field, r.value) for r in added] == [
        ("spec.containers[engine].resources.limits[nvidia.com/gpu]", "7"),
        ("spec.containers[engine].resources.requests[nvidia.com/gpu]", "7"),
    ]
    refusal = update_refusal(new, old)
    assert refusal is not None and refusal.code is RefusalCode.FORGERY


def test_an_update_that_changes_nothing_it_governs_is_allowed() -> None:
    old = _granted("1")
    new = copy.deepcopy(old)
    new["metadata"].setdefault("labels", {})["team"] = "a"
    assert new_reaches(new, old) == []
    assert update_refusal(new, old) is None


def test_an_update_that_adds_device_selection_is_refused() -> None:
    old = plain_pod()
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["env"] = [{"name": "AMD_VISIBLE_DEVICES", "value": "0"}]
    refusal = update_refusal(new, old)
    assert refusal is not None and "env[AMD_VISIBLE_DEVICES]" in refusal.message


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (None, '{"status":200}', "cannot be added afterwards"),
        ('{"status":200}', None, "cannot be changed or removed"),
        ('{"status":200}', '{"status":201}', "cannot be changed or removed"),
    ],
)
def test_the_plan_annotation_is_frozen(before: str | None, after: str | None, message: str) -> None:
    def pod(text: str | None) -> dict[str, Any]:
        value = plain_pod()
        if text is not None:
            value["metadata"].setdefault("annotations", {})["kamiwaza.ai/plan"] = text
        return value

    refusal = update_refusal(pod(after), pod(before))
    assert refusal is not None
    assert refusal.code is RefusalCode.PLAN_ANNOTATION and message in refusal.message


def test_what_is_shielded() -> None:
    from inference_policy.engine_pod import apply_edits, shield_edits, to_shield

    pod = plain_pod()
    pod["spec"]["initContainers"] = [{"name": "init", "image": "x", "env": [{"name": "A"}]}]
    pod["spec"]["containers"].append(
        {"name": "own", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}
    )
    targets = to_shield(pod)
    assert targets == [("containers", 0), ("initContainers", 0)]
    shielded = apply_edits(pod, shield_edits(pod, targets))
    assert to_shield(shielded) == []
    assert shielded["spec"]["initContainers"][0]["env"] == [
        {"name": "A"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    ]
    assert reaches(shielded) == []
    assert pod["spec"]["containers"][0].get("env") is None  # the input is not changed
