"""One extender for two tenant namespaces, each with its own owner key and profile.

Seed 002's lab is two tenants sharing GPU nodes through one scheduler: the extender checks each
Pod against its own namespace's signed profile, and accounts every tenant's bound Pods on a
node together, so a node two tenants share is never over-committed. A Pod planned under one
tenant's profile is not placed in the other's namespace, and a planned Pod in no tenant
namespace is placed nowhere. An accounted share, which does not isolate, is kept off a GPU where
another tenant's share sits, unless both tenants' profiles let their shares cross tenants.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from extender.app import create_app
from extender.tenants import Tenant
from inference_policy.placing.nodes import NodeFacts
from inference_policy.placing.room_figures import figures_with
from kits.extenderkit import (
    SCHEDULER,
    SHARE,
    block,
    bound,
    cache_args,
    fleet_envelope,
    full_args,
    plan_for,
    planned_pod,
    published,
    request,
)
from kits.fleetkit import h100, l40s
from kits.memory_sources import ExtenderMemorySource as MemorySource
from kits.profilekit import NOW, Owner

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


# -- one tenant per accounted-share GPU (inference_policy.placing.tenancy)
# ------------------------------

SHARE_NODE = l40s("shared-l40s")


def _trusting(team: Team) -> None:
    """The owner lets the team's L40S shares sit beside other tenants' (re-signed)."""
    for profile in team.envelope["profiles"]:
        for binding in profile["bindings"]:
            if binding["id"] == SHARE:
                binding["sharing"] = {"acrossTenants": True}


def _share_pod(team: Team) -> dict[str, Any]:
    document = request(inferenceResources=block("nvidia-vram-share"))
    plan = plan_for(team.owner, team.envelope, document, namespace=team.namespace)
    return planned_pod(plan, namespace=team.namespace)


async def _share_client(
    aiohttp_client: AiohttpClient, teams: list[Team], pods: list[dict[str, Any]]
) -> tuple[TestClient[Any, Any], MemorySource]:
    source = MemorySource(
        [SHARE_NODE.manifest()], pods, profiles={t.namespace: t.profile() for t in teams}
    )
    tenants = [t.tenant for t in teams]
    app = create_app(tenants[0].policy, source, tenants=tenants, clock=lambda: NOW)
    return await aiohttp_client(app), source


async def _share_filter(
    client: TestClient[Any, Any], pod: dict[str, Any], *, full: bool = False
) -> dict[str, Any]:
    args = full_args(pod, [SHARE_NODE.manifest()]) if full else cache_args(pod, [SHARE_NODE.name])
    response = await client.post("/filter", data=json.dumps(args))
    assert response.status == 200, await response.text()
    result: dict[str, Any] = await response.json()
    assert result["Error"] == ""
    return result


def _passed(result: dict[str, Any]) -> bool:
    if result["NodeNames"] is not None:
        return bool(result["NodeNames"] == [SHARE_NODE.name])
    return [n["metadata"]["name"] for n in result["Nodes"]["items"]] == [SHARE_NODE.name]


async def test_a_share_is_kept_off_a_gpu_where_another_tenant_holds_one(
    aiohttp_client: AiohttpClient,
) -> None:
    """The L40S's one GPU holds team-a's share, with room to spare: team-a's next share fits,
    team-b's does not, in either of the scheduler's modes, and the reason names the GPU and
    "another tenant", never team-a."""
    a, b = Team("team-a"), Team("team-b")
    client, _ = await _share_client(aiohttp_client, [a, b], [bound(_share_pod(a), SHARE_NODE.name)])
    for full in (False, True):
        assert _passed(await _share_filter(client, _share_pod(a), full=full))
        result = await _share_filter(client, _share_pod(b), full=full)
        assert not _passed(result)
        assert result["FailedAndUnresolvableNodes"] == {}
        reason = result["FailedNodes"][SHARE_NODE.name]
        assert reason.startswith("another tenant holds an accounted share on GPU 0"), reason
        assert "team-a" not in reason


async def test_the_remembered_verdict_follows_the_other_tenants_pods_and_trust(
    aiohttp_client: AiohttpClient,
) -> None:
    """A node's verdict for team-b's share is remembered per tenant and trust: it changes when
    team-a's share leaves or comes back (the ledger moved) and when team-a's profile comes to
    trust other tenants (nothing bound moved; the feeds did)."""
    a, b = Team("team-a"), Team("team-b")
    _trusting(b)
    held = bound(_share_pod(a), SHARE_NODE.name)
    client, source = await _share_client(aiohttp_client, [a, b], [held])
    pod = _share_pod(b)
    assert not _passed(await _share_filter(client, pod))
    source.delete_pod(f"{a.namespace}/{held['metadata']['name']}")
    assert _passed(await _share_filter(client, pod))
    source.put_pod(held)
    assert not _passed(await _share_filter(client, pod))
    # The owner now trusts team-a's shares with others too: both sides say so.
    _trusting(a)
    assert source.view is not None
    source.view.feeds[a.namespace].profile_read(published(a.owner.sign(a.envelope), "1002"))
    assert _passed(await _share_filter(client, pod))
    # team-a's own Pods are still judged under its revision; the rule is the same both ways.
    assert _passed(await _share_filter(client, _share_pod(a)))


async def test_room_figures_leave_out_a_gpu_another_tenant_holds(
    aiohttp_client: AiohttpClient,
) -> None:
    """What the extender publishes for team-b's webhook: no room on the GPU team-a holds, so
    the webhook plans team-b's next share on another binding's GPU."""
    a, b = Team("team-a"), Team("team-b")
    client, source = await _share_client(
        aiohttp_client, [a, b], [bound(_share_pod(a), SHARE_NODE.name)]
    )
    assert (await client.get("/readyz")).status == 200
    view = source.view
    assert view is not None
    names = list(view.nodes)
    facts: list[NodeFacts | None] = list(view.nodes.values())

    def frees(demand: Any) -> list[int | None]:
        return view.frees(demand, names, facts)[0]

    for team, room in ((a, 48 - 8), (b, 0)):
        profile = view.feeds[team.namespace].snapshot.profile
        assert profile is not None
        figures = figures_with(profile.envelope, profile.sha256, frees, NOW)
        assert figures.largest[SHARE] == room, team.namespace
