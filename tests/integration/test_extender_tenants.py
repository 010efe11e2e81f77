"""One extender for two tenant namespaces, each with its own owner key and profile.

Seed 002's lab is two tenants sharing GPU nodes through one scheduler: the extender checks each
Pod against its own namespace's signed profile, and accounts every tenant's bound Pods on a
node together, so a node two tenants share is never over-committed. A Pod planned under one
tenant's profile is not placed in the other's namespace, and a planned Pod in no tenant
namespace is placed nowhere.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from extender.app import create_app
from extender.tenants import Tenant
from tests.fleetkit import h100
from tests.integration.extenderkit import (
    SCHEDULER,
    block,
    bound,
    cache_args,
    fleet_envelope,
    plan_for,
    planned_pod,
    published,
    request,
)
from tests.integration.memory_sources import ExtenderMemorySource as MemorySource
from tests.profilekit import NOW, Owner

NODE = h100("shared-h100", gpus=2)


class Team:
    """A tenant namespace with an owner key and a profile of its own."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.owner = Owner()
        self.envelope = fleet_envelope(self.owner)
        self.envelope["namespace"] = namespace
        self.tenant = Tenant(self.owner.settings(namespace=namespace, scheduler_name=SCHEDULER))

    def pod(self) -> dict[str, Any]:
        """An engine Pod planned for one whole GPU, as this tenant's webhook leaves it."""
        document = request(inferenceResources=block("nvidia-whole"))
        plan = plan_for(self.owner, self.envelope, document, namespace=self.namespace)
        return planned_pod(plan, namespace=self.namespace)

    def profile(self) -> dict[str, Any]:
        return published(self.owner.sign(self.envelope))


async def _client(
    aiohttp_client: AiohttpClient, teams: list[Team], pods: list[dict[str, Any]]
) -> TestClient[Any, Any]:
    source = MemorySource(
        [NODE.manifest()], pods, profiles={t.namespace: t.profile() for t in teams}
    )
    tenants = [t.tenant for t in teams]
    app = create_app(tenants[0].policy, source, tenants=tenants, clock=lambda: NOW)
    return await aiohttp_client(app)


async def _filter(client: TestClient[Any, Any], pod: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(
        "/filter",
        data=json.dumps(cache_args(pod, [NODE.name])),
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 200, await response.text()
    result: dict[str, Any] = await response.json()
    assert result["Error"] == ""
    return result


async def test_two_tenants_sharing_a_node_are_accounted_together(
    aiohttp_client: AiohttpClient,
) -> None:
    """Two GPUs, one held by each tenant: a third Pod of either fits nowhere. With only its own
    Pod there, the same Pod fits (the refusal is the other tenant's Pod, not the Pod)."""
    a, b = Team("team-a"), Team("team-b")
    held_a, held_b = bound(a.pod(), NODE.name), bound(b.pod(), NODE.name)

    alone = await _client(aiohttp_client, [a, b], [held_a])
    assert (await _filter(alone, a.pod()))["NodeNames"] == [NODE.name]
    assert (await _filter(alone, b.pod()))["NodeNames"] == [NODE.name]

    shared = await _client(aiohttp_client, [a, b], [held_a, held_b])
    for team in (a, b):
        result = await _filter(shared, team.pod())
        assert result["NodeNames"] == []
        reason = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}[NODE.name]
        assert "nvidia.com/gpu" in reason, reason


async def test_each_pod_is_held_to_its_own_namespaces_profile(
    aiohttp_client: AiohttpClient,
) -> None:
    """A plan made under team-a's profile, copied into team-b's namespace, is checked against
    team-b's profile and passes no node; in a namespace of no tenant it passes none either."""
    a, b = Team("team-a"), Team("team-b")
    client = await _client(aiohttp_client, [a, b], [])
    assert (await _filter(client, a.pod()))["NodeNames"] == [NODE.name]
    for namespace in ("team-b", "elsewhere"):
        moved = copy.deepcopy(a.pod())
        moved["metadata"]["namespace"] = namespace
        result = await _filter(client, moved)
        assert result["NodeNames"] == []
        reason = result["FailedAndUnresolvableNodes"][NODE.name]
        if namespace == "elsewhere":
            assert "'elsewhere' is not a tenant namespace of this extender" in reason
        else:
            assert reason.startswith(
                "ProfileRevisionUnknown: no profile ConfigMap in the namespace"
            ), reason


async def test_the_extender_is_ready_only_once_every_tenants_profile_is_read(
    aiohttp_client: AiohttpClient,
) -> None:
    a, b = Team("team-a"), Team("team-b")
    source = MemorySource([NODE.manifest()], [], profiles={a.namespace: a.profile()})
    source.hold = {"profile"}
    tenants = [a.tenant, b.tenant]
    app = create_app(a.tenant.policy, source, tenants=tenants, clock=lambda: NOW)
    client = await aiohttp_client(app)
    response = await client.get("/readyz")
    assert response.status == 503
    assert source.view is not None
    assert source.view.pending == {"profile/team-a", "profile/team-b"}
    source.view.feeds["team-a"].profile_read(a.profile())
    assert source.view.pending == {"profile/team-b"}
    source.view.feeds["team-b"].profile_read(b.profile())
    assert (await client.get("/readyz")).status == 200
