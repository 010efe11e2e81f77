"""What reaches for an accelerator (inference_policy.base.access) and what an UPDATE may change.

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

from inference_policy.admission.access_cel import cel_condition, guard_validations, guard_variables
from inference_policy.admission.engine_pod import admission_refusal, update_refusal
from inference_policy.admission.shield_cel import has_unshielded, not_an_engine_pod, shield_mutation
from inference_policy.base.access import Reach, is_accelerator_resource, new_reaches, reaches
from inference_policy.base.codes import RefusalCode
from kits.webhookkit import plain_pod
from tests.podcorpus import CORPUS, EPHEMERAL

ROOT = Path(__file__).resolve().parents[4]
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


def test_the_shipped_policies_are_the_generated_ones() -> None:
    docs = list(yaml.safe_load_all((ROOT / "manifests/owner/admission-policies.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    shield = by_kind["MutatingAdmissionPolicy"]["spec"]
    assert shield["mutations"][0]["applyConfiguration"]["expression"] == shield_mutation()
    conditions = {c["name"]: c["expression"] for c in shield["matchConditions"]}
    assert conditions == {
        "not-an-engine-pod": not_an_engine_pod(),
        "has-a-container-to-shield": has_unshielded(),
    }
    (guard,) = [
        d["spec"]
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == "kamiwaza-tmi-guard"
    ]
    assert guard["variables"] == guard_variables()
    assert guard["validations"] == guard_validations()


def test_the_cel_names_every_standard_resource_and_variable() -> None:
    from inference_policy.base.access import (
        CDI_ANNOTATION_PREFIXES,
        DEVICE_ENV_PREFIXES,
        STANDARD_PREFIXES,
        STANDARD_RESOURCES,
    )

    text = cel_condition()
    tokens = (*STANDARD_RESOURCES, *STANDARD_PREFIXES, *DEVICE_ENV_PREFIXES, "runtimeClassName")
    for token in (*tokens, *CDI_ANNOTATION_PREFIXES):
        assert token in text
    for token in ("resourceClaims", "claims"):
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


@pytest.mark.parametrize(
    ("name", "reaches_"),
    [
        ("cpu", False),
        ("memory", False),
        ("ephemeral-storage", False),
        ("hugepages-1Gi", False),
        ("nvidia.com/gpu", True),
        ("kamiwaza.ai/vram-gb-gpu-0", True),
        ("aws.amazon.com/neuroncore", True),
        ("google.com/tpu", True),
        ("deviceclass.resource.kubernetes.io/gpu.nvidia.com", True),
        ("example.com/anything", True),
        ("cpus", True),
    ],
)
def test_accelerator_resources_are_default_deny(name: str, reaches_: bool) -> None:
    assert is_accelerator_resource(name) is reaches_


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ({"configMapRef": {"name": "gpus"}}, True),
        ({"prefix": "", "secretRef": {"name": "gpus"}}, True),
        ({"prefix": "NVIDIA_", "configMapRef": {"name": "gpus"}}, True),
        ({"prefix": "AMD_VISIBLE", "configMapRef": {"name": "gpus"}}, True),
        ({"prefix": "NV", "configMapRef": {"name": "gpus"}}, True),
        ({"prefix": "HABANA_", "configMapRef": {"name": "gpus"}}, True),
        ({"prefix": "AWS_", "configMapRef": {"name": "gpus"}}, True),
        ({"prefix": "APP_", "configMapRef": {"name": "settings"}}, False),
        ({"prefix": "TMI_", "configMapRef": {"name": "settings"}}, False),
    ],
)
def test_no_container_may_take_device_variables_from_env_from(
    source: dict[str, Any], refused: bool
) -> None:
    pod = plain_pod()
    pod["spec"]["containers"][0]["envFrom"] = [source]
    expected = [Reach("spec.containers[engine].envFrom", source.get("prefix", ""), "env")]
    # The granted container and every other alike: the shield's explicit NVIDIA value wins over
    # envFrom, but another vendor's runtime does not read that variable.
    for engine in ("engine", "someone-else", None):
        found = reaches(pod, engine)
        assert found == (expected if refused else []), (engine, found)


@pytest.mark.parametrize(
    ("name", "value", "reaches_"),
    [
        ("NVIDIA_VISIBLE_DEVICES", "void", False),
        ("NVIDIA_VISIBLE_DEVICES", "none", True),
        ("NVIDIA_VISIBLE_DEVICES", "all", True),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility", True),
        ("NVIDIA_IMEX_CHANNELS", "0", True),
        ("NVIDIA_MIG_CONFIG_DEVICES", "all", True),
        ("NVIDIA_REQUIRE_CUDA", "cuda>=12", True),
        ("NVIDIA_A_FEATURE_OF_NEXT_YEAR", "1", True),
        ("AMD_VISIBLE_DEVICES", "0", True),
        ("HABANA_VISIBLE_MODULES", "0", True),
        ("AWS_NEURON_VISIBLE_DEVICES", "ALL", True),
        ("ASCEND_RUNTIME_OPTIONS", "VIRTUAL", True),
        ("CUDA_VISIBLE_DEVICES", "0", False),
        ("HIP_VISIBLE_DEVICES", "0", False),
        ("PATH", "/bin", False),
    ],
)
def test_device_variables_are_refused_by_namespace_on_every_container(
    name: str, value: str, reaches_: bool
) -> None:
    pod = plain_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": name, "value": value}]
    for engine in ("engine", None):
        found = reaches(pod, engine)
        assert bool(found) is reaches_, (engine, found)
        if reaches_:
            assert found == [Reach(f"spec.containers[engine].env[{name}]", value, "env")]


def test_cdi_annotations_reach_on_every_pod_and_an_update_may_not_add_one() -> None:
    pod = plain_pod()
    pod["metadata"]["annotations"] = {"cdi.k8s.io/extra": "nvidia.com/gpu=all"}
    expected = [Reach("metadata.annotations[cdi.k8s.io/extra]", "nvidia.com/gpu=all", "annotation")]
    assert reaches(pod) == expected
    assert reaches(pod, "engine") == expected
    assert new_reaches(pod, plain_pod()) == expected
    refusal = update_refusal(pod, plain_pod())
    assert refusal is not None and "cdi.k8s.io/extra" in refusal.message


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
    from inference_policy.admission.engine_pod import apply_edits, shield_edits, to_shield

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


def test_the_engine_container_annotation_is_frozen_with_the_plan() -> None:
    pod = plain_pod()
    pod["metadata"]["annotations"] = {
        "kamiwaza.ai/plan": '{"status":200}',
        "kamiwaza.ai/engine-container": "engine",
    }
    for value in ("sidecar", None):
        moved = copy.deepcopy(pod)
        if value is None:
            del moved["metadata"]["annotations"]["kamiwaza.ai/engine-container"]
        else:
            moved["metadata"]["annotations"]["kamiwaza.ai/engine-container"] = value
        refusal = update_refusal(moved, pod)
        assert refusal is not None and refusal.code is RefusalCode.PLAN_ANNOTATION
        assert "kamiwaza.ai/engine-container annotation is fixed" in refusal.message
    assert update_refusal(copy.deepcopy(pod), pod) is None


@pytest.mark.parametrize(
    ("kind", "tenants"),
    [
        ("example.com/Warm", True),
        ("team.example.org/Loaded", True),
        ("Ready", False),
        ("PodScheduled", False),
        ("DisruptionTarget", False),
        ("kamiwaza.ai/AllocationVerified", False),
        ("tmi.kamiwaza.ai/Anything", False),
        ("sub.kamiwaza.ai/Ready", False),
        ("xkamiwaza.ai/Ready", True),
        ("kamiwaza.ai.example.com/Ready", True),
    ],
)
def test_only_conditions_of_another_domain_are_the_tenants(kind: str, tenants: bool) -> None:
    from inference_policy.admission.status_cel import tenant_condition_type

    assert tenant_condition_type(kind) is tenants
