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

from kits.profilekit import CLUSTER, Owner
from kits.stackkit import LARGE, tenant_stack, whole_h100_envelope
from localcluster import ApiError, ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.install import render_owner
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.install.stack_settings import StackSettings
from localcluster.install.tenants import FurtherTenant, add_tenant
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.servers.webhook import CONFIGURATION_NAME

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


# -- the owner's quota per tenant -----------------------------------------------------------------

QUOTA = "tmi-quota"


def _as_submitted(stored: dict[str, Any], name: str) -> dict[str, Any]:
    """A Pod the API server returned, as a client would send it again under `name`."""
    pod = copy.deepcopy(stored)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        pod["metadata"].pop(key, None)
    pod["metadata"]["name"] = name
    pod["spec"].pop("nodeName", None)
    pod.pop("status", None)
    return pod


def test_a_tenant_at_its_quota_is_refused_at_create_and_the_other_is_not(
    control_plane: ControlPlane, shared: tuple[TenantStack, FurtherTenant, str]
) -> None:
    """The owner gives the first tenant a quota of one GPU (owner.quota). Acting as its namespace
    admin, its first engine Pod is placed and verified; the second is refused at create by its
    webhook, with the code, the quota and what is held; the other tenant, which has no quota,
    places its own on the shared node's other GPU. With the tenant's webhook out of the way, a
    copy of the planned Pod is refused by the API server's own quota, and, once the devices
    allow it, admitted and placed nowhere by the owner's extender, which counts engine Pods."""
    stack, second, node = shared
    assert stack.owner is not None
    kube = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    first_ns, second_ns = stack.settings.namespace, second.settings.namespace
    values = stack.values()
    values["owner"]["quota"] = {"devices": {"nvidia.com/gpu": 1}}
    quota = render_owner(values, stack.settings.scheduler_namespace).get("ResourceQuota", QUOTA)
    kube.apply(quota)
    names: dict[str, list[str]] = {first_ns: [], second_ns: []}
    configuration = stack.owner.get("MutatingWebhookConfiguration", CONFIGURATION_NAME)
    try:
        # The API server refuses Pods asking for what a quota counts until it has counted once.
        kube.wait_for(
            "v1",
            "ResourceQuota",
            QUOTA,
            first_ns,
            lambda q: "requests.nvidia.com/gpu" in ((q.get("status") or {}).get("hard") or {}),
            timeout=30,
            what="the quota controller to count tmi-quota",
        )
        held = f"a-{uuid.uuid4().hex[:6]}"
        names[first_ns].append(held)
        installer.create(engine_pod(first_ns, LARGE, name=held))
        placed = _verified(kube, first_ns, held)
        assert placed["spec"]["nodeName"] == node

        refused = f"a-{uuid.uuid4().hex[:6]}"

        def refused_by_the_webhook() -> str | None:
            # The webhook reads the quota and the held Pods through its own watches: under load
            # they reach it a moment after the test saw them (until then the API server's own
            # quota refuses the Pod instead, which the bypass below shows on purpose).
            message = _refusal(
                lambda: installer.create(engine_pod(first_ns, LARGE, name=refused), dry_run=True)
            )
            return message if "quota-exceeded" in message else None

        message = wait_until(
            refused_by_the_webhook, timeout=60, what="the webhook to hold the tenant to its quota"
        )
        assert "tenant-mode inference (quota-exceeded): " in message, message
        assert (
            f"namespace {first_ns} would pass the owner's quota {QUOTA} "
            "(nvidia.com/gpu devices: limit 1, held now 1, this Pod asks 1)"
        ) in message, message

        other = f"b-{uuid.uuid4().hex[:6]}"
        names[second_ns].append(other)
        installer.create(engine_pod(second_ns, LARGE, name=other))
        assert _verified(kube, second_ns, other)["spec"]["nodeName"] == node

        # The tenant's webhook is the tenant's software: without it, the planned Pod copied
        # under a new name passes the guard, and Kubernetes' own quota refuses it.
        bypass = _as_submitted(placed, f"a-{uuid.uuid4().hex[:6]}")
        kube.delete(
            "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", CONFIGURATION_NAME
        )

        def native_refusal() -> str | None:
            try:
                installer.create(bypass, dry_run=True)
            except ApiError as exc:
                text = str(exc.message)
                return text if f"exceeded quota: {QUOTA}" in text else None
            raise AssertionError("a Pod past the quota was admitted")

        wait_until(native_refusal, timeout=30, what="the webhook to be out of the way")
        message = _refusal(lambda: installer.create(bypass))
        assert f"exceeded quota: {QUOTA}, requested: requests.nvidia.com/gpu=1" in message

        # What no native quota counts (engine Pods, here) the owner's extender holds: the copy,
        # admitted now the devices allow it, is placed nowhere, with the reason, though the
        # node has a GPU free once the other tenant's Pod is gone.
        kube.delete("v1", "Pod", other, second_ns, grace_period_seconds=0)
        values["owner"]["quota"] = {"devices": {"nvidia.com/gpu": 2}, "enginePods": 1}
        owner = render_owner(values, stack.settings.scheduler_namespace)
        kube.apply(owner.get("ResourceQuota", QUOTA))
        kube.wait_for(
            "v1",
            "ResourceQuota",
            QUOTA,
            first_ns,
            lambda q: (
                ((q.get("status") or {}).get("hard") or {}).get("requests.nvidia.com/gpu") == "2"
            ),
            timeout=30,
            what="the quota controller to count the raised quota",
        )
        names[first_ns].append(bypass["metadata"]["name"])
        installer.create(bypass)
        pending = kube.wait_for(
            "v1",
            "Pod",
            bypass["metadata"]["name"],
            first_ns,
            lambda p: (
                "enginePods: limit 1, held now 1, this Pod asks 1"
                in str((condition(p, "PodScheduled") or {}).get("message"))
            ),
            timeout=60,
            what="the scheduler to report the extender's quota verdict",
        )
        assert not pending["spec"].get("nodeName")
    finally:
        kube.apply(configuration)
        for namespace, pods in names.items():
            for name in pods:
                kube.delete("v1", "Pod", name, namespace, grace_period_seconds=0)
        kube.delete("v1", "ResourceQuota", QUOTA, first_ns)
