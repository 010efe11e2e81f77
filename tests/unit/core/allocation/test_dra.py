"""The dra allocation class: the signed device facts, the DeviceClass and claim templates they
become, the plan's claim, and an allocated device checked against its binding."""

from __future__ import annotations

from typing import Any

import pytest

from inference_policy.admission.engine_pod import planned_pod
from inference_policy.allocation.dra_facts import NVIDIA_DRA_DRIVER, device_facts, device_mismatch
from inference_policy.granting.grant_findings import pod_findings
from inference_policy.placing.nodes import node_facts
from inference_policy.placing.placement import demand_for, identity_verdict
from inference_policy.planning.plan import parse_plan
from inference_policy.trust.dra_claims import (
    CLAIM_NAME,
    binding_of_class,
    device_class_name,
    owner_objects,
    published_templates,
    spill_targets,
    template_for,
)
from inference_policy.trust.profile import DraBinding, ProfileSchemaError, parse_envelope
from kits.profilekit import (
    NOW,
    Owner,
    clone,
    dra_binding,
    gpu_profile,
    pinned_request,
    request,
    with_profiles,
)
from localcluster.nodes.dra_driver import published_device

OWNER = Owner()
SMALL = dra_binding("h100-40", device_memory="80Gi", usable="39Gi")
LARGE = dra_binding("h100-80")
MIG = dra_binding(
    "h100-mig-1g",
    device_type="mig",
    product="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    device_memory="10Gi",
    usable="9Gi",
    mig_profile="1g.10gb",
    features=["mig"],
)


def envelope_of(*profiles: dict[str, Any]) -> dict[str, Any]:
    return with_profiles(OWNER, *profiles)


def parsed(*profiles: dict[str, Any]) -> Any:
    return parse_envelope(envelope_of(*profiles))


def dra_of(envelope: Any, binding_id: str) -> DraBinding:
    found = envelope.binding(binding_id)
    assert found is not None and isinstance(found[1], DraBinding)
    return found[1]


# -- the schema ------------------------------------------------------------------------------


def test_a_dra_binding_is_signed_like_any_other() -> None:
    envelope = parsed(gpu_profile("dra", "whole-device", [LARGE]))
    binding = dra_of(envelope, "h100-80")
    assert binding.allocation.claimed and binding.allocation.guarantee == "whole-device"
    mig = dra_of(parsed(gpu_profile("mig", "mig", [MIG])), "h100-mig-1g")
    assert mig.allocation.guarantee == "mig" and not mig.allocation.multi_device


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b["device"].update(type="mig"), "migProfile is required for a mig device"),
        (lambda b: b["device"].update(migProfile="1g.10gb"), "migProfile applies only to a mig"),
        (lambda b: b["device"].update(driver="example.com"), "gpu.nvidia.com"),
        (lambda b: b["device"].update(driverVersion="580"), "a driver version such as"),
        (lambda b: b["device"].update(memory="79.5Gi"), "memory"),
        (lambda b: b["device"].update(uuids=["GPU-1"]), "a GPU- or MIG- device UUID"),
        (
            lambda b: b["device"].update(uuids=["MIG-4f3a9b2c-1d2e-4f5a-8b9c-0d1e2f3a4b5c"]),
            "is not a gpu device's",
        ),
        (lambda b: b["device"].update(extra=1), "extra"),
        (lambda b: b["capacity"].update(usableMemory="81Gi"), "exceeds the device's memory"),
        (lambda b: b.update(resource={"name": "nvidia.com/gpu", "quantity": 1}), "resource"),
    ],
)
def test_a_dra_binding_that_is_not_one_is_refused_with_the_field(change: Any, message: str) -> None:
    binding = clone(LARGE)
    change(binding)
    with pytest.raises(ProfileSchemaError, match=message):
        parsed(gpu_profile("dra", "whole-device", [binding]))


def test_a_mig_device_attesting_p2p_is_refused() -> None:
    binding = clone(MIG)
    binding["accelerator"]["features"] = ["mig", "p2p"]
    with pytest.raises(ProfileSchemaError, match="no peer path"):
        parsed(gpu_profile("mig", "mig", [binding]))


