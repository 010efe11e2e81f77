"""Spill for DRA bindings end to end: the MIG slice full, the next deployment's claim takes a
whole GPU of the next binding, with no room figures and no change to the plan.

The profile has two `dra` bindings a 7B GGUF fits, on the same A100 generation (so every engine
runs the same image on both): a `3g.40gb` MIG device (38Gi, the smaller, planned first) and a
whole A100 (79Gi). The plan's claim lists both as `firstAvailable` sub-requests, so when the
one MIG device is allocated kube-scheduler gives the next claim the whole GPU. KWOK nodes carry
no devices: a test identity playing NVIDIA's DRA driver publishes the ResourceSlices
(`localcluster.nodes.dra_driver`). The device-plugin half is `tests/e2e/scheduling/test_spill.py`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from inference_policy.trust.dra_claims import CLAIM_NAME
from kits.profilekit import Owner, dra_binding, gpu_profile, request, with_profiles
from kits.stackkit import dated, placed_and_verified, pod_names, tenant_stack
from localcluster import ControlPlane, Kube
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.nodes.dra_driver import Driver, published_device
from localcluster.nodes.kwok import FakeNode, create_fake_nodes, delete_fake_nodes

pytestmark = pytest.mark.e2e

A100 = "NVIDIA A100-SXM4-80GB"
MIG = "a100-3g40gb"
WHOLE = "a100-whole"


def dra_mig_envelope(owner: Owner, namespace: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"product": A100, "gpu_architecture": "Ampere", "cc": "8.0"}
    mig = dra_binding(
        MIG,
        device_type="mig",
        mig_profile="3g.40gb",
        device_memory="40Gi",
        usable="38Gi",
        features=["bf16", "mig"],
        **facts,
    )
    whole = dra_binding(WHOLE, device_memory="80Gi", usable="79Gi", **facts)
    envelope = with_profiles(
        owner,
        gpu_profile("nvidia-dra-mig", "mig", [mig]),
        gpu_profile("nvidia-dra-whole", "whole-device", [whole]),
    )
    return dated(envelope, namespace)


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with tenant_stack(control_plane, "tmi-spill-dra", dra_mig_envelope, 30) as up:
        yield up


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane, stack: TenantStack) -> Iterator[dict[str, str]]:
    """One node with one 3g.40gb MIG device, one with a whole A100, as the driver publishes."""
    admin = control_plane.kube("admin")
    driver = Driver(control_plane)
    suffix = uuid.uuid4().hex[:4]
    names = {"mig": f"spill-dra-mig-{suffix}", "whole": f"spill-dra-gpu-{suffix}"}
    create_fake_nodes(admin, [FakeNode(name, gpus=0, vram_gb=None) for name in names.values()])
    common: dict[str, Any] = {"product": A100, "architecture": "Ampere", "cc": "8.0.0"}
    driver.publish(
        names["mig"],
        [
            published_device(
                "gpu-0-mig-0",
                uuid="MIG-00000000-0000-0000-0000-000000000001",
                device_type="mig",
                mig_profile="3g.40gb",
                memory="40Gi",
                **common,
            )
        ],
    )
    driver.publish(
        names["whole"],
        [published_device("gpu-0", uuid="GPU-00000000-0000-0000-0000-000000000002", **common)],
    )
    assert stack.extender is not None
    stack.extender.wait_nodes(list(names.values()))
    try:
        yield names
    finally:
        for name in names.values():
            driver.withdraw(name)
        delete_fake_nodes(admin, list(names.values()))


def _allocated(kube: Kube, stack: TenantStack, pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("resourceClaimStatuses") or []
    name = next(s["resourceClaimName"] for s in statuses if s["name"] == CLAIM_NAME)
    claim = kube.get("resource.k8s.io/v1", "ResourceClaim", name, stack.settings.namespace)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def test_with_the_mig_device_taken_the_next_claim_takes_the_whole_gpu(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str]
) -> None:
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    namespace = stack.settings.namespace
    with pod_names(control_plane, stack) as unique:
        first = unique("first")
        created = installer.create(engine_pod(namespace, request(), name=first))
        plan_claim = _claim_of(created)
        assert plan_claim["spill"] == "firstAvailable" and len(plan_claim["deviceClasses"]) == 2
        pod = placed_and_verified(admin, stack, first)
        result = _allocated(admin, stack, pod)
        assert (result["request"], result["pool"]) == (f"{CLAIM_NAME}/b0", nodes["mig"])

        second = unique("second")
        created = installer.create(engine_pod(namespace, request(), name=second))
        # The same plan as the first: the claim, not the webhook, finds the room.
        assert _claim_of(created) == plan_claim
        pod = placed_and_verified(admin, stack, second)
        result = _allocated(admin, stack, pod)
        assert (result["request"], result["pool"]) == (f"{CLAIM_NAME}/b1", nodes["whole"])
        message = (condition(pod, CONDITION) or {}).get("message", "")
        assert f"{nodes['whole']}/gpu-0" in message, message


def _claim_of(pod: dict[str, Any]) -> dict[str, Any]:
    plan = json.loads(pod["metadata"]["annotations"]["kamiwaza.ai/plan"])
    assert plan["bindingId"] == MIG, plan
    claim: dict[str, Any] = plan["claim"]
    return claim
