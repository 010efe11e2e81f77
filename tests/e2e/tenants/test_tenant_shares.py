"""Two tenants' accounted shares on one node's GPUs, through the real scheduler: kept apart by
default, shared once the owner's signed profiles say so (`inference_policy.placing.tenancy`).

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

import uuid
from collections.abc import Iterator

import pytest

from inference_policy.planning.room import SMALLEST, WITH_ROOM
from localcluster import ControlPlane, FakeNode, create_fake_nodes
from localcluster.install.stack import CONDITION, condition, deploy_stack
from localcluster.install.tenants import FurtherTenant, add_tenant
from localcluster.nodes.kwok import delete_fake_nodes
from tests.e2e.shareskit import (
    GPU0,
    GPU1,
    VRAM,
    Tenant,
    creator,
    new_tenant,
    plan_of,
    share,
    verified,
    wait_room,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def shared(control_plane: ControlPlane) -> Iterator[tuple[Tenant, Tenant, str]]:
    admin = control_plane.kube("admin")
    node = f"shares-h100-{uuid.uuid4().hex[:4]}"
    a, b = new_tenant("tmi-shares-a"), new_tenant("tmi-shares-b")
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


def test_each_tenants_shares_land_on_gpus_of_its_own(
    control_plane: ControlPlane, shared: tuple[Tenant, Tenant, str]
) -> None:
    a, b, node = shared
    admin = control_plane.kube("admin")
    create = creator(control_plane)
    for tenant in (a, b):
        wait_room(admin, tenant, {GPU0: 80, GPU1: 80})

    first = create(a.namespace, "a", share("8Gi"), GPU0, WITH_ROOM)
    pod = verified(admin, a.namespace, first)
    assert (pod["spec"]["nodeName"], plan_of(pod)["bindingId"]) == (node, GPU0)

    # Team-a's share holds GPU 0: no room there for team-b, all of it for team-a.
    wait_room(admin, b, {GPU0: 0, GPU1: 80})
    wait_room(admin, a, {GPU0: 72, GPU1: 80})
    second = create(b.namespace, "b", share("16Gi"), GPU1, WITH_ROOM)
    pod = verified(admin, b.namespace, second)
    plan = plan_of(pod)
    assert (pod["spec"]["nodeName"], plan["bindingId"]) == (node, GPU1)
    assert plan["choice"] == {"rule": WITH_ROOM, "passed": [GPU0]}
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) == {f"{VRAM}1"}
    verdict = condition(pod, CONDITION)
    assert verdict is not None and verdict["reason"] == "Verified"

    # A share only GPU 0 could hold (GPU 1 has 64 GiB left) waits: another tenant is there.
    wait_room(admin, b, {GPU0: 0, GPU1: 64})
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
    create = creator(control_plane)
    # What the first test left: team-a's 8 GiB on GPU 0, team-b's 16 GiB on GPU 1.
    wait_room(admin, b, {GPU0: 0, GPU1: 64})
    a.republish(control_plane, trust=True, version=2)
    b.republish(control_plane, trust=True, version=2)
    # Both tenants now trust each other with their shares: GPU 0's free 72 GiB is room for b.
    wait_room(admin, b, {GPU0: 72, GPU1: 64})
    large = create(b.namespace, "b-large", share("70Gi"), GPU0, WITH_ROOM)
    pod = verified(admin, b.namespace, large)
    plan = plan_of(pod)
    assert (pod["spec"]["nodeName"], plan["bindingId"]) == (node, GPU0)
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) == {f"{VRAM}0"}
    verdict = condition(pod, CONDITION)
    assert verdict is not None and verdict["reason"] == "Verified"
    wait_room(admin, a, {GPU0: 2, GPU1: 64})
