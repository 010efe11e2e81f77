"""Two tenant namespaces from one owner release, sharing a GPU node, end to end.

Seed 002's lab: two tenants, each with its own owner key and signed profile, install their own
part in their own namespace; the owner release serves both (`owner.tenants`), through one
scheduler and one extender. The extender accounts both tenants' Pods on the node they share, so
with its two GPUs taken, one by each tenant, a third engine Pod of either waits, and is placed
once the other tenant's Pod is gone. Each tenant's Pods are verified by that tenant's own
allocation controller, against that tenant's profile.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import ControlPlane, FakeNode, Kube, create_fake_nodes
from localcluster.nodes import delete_fake_nodes
from localcluster.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.stack_settings import StackSettings
from localcluster.tenants import FurtherTenant, add_tenant
from tests.e2e.stackkit import LARGE, tenant_stack, whole_h100_envelope
from tests.profilekit import CLUSTER, Owner

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def shared(control_plane: ControlPlane) -> Iterator[tuple[TenantStack, FurtherTenant, str]]:
    admin = control_plane.kube("admin")
    node = f"shared-h100-{uuid.uuid4().hex[:4]}"
    with tenant_stack(control_plane, "tmi-two-a", whole_h100_envelope, 30) as stack:
        second_owner = Owner()
        settings = StackSettings(
            owner_public_keys=(second_owner.public_key,),
            cluster_binding_id=CLUSTER,
            namespace=f"tmi-two-b-{uuid.uuid4().hex[:6]}",
            scheduling_timeout_seconds=30,
        )
        profile = second_owner.sign(
            whole_h100_envelope(second_owner, settings.namespace), name=settings.bundle_configmap
        )
        second = add_tenant(stack, settings, profile)
        create_fake_nodes(admin, [FakeNode(node, gpus=2, vram_gb=80)])
        try:
            assert stack.extender is not None
            stack.extender.wait_nodes([node])
            yield stack, second, node
        finally:
            delete_fake_nodes(admin, [node])
            second.stop()


def _verified(kube: Kube, namespace: str, name: str, status: str = "True") -> dict[str, Any]:
    pod: dict[str, Any] = kube.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("status") == status,
        timeout=90,
        what=f"Pod {namespace}/{name} AllocationVerified={status}",
    )
    return pod


def test_two_tenants_share_a_node_without_over_commit(
    control_plane: ControlPlane, shared: tuple[TenantStack, FurtherTenant, str]
) -> None:
    stack, second, node = shared
    kube = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    first_ns, second_ns = stack.settings.namespace, second.settings.namespace
    held = {first_ns: f"a-{uuid.uuid4().hex[:6]}", second_ns: f"b-{uuid.uuid4().hex[:6]}"}
    for namespace, name in held.items():
        installer.create(engine_pod(namespace, LARGE, name=name))
    for namespace, name in held.items():
        pod = _verified(kube, namespace, name)
        assert pod["spec"]["nodeName"] == node
        found = condition(pod, CONDITION)
        assert found is not None and found["reason"] == "Verified"
    # Each was planned under its own tenant's profile (a different owner key, so a different
    # bundle).
    plans = {
        ns: kube.get("v1", "Pod", name, ns)["metadata"]["annotations"]["kamiwaza.ai/plan"]
        for ns, name in held.items()
    }
    assert plans[first_ns] != plans[second_ns]

    waiting = f"a-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(first_ns, LARGE, name=waiting))
    pod = kube.wait_for(
        "v1",
        "Pod",
        waiting,
        first_ns,
        lambda p: "nvidia.com/gpu" in str((condition(p, "PodScheduled") or {}).get("message")),
        timeout=60,
        what="the scheduler to report the shared node full",
    )
    assert not pod["spec"].get("nodeName")

    # The other tenant's Pod goes: the waiting one is placed on the freed GPU.
    kube.delete("v1", "Pod", held[second_ns], second_ns, grace_period_seconds=0)
    placed = _verified(kube, first_ns, waiting)
    assert placed["spec"]["nodeName"] == node
    for namespace, name in ((first_ns, held[first_ns]), (first_ns, waiting)):
        kube.delete("v1", "Pod", name, namespace, grace_period_seconds=0)