# -- the facts a device must show ---------------------------------------------------------------


def facts_of(binding: DraBinding) -> Any:
    return device_facts(
        binding.device, binding.accelerator.computeCapability, binding.accelerator.cudaDriverMajor
    )


def test_the_published_device_matching_every_fact_passes() -> None:
    binding = dra_of(parsed(gpu_profile("dra", "whole-device", [LARGE])), "h100-80")
    device = published_device("gpu-0")
    assert device_mismatch(NVIDIA_DRA_DRIVER, facts_of(binding), NVIDIA_DRA_DRIVER, device) is None
    # A newer driver is above the floor.
    newer = published_device("gpu-0", driver="590.1.0", cuda="13.1.0")
    assert device_mismatch(NVIDIA_DRA_DRIVER, facts_of(binding), NVIDIA_DRA_DRIVER, newer) is None


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"product": "NVIDIA H100 PCIe"}, "its productName is NVIDIA H100 PCIe"),
        ({"architecture": "Ampere"}, "its architecture is Ampere"),
        ({"cc": "8.0.0"}, "its cudaComputeCapability is 8.0.0, the binding attests 9.0.0"),
        ({"driver": "550.54.15"}, "its driverVersion is 550.54.15, the binding attests at least"),
        ({"cuda": "12.4.0"}, "cudaDriverVersion is 12.4.0, the binding attests major version"),
        ({"memory": "40Gi"}, "its memory is 40Gi, the binding attests 80Gi"),
        ({"device_type": "mig"}, "its type is mig"),
    ],
)
def test_each_fact_a_device_lacks_is_named(changes: dict[str, Any], said: str) -> None:
    binding = dra_of(parsed(gpu_profile("dra", "whole-device", [LARGE])), "h100-80")
    device = published_device("gpu-0", **changes)
    found = device_mismatch(NVIDIA_DRA_DRIVER, facts_of(binding), NVIDIA_DRA_DRIVER, device)
    assert found is not None and said in found


def test_the_uuid_allow_list_and_the_driver_are_facts_too() -> None:
    listed = clone(LARGE)
    listed["device"]["uuids"] = ["GPU-00000000-0000-0000-0000-000000000001"]
    binding = dra_of(parsed(gpu_profile("dra", "whole-device", [listed])), "h100-80")
    device = published_device("gpu-0")
    found = device_mismatch(NVIDIA_DRA_DRIVER, facts_of(binding), NVIDIA_DRA_DRIVER, device)
    assert found is not None and "its uuid is GPU-4f3a9b2c" in found
    other = device_mismatch(NVIDIA_DRA_DRIVER, facts_of(binding), "example.com/gpu", device)
    assert other == "the device is published by driver example.com/gpu, not gpu.nvidia.com"


def test_the_selector_names_every_fact_in_the_drivers_spelling() -> None:
    binding = dra_of(parsed(gpu_profile("dra", "whole-device", [LARGE])), "h100-80")
    selector = owner_objects(parsed(gpu_profile("dra", "whole-device", [LARGE])))["deviceClasses"][
        0
    ]["selector"]
    assert selector.startswith("device.driver == 'gpu.nvidia.com'")
    for fact in facts_of(binding):
        assert f".{fact.name}" in selector
    assert "compareTo(semver('580.65.6')) >= 0" in selector
    assert "compareTo(quantity('80Gi')) == 0" in selector


# -- the objects the owner publishes ----------------------------------------------------------


def test_names_change_with_the_facts_and_only_then() -> None:
    first = dra_of(parsed(gpu_profile("dra", "whole-device", [LARGE])), "h100-80")
    again = dra_of(parsed(gpu_profile("dra", "whole-device", [clone(LARGE)])), "h100-80")
    changed = clone(LARGE)
    changed["device"]["driverVersion"] = "590.0.0"
    other = dra_of(parsed(gpu_profile("dra", "whole-device", [changed])), "h100-80")
    assert device_class_name(first) == device_class_name(again)
    assert device_class_name(first) != device_class_name(other)
    assert device_class_name(first).startswith("tmi-h100-80-")


