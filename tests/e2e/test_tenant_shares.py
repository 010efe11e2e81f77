"""Two tenants' accounted shares on one node's GPUs, through the real scheduler: kept apart by
default, shared once the owner's signed profiles say so (`inference_policy.tenancy`).

One owner release serves two tenant namespaces (`owner.tenants`), each with its own owner key and
a profile of two share bindings, one per GPU of the node's VRAM plugin
(`kamiwaza.ai/vram-gb-gpu-0`, `-gpu-1`). An accounted share does not isolate tenants, so the
extender keeps each tenant's shares on GPUs no other tenant holds, and publishes to each
tenant's webhook the room it has there: team-a's first share takes GPU 0, team-b's takes GPU 1
(its webhook passes over GPU 0, which has no room for it), and a share of team-b's that only
GPU 0 could hold waits with the extender's `other-tenant` reason. Once both profiles set
`sharing.acrossTenants` on their share bindings (signed again, published as new revisions),
team-b's share is placed on GPU 0 beside team-a's.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inference_policy.room import ROOM_CONFIGMAP, ROOM_KEY, SMALLEST, WITH_ROOM, parse_figures
from localcluster import ApiError, ControlPlane, FakeNode, Kube, create_fake_nodes
from localcluster.nodes import delete_fake_nodes
from localcluster.process import wait_until
from localcluster.stack import CONDITION, condition, deploy_stack, engine_pod
from localcluster.stack_settings import StackSettings
from localcluster.tenants import FurtherTenant, add_tenant
from localcluster.webhook_objects import publish_profile
from tests.e2e.stackkit import dated
from tests.profilekit import CLUSTER, Owner, gpu_binding, gpu_profile, request, with_profiles

pytestmark = pytest.mark.e2e

GPU0, GPU1 = "share-gpu0", "share-gpu1"
VRAM = "kamiwaza.ai/vram-gb-gpu-"


def share_envelope(owner: Owner, namespace: str, *, trust: bool = False, version: int = 1) -> Any:
    bindings = []
    for index in (0, 1):
        binding = gpu_binding(
            f"share-gpu{index}",
            allocator="vram-plugin",
            resource=f"{VRAM}{index}",
            cc="9.0",
            memory="79Gi",
        )
        if trust:
            binding["sharing"] = {"acrossTenants": True}
        bindings.append(binding)
    envelope = with_profiles(owner, gpu_profile("nvidia-share", "accounted-share", bindings))
    envelope["version"] = version
    return dated(envelope, namespace)


def share(memory: str) -> dict[str, Any]:
    """A request for an accounted share of `memory` (the share is exactly that many GiB); it
    names no profile, so its webhook may pass over a binding without room."""
    block = {
        "schemaVersion": 1,
        "accelerator": {
            "capability": "gpu",
            "count": 1,
            "memory": {"minimum": memory},
            "isolation": "any-qualified",
        },
        "runtime": {"selection": "automatic"},
    }
    return request(inferenceResources=block)


class Tenant:
    """One tenant namespace: its owner key, settings and current signed profile."""

    def __init__(self, owner: Owner, settings: StackSettings, profile: dict[str, Any]) -> None:
        self.owner, self.settings, self.profile = owner, settings, profile

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def bundle(self) -> str:
        return str(self.profile["data"]["bundle.sha256"])

    def republish(self, plane: ControlPlane, *, trust: bool, version: int) -> None:
        envelope = share_envelope(self.owner, self.namespace, trust=trust, version=version)
        self.profile = self.owner.sign(envelope, name=self.settings.bundle_configmap)
        publish_profile(plane, self.profile)


def _tenant(prefix: str) -> Tenant:
    owner = Owner()
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        scheduling_timeout_seconds=60,
    )
    envelope = share_envelope(owner, namespace)
    return Tenant(owner, settings, owner.sign(envelope, name=settings.bundle_configmap))


@pytest.fixture(scope="module")
def shared(control_plane: ControlPlane) -> Iterator[tuple[Tenant, Tenant, str]]:
    admin = control_plane.kube("admin")
    node = f"shares-h100-{uuid.uuid4().hex[:4]}"
    a, b = _tenant("tmi-shares-a"), _tenant("tmi-shares-b")
    with deploy_stack(control_plane, a.settings, a.profile) as stack:
        control_plane.grant_namespace_admin("tmi-installer", a.namespace)
        second: FurtherTenant = add_tenant(stack, b.settings, b.profile)
        create_fake_nodes(admin, [FakeNode(node, gpus=2, vram_gb=80, vram_budget=True)])
        try:
            assert stack.extender is not None
            stack.extender.wait_nodes([node])
            yield a, b, node
        finally:
            delete_fake_nodes(admin, [node])
            second.stop()


def _room(kube: Kube, tenant: Tenant) -> dict[str, int] | None:
    """The largest free amount on one node per binding, as published to the tenant's webhook
    for its current profile."""
    try:
        configmap = kube.get("v1", "ConfigMap", ROOM_CONFIGMAP, tenant.namespace)
    except ApiError:
        return None
    figures = parse_figures(configmap["data"][ROOM_KEY])
    if figures.bundle != tenant.bundle:
        return None
    return dict(figures.largest)


def _wait_room(kube: Kube, tenant: Tenant, want: dict[str, int]) -> None:
    kube.wait_for(
        "v1",
        "Namespace",
        tenant.namespace,
        None,
        lambda _: _room(kube, tenant) == want,
        timeout=60,
        what=f"{tenant.namespace}'s room figures {want}",
    )


def _verified(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = kube.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (
            bool(p["spec"].get("nodeName"))
            and (condition(p, CONDITION) or {}).get("status") == "True"
        ),
        timeout=90,
        what=f"Pod {namespace}/{name} placed and verified",
    )
    return pod


def _plan(pod: dict[str, Any]) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["kamiwaza.ai/plan"])
    return plan


Create = Callable[[str, str, dict[str, Any], str, str], str]


def _created(plane: ControlPlane) -> Create:
    """Create an engine Pod once the tenant's webhook plans it on `binding` by `rule`: the room
    figures reach the webhook through its own watch, a moment after the test reads them."""
    installer = plane.kube("tmi-installer")

    def create(
        namespace: str, prefix: str, document: dict[str, Any], binding: str, rule: str
    ) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        pod = engine_pod(namespace, document, name=name)

        def planned() -> bool:
            plan = _plan(installer.create(copy.deepcopy(pod), dry_run=True))
            return bool(plan["bindingId"] == binding and plan["choice"]["rule"] == rule)

        wait_until(planned, timeout=30, what=f"{namespace}'s webhook to plan {binding} ({rule})")
        installer.create(pod)
        return name

    return create


def test_each_tenants_shares_land_on_gpus_of_its_own(
    control_plane: ControlPlane, shared: tuple[Tenant, Tenant, str]
) -> None:
    a, b, node = shared
    admin = control_plane.kube("admin")
    create = _created(control_plane)
    for tenant in (a, b):
        _wait_room(admin, tenant, {GPU0: 80, GPU1: 80})

    first = create(a.namespace, "a", share("8Gi"), GPU0, WITH_ROOM)
    pod = _verified(admin, a.namespace, first)
    assert (pod["spec"]["nodeName"], _plan(pod)["bindingId"]) == (node, GPU0)

    # Team-a's share holds GPU 0: no room there for team-b, all of it for team-a.
    _wait_room(admin, b, {GPU0: 0, GPU1: 80})
    _wait_room(admin, a, {GPU0: 72, GPU1: 80})
    second = create(b.namespace, "b", share("16Gi"), GPU1, WITH_ROOM)
    pod = _verified(admin, b.namespace, second)
    plan = _plan(pod)
    assert (pod["spec"]["nodeName"], plan["bindingId"]) == (node, GPU1)
    assert plan["choice"] == {"rule": WITH_ROOM, "passed": [GPU0]}
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) == {f"{VRAM}1"}
    verdict = condition(pod, CONDITION)
    assert verdict is not None and verdict["reason"] == "Verified"

    # A share only GPU 0 could hold (GPU 1 has 64 GiB left) waits: another tenant is there.
    _wait_room(admin, b, {GPU0: 0, GPU1: 64})
    # No binding has room for it: the webhook plans the smallest that fits, GPU 0's.
    waiting = create(b.namespace, "b-large", share("70Gi"), GPU0, SMALLEST)
    pod = admin.wait_for(
        "v1",
        "Pod",
        waiting,
        b.namespace,
        lambda p: (
            "another tenant holds an accounted share on GPU 0"
            in str((condition(p, "PodScheduled") or {}).get("message"))
        ),
        timeout=60,
        what="the scheduler to report the extender's other-tenant verdict",
    )
    assert not pod["spec"].get("nodeName")
    message = str((condition(pod, "PodScheduled") or {}).get("message"))
    assert a.namespace not in message
    admin.delete("v1", "Pod", waiting, b.namespace, grace_period_seconds=0)


def test_with_the_owners_sharing_value_the_tenants_share_a_gpu(
    control_plane: ControlPlane, shared: tuple[Tenant, Tenant, str]
) -> None:
    a, b, node = shared
    admin = control_plane.kube("admin")
    create = _created(control_plane)
    # What the first test left: team-a's 8 GiB on GPU 0, team-b's 16 GiB on GPU 1.
    _wait_room(admin, b, {GPU0: 0, GPU1: 64})
    a.republish(control_plane, trust=True, version=2)
    b.republish(control_plane, trust=True, version=2)
    # Both tenants now trust each other with their shares: GPU 0's free 72 GiB is room for b.
    _wait_room(admin, b, {GPU0: 72, GPU1: 64})
    large = create(b.namespace, "b-large", share("70Gi"), GPU0, WITH_ROOM)
    pod = _verified(admin, b.namespace, large)
    plan = _plan(pod)
    assert (pod["spec"]["nodeName"], plan["bindingId"]) == (node, GPU0)
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) == {f"{VRAM}0"}
    verdict = condition(pod, CONDITION)
    assert verdict is not None and verdict["reason"] == "Verified"
    _wait_room(admin, a, {GPU0: 2, GPU1: 64})
