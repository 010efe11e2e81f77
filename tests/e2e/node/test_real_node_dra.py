"""A DRA claim on the real node: allocated by kube-scheduler, prepared by a kubelet plugin, and
handed to the container through CDI.

The node runs `tmi-fakedra` (tools/k8sbin/fakedra), NVIDIA's DRA driver played for the
fixture's GPUs through the kubelet's real DRA plugin API (`k8s.io/dynamic-resource-allocation`'s
kubeletplugin): it publishes the node's ResourceSlice under the node's own identity, and for
each claim the kubelet prepares it writes a CDI spec setting the allocated device's UUID, which
containerd applies. The profile's `dra` binding attests the fixture's facts as the driver spells
them, with a UUID allow-list. So what is proven is the whole path a DRA engine Pod takes on a
GPU node: the webhook's plan and claim, the owner's DeviceClass, the scheduler's allocation, the
kubelet's preparation, the runtime's injection, and the controller's verdict on the allocated
device, with the other containers still shielded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference_policy.trust.dra_claims import CLAIM_NAME
from kits.nodekit import engine_with_sidecar, real_node_stack, wait_pod
from kits.profilekit import Owner, dra_binding, gpu_profile, with_profiles
from kits.stackkit import dated
from localcluster import ControlPlane
from localcluster.install.stack import TenantStack
from localcluster.nodes.realnode import RealNode, probe_report
from localcluster.plane.process import wait_until
from localcluster.servers.engine_pods import CONDITION, condition

pytestmark = pytest.mark.e2e

BINDING = "node-h100-dra"


@pytest.fixture(scope="module")
def devices(real_node: RealNode) -> Iterator[list[dict[str, Any]]]:
    published = real_node.start_dra()
    try:
        yield published
    finally:
        real_node.stop_dra()


@pytest.fixture(scope="module")
def stack(
    node_plane: ControlPlane, real_node: RealNode, devices: list[dict[str, Any]]
) -> Iterator[TenantStack]:
    fixture = real_node.fixture

    def envelope(owner: Owner, namespace: str) -> dict[str, Any]:
        binding = dra_binding(
            BINDING,
            product=fixture.product.replace("-", " "),
            gpu_architecture="Hopper",
            device_memory=f"{fixture.memoryGB}Gi",
            usable=f"{fixture.memoryGB - 1}Gi",
            cc=fixture.computeCapability,
            cuda=int(fixture.cudaDriverVersion.split(".")[0]),
            driver="580.0.0",
            uuids=fixture.uuids(),
        )
        return dated(
            with_profiles(owner, gpu_profile("nvidia-dra", "whole-device", [binding])), namespace
        )

    with real_node_stack(node_plane, real_node, "tmi-node-dra", envelope_for=envelope) as up:
        yield up


def test_the_driver_publishes_the_fixtures_gpus_under_the_nodes_identity(
    real_node: RealNode, devices: list[dict[str, Any]]
) -> None:
    uuids = {d["attributes"]["uuid"]["string"] for d in devices}
    assert uuids == set(real_node.fixture.uuids())
    for device in devices:
        assert device["attributes"]["productName"]["string"] == real_node.fixture.product.replace(
            "-", " "
        )


def test_a_dra_engine_pod_runs_with_the_allocated_device_and_is_verified(
    node_plane: ControlPlane, real_node: RealNode, stack: TenantStack, devices: list[dict[str, Any]]
) -> None:
    ns = stack.settings.namespace
    admin = node_plane.kube("admin")
    tenant = node_plane.kube("tmi-installer")
    created = tenant.create(engine_with_sidecar(stack, "dra-engine"))
    assert created["spec"]["resourceClaims"][0]["name"] == CLAIM_NAME
    spec: Path | None = None
    try:
        pod = wait_pod(
            admin,
            ns,
            "dra-engine",
            lambda p: (
                (condition(p, CONDITION) or {}).get("status") == "True"
                and (condition(p, "Ready") or {}).get("status") == "True"
            ),
        )
        assert pod["spec"]["nodeName"] == real_node.name
        statuses = pod["status"]["resourceClaimStatuses"]
        claim_name = next(s["resourceClaimName"] for s in statuses if s["name"] == CLAIM_NAME)
        claim = admin.get("resource.k8s.io/v1", "ResourceClaim", claim_name, ns)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == real_node.name
        by_name = {d["name"]: d["attributes"]["uuid"]["string"] for d in devices}
        uuid = by_name[result["device"]]
        # The kubelet prepared the claim: the plugin's CDI spec for it is where containerd reads.
        spec = _cdi_spec(real_node, claim["metadata"]["uid"])
        assert spec.is_file()
        engine = probe_report(tenant, ns, "dra-engine", "engine")
        sidecar = probe_report(tenant, ns, "dra-engine", "sidecar")
        assert engine["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert sidecar["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
        verdict = condition(pod, CONDITION)
        assert verdict is not None and f"{real_node.name}/{result['device']}" in verdict["message"]
    finally:
        admin.delete("v1", "Pod", "dra-engine", ns, grace_period_seconds=0)
    # Gone with the Pod: the kubelet unprepared the claim and the plugin removed its spec.
    wait_until(lambda: not spec.exists(), timeout=60, what="the claim's CDI spec to be removed")


def _cdi_spec(node: RealNode, claim_uid: str) -> Path:
    return node.workdir / "cdi" / f"k8s.gpu.nvidia.com-claim_{claim_uid}.json"