def test_spill_lists_the_larger_interchangeable_bindings_in_the_planners_order() -> None:
    odd = dra_binding("a100", cc="8.0", product="NVIDIA A100-SXM4-80GB", gpu_architecture="Ampere")
    envelope = parsed(gpu_profile("dra", "whole-device", [LARGE, SMALL, odd]))
    small, large = dra_of(envelope, "h100-40"), dra_of(envelope, "h100-80")
    assert spill_targets(envelope, small, 1) == (large,)
    assert spill_targets(envelope, large, 1) == ()
    # Tensor parallelism spills only to bindings that attest p2p.
    assert spill_targets(envelope, small, 2) == ()
    template = template_for(envelope, small, 1, spill=True)
    assert template.spill == "firstAvailable"
    subrequests = template.claim_spec()["devices"]["requests"][0]["firstAvailable"]
    assert [s["deviceClassName"] for s in subrequests] == [
        device_class_name(small),
        device_class_name(large),
    ]
    assert [s["name"] for s in subrequests] == ["b0", "b1"]
    solo = template_for(envelope, small, 1, spill=False)
    assert solo.spill == "none" and solo.name != template.name


def test_the_owner_publishes_every_template_a_plan_can_name_once() -> None:
    p2p = dra_binding("h100-nvl", features=["bf16", "p2p"])
    envelope = parsed(gpu_profile("dra", "whole-device", [SMALL, LARGE, p2p]))
    templates = published_templates(envelope)
    names = [t.name for t in templates]
    assert len(names) == len(set(names))
    # One device on the two without p2p, solo and spilling; 1..8 on the one with it, which is
    # last in the planner's order, so spills nowhere.
    assert sorted(t.count for t in templates if t.bindings[0].id == "h100-nvl") == list(range(1, 9))
    assert [t.spill for t in templates if t.bindings[0].id == "h100-40"] == [
        "none",
        "firstAvailable",
    ]
    objects = owner_objects(envelope)
    assert {c["binding"] for c in objects["deviceClasses"]} == {"h100-40", "h100-80", "h100-nvl"}
    assert binding_of_class(envelope, objects["deviceClasses"][0]["name"]) is not None
    assert binding_of_class(envelope, "gpu.nvidia.com") is None


# -- the plan and the planned Pod -----------------------------------------------------------------


def dra_state(*bindings: dict[str, Any]) -> Any:
    return OWNER.state(envelope_of(gpu_profile("dra", "whole-device", list(bindings))))


def test_the_plan_claims_the_smallest_binding_and_spills_to_the_next() -> None:
    state = dra_state(LARGE, SMALL)
    body = state.decide(request(), NOW).body
    assert body["bindingId"] == "h100-40"
    assert body["resources"] == {"requests": {}, "limits": {}}
    envelope = parse_envelope(envelope_of(gpu_profile("dra", "whole-device", [LARGE, SMALL])))
    expected = template_for(envelope, dra_of(envelope, "h100-40"), 1, spill=True)
    assert body["claim"] == expected.plan_claim()
    assert body["claim"]["spill"] == "firstAvailable"
    assert parse_plan(body).claim is not None


def test_a_request_that_pins_its_isolation_does_not_spill() -> None:
    state = dra_state(LARGE, SMALL)
    document = pinned_request()
    body = state.decide(document, NOW).body
    assert body["claim"]["spill"] == "none"
    assert body["claim"]["deviceClasses"] == body["claim"]["deviceClasses"][:1]


def planned(state: Any) -> tuple[dict[str, Any], Any]:
    decision = state.decide(request(), NOW)
    plan = decision.plan
    assert plan is not None
    pod = {
        "metadata": {"name": "engine", "labels": {"kamiwaza.ai/engine": "llamacpp"}},
        "spec": {"containers": [{"name": "engine", "image": "x", "resources": {}}]},
    }
    return planned_pod(pod, 0, plan, plan.text(), scheduler_name="tmi", pull_secret=None), plan


def test_the_planned_pod_holds_the_claim_and_nothing_else_of_a_device() -> None:
    pod, plan = planned(dra_state(SMALL))
    assert pod["spec"]["resourceClaims"] == [
        {"name": CLAIM_NAME, "resourceClaimTemplateName": plan.claim.template}
    ]
    engine = pod["spec"]["containers"][0]
    assert engine["resources"] == {"claims": [{"name": CLAIM_NAME}]}
    assert pod_findings(pod, plan) == []


