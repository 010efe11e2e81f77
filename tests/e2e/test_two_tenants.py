"""Two tenant namespaces from one owner release, sharing a GPU node, end to end.

Seed 002's lab: two tenants, each with its own owner key and signed profile, install their own
part in their own namespace; the owner release serves both (`owner.tenants`), through one
scheduler and one extender. The extender accounts both tenants' Pods on the node they share, so
with its two GPUs taken, one by each tenant, a third engine Pod of either waits, and is placed
once the other tenant's Pod is gone. Each tenant's Pods are verified by that tenant's own
allocation controller, against that tenant's profile.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import ApiError, ControlPlane, FakeNode, Kube, create_fake_nodes
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


# -- no tenant steers the scheduler against the other ----------------------------------------


def _plain(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "crowd"}},
        "spec": {
            "containers": [{"name": "app", "image": "placeholder.invalid/app:1"}],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def _refusal(call: Any) -> str:
    with pytest.raises(ApiError) as refused:
        call()
    assert refused.value.status == 403, refused.value.message
    return str(refused.value.message)


def test_no_tenant_steers_the_scheduler_against_the_other(
    control_plane: ControlPlane, shared: tuple[TenantStack, FurtherTenant, str]
) -> None:
    """Acting as the first tenant's namespace admin, with the second tenant's verified engine
    Pod on the shared node: a system PriorityClass (the 1.36 API server admits them in any
    namespace, and the owner's scheduler preempts by them), a Pod pinned to the node by
    spec.nodeName, and a required anti-affinity term over every namespace are each refused,
    so the other tenant's Pod is neither evicted nor kept off the node. The same Pods without
    the steering are admitted."""
    stack, second, node = shared
    kube = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    first_ns, second_ns = stack.settings.namespace, second.settings.namespace
    victim = f"b-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(second_ns, LARGE, name=victim))
    before = _verified(kube, second_ns, victim)
    try:
        critical = engine_pod(first_ns, LARGE, name=f"a-{uuid.uuid4().hex[:6]}")
        critical["spec"]["priorityClassName"] = "system-cluster-critical"
        message = _refusal(lambda: installer.create(critical))
        assert "priorityClassName system-cluster-critical is not one the owner allows" in message
        node_critical = _plain(
            first_ns, f"crit-{uuid.uuid4().hex[:6]}", priorityClassName="system-node-critical"
        )
        assert "system-node-critical" in _refusal(lambda: installer.create(node_critical))

        pinned = _plain(first_ns, f"pinned-{uuid.uuid4().hex[:6]}", nodeName=node)
        message = _refusal(lambda: installer.create(pinned))
        assert f"spec.nodeName ({node}) is set" in message, message

        everywhere = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {},
                        "namespaceSelector": {},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
        crowd = _plain(first_ns, f"crowd-{uuid.uuid4().hex[:6]}", affinity=everywhere)
        message = _refusal(lambda: installer.create(crowd))
        assert "tmi-no-cross-namespace-affinity" in message, message
        named = copy.deepcopy(everywhere)
        term = named["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        del term["namespaceSelector"]
        term["namespaces"] = [second_ns]
        crowd["spec"]["affinity"] = named
        assert "tmi-no-cross-namespace-affinity" in _refusal(lambda: installer.create(crowd))

        # Within its own namespace the tenant steers its own Pods as it likes.
        del term["namespaces"]
        crowd["spec"]["affinity"] = named
        installer.create(crowd, dry_run=True)
        installer.create(_plain(first_ns, f"plain-{uuid.uuid4().hex[:6]}"), dry_run=True)

        after = kube.get("v1", "Pod", victim, second_ns)
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert not after["metadata"].get("deletionTimestamp")
        assert (condition(after, CONDITION) or {}).get("status") == "True"
    finally:
        kube.delete("v1", "Pod", victim, second_ns, grace_period_seconds=0)