def test_a_changed_claim_on_a_planned_pod_is_found() -> None:
    pod, plan = planned(dra_state(SMALL))
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "tenant-own"
    findings = pod_findings(pod, plan)
    assert [r for r, _ in findings] == ["ResourcesMismatch"]
    assert "tenant-own" in findings[0][1]
    pod, plan = planned(dra_state(SMALL))
    pod["spec"]["containers"].append(
        {
            "name": "sidecar",
            "image": "y",
            "resources": {"claims": [{"name": CLAIM_NAME}]},
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
    )
    findings = pod_findings(pod, plan)
    assert any("spec.containers[sidecar].resources.claims" in text for _, text in findings)


def test_a_dra_plan_is_placed_on_any_node_of_its_architecture() -> None:
    state = dra_state(SMALL)
    _, plan = planned(state)
    profile = state.context(NOW).profile
    found = profile.envelope.binding(plan.bindingId)
    demand = demand_for(plan, found[1], profile_sha256=profile.sha256)
    assert demand.checked == ()
    bare = node_facts({"metadata": {"name": "n", "labels": {"kubernetes.io/arch": "amd64"}}})
    assert identity_verdict(demand, bare).fits
    arm = node_facts({"metadata": {"name": "m", "labels": {"kubernetes.io/arch": "arm64"}}})
    assert not identity_verdict(demand, arm).fits


# -- the allocation, checked ------------------------------------------------------------------


def allocated(plan: Any, device: str = "gpu-0", sub: str = "b0", **extra: Any) -> dict[str, Any]:
    result = {
        "request": f"{CLAIM_NAME}/{sub}",
        "driver": "gpu.nvidia.com",
        "pool": "node-a",
        "device": device,
        **extra,
    }
    return {
        "metadata": {"name": "engine-tmi-devices-x1"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def slices_with(*devices: dict[str, Any]) -> list[dict[str, Any]]:
    from localcluster.nodes.dra_driver import resource_slice

    return [resource_slice("node-a", list(devices))]


def checked(claim: Any, slices: Any, state: Any = None) -> Any:
    from inference_policy.granting.dra_allocation import allocation_verdict

    state = state or dra_state(SMALL, LARGE)
    _, plan = planned(state)
    return allocation_verdict(plan, state.context(NOW).profile.envelope, claim, slices), plan


def test_a_claim_holding_the_bindings_device_is_verified() -> None:
    from inference_policy.granting.dra_allocation import claim_name_of

    verdict, plan = checked(None, [])
    assert verdict is not None and verdict.reason == "ClaimUnallocated"
    pod = {"status": {"resourceClaimStatuses": [{"name": CLAIM_NAME, "resourceClaimName": "c"}]}}
    assert claim_name_of(pod, plan) == "c"
    verdict, _ = checked(allocated(plan), slices_with(published_device("gpu-0")))
    assert verdict is None
    # The spill target's device, allocated for the second sub-request, is checked as its own.
    verdict, _ = checked(allocated(plan, sub="b1"), slices_with(published_device("gpu-0")))
    assert verdict is None


@pytest.mark.parametrize(
    ("claim_change", "device", "said"),
    [
        ({}, published_device("gpu-0", driver="535.0.0"), "is not binding h100-40's: its driverV"),
        ({}, published_device("gpu-9"), "is in no ResourceSlice"),
        ({"adminAccess": True}, published_device("gpu-0"), "with admin access"),
        ({"sub": "b7"}, published_device("gpu-0"), "which is not one of the plan's claim"),
    ],
)
def test_a_claim_holding_another_device_is_refused_with_why(
    claim_change: dict[str, Any], device: dict[str, Any], said: str
) -> None:
    _, plan = checked(None, [])
    sub = claim_change.pop("sub", "b0")
    verdict, _ = checked(allocated(plan, sub=sub, **claim_change), slices_with(device))
    assert verdict is not None and verdict.reason == "DeviceMismatch"
    assert said in verdict.message
