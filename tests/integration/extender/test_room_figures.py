"""Spill across device-plugin bindings, the servers' part: the extender writes each tenant's room
figures into its namespace (`extender.room_publisher`), and the webhook reads them and plans the
smallest compatible binding with room (`webhook.profile_source`).

Both run their real informers and API client against the fake API servers; what the figures
mean and how a choice is made and replayed is `tests/unit/core/planning/test_room.py`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from extender.sources import KubernetesSource as ExtenderSource
from extender.view import ClusterView
from inference_policy.base.wire import REQUEST_ANNOTATION
from inference_policy.granting.grant import _rederive
from inference_policy.planning.plan import parse_plan
from inference_policy.planning.room import (
    ROOM_CONFIGMAP,
    ROOM_KEY,
    SMALLEST,
    WITH_ROOM,
    parse_figures,
)
from kits import polling
from kits.extenderkit import (
    MIG,
    SHARE,
    WHOLE,
    bound,
    fleet_envelope,
    plan_for,
    planned_pod,
)
from kits.fakeapi import FakeApiServer, FakeCluster
from kits.fleetkit import a100_mig, l40s
from kits.profilekit import NAMESPACE, NOW, Owner, request
from localcluster.nodes.kwok import FakeNode
from serving.apiserver import from_kubeconfig
from webhook.profile_source import KubernetesSource as WebhookSource
from webhook.profile_source import PolicyStore


async def until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    code = check.__code__
    what = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} to hold"
    await polling.eventually(check, what=what, timeout=timeout)


def _manifest(node: FakeNode) -> dict[str, Any]:
    manifest = node.manifest()
    manifest.pop("apiVersion")
    manifest.pop("kind")
    return manifest


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the extender writes them -------------------------------------------------------------------


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    fake = FakeCluster()
    await fake.start()
    yield fake
    await fake.stop()


def _published(cluster: FakeCluster) -> dict[str, Any] | None:
    configmap = cluster.objects["configmaps"].get(f"{NAMESPACE}/{ROOM_CONFIGMAP}")
    if configmap is None:
        return None
    figures = parse_figures(configmap["data"][ROOM_KEY])
    return {k: (v.free, v.largestOnNode) for k, v in figures.bindings.items()}


async def test_the_extender_writes_each_bindings_room_and_rewrites_it_as_pods_bind(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    configmap = owner.sign(envelope)
    configmap["metadata"]["namespace"] = NAMESPACE
    cluster.put("configmaps", configmap)
    cluster.put("nodes", _manifest(a100_mig("a100", gpus=1, slices=2)))
    cluster.put("nodes", _manifest(l40s("l40s")))
    now = [NOW]
    view = ClusterView(owner.settings(), [NAMESPACE], lambda: now[0])
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    source = ExtenderSource(
        [NAMESPACE], from_kubeconfig(kubeconfig), watch_seconds=1, room_seconds=0.05
    )
    await source.start(view)
    try:
        await until(lambda: _published(cluster) is not None)
        # Two MIG slices on one node, one L40S's 48 GB budget, no whole GPU.
        assert _published(cluster) == {MIG: (2, 2), SHARE: (48, 48), WHOLE: (0, 0)}
        # Absent at first: the update by name found nothing, so it was created.
        assert cluster.writes[:2] == [
            ("PUT", NAMESPACE, ROOM_CONFIGMAP),
            ("POST", NAMESPACE, ROOM_CONFIGMAP),
        ]
        stored = cluster.objects["configmaps"][f"{NAMESPACE}/{ROOM_CONFIGMAP}"]
        figures = parse_figures(stored["data"][ROOM_KEY])
        assert figures.bundle == view.feed.snapshot.profile.sha256  # type: ignore[union-attr]
        assert figures.observedAt == _stamp(NOW)

        # Both slices taken: the next write says so, as an update.
        mig = plan_for(owner, envelope, request())
        assert mig["bindingId"] == MIG
        for _ in range(2):
            cluster.put("pods", bound(planned_pod(mig), "a100"))
        await until(lambda: (_published(cluster) or {}).get(MIG) == (0, 0))
        assert cluster.writes[-1] == ("PUT", NAMESPACE, ROOM_CONFIGMAP)

        # Unchanged figures are not written again until they are due for a refresh.
        room = source.room
        assert room is not None
        writes, ticks = len(cluster.writes), room.ticks
        await until(lambda: room.ticks >= ticks + 5)
        assert len(cluster.writes) == writes
        now[0] = NOW + timedelta(seconds=31)
        await until(lambda: len(cluster.writes) > writes)
        figures = parse_figures(
            cluster.objects["configmaps"][f"{NAMESPACE}/{ROOM_CONFIGMAP}"]["data"][ROOM_KEY]
        )
        assert figures.observedAt == _stamp(NOW + timedelta(seconds=31))

        # A failed write is tried again at the next tick.
        cluster.fail_writes = 1
        cluster.delete("pods", next(k for k in cluster.objects["pods"]))
        await until(lambda: (_published(cluster) or {}).get(MIG) == (1, 1))
        assert source.room is not None and source.room.failures == 1
    finally:
        await source.stop()


async def test_no_figures_are_written_without_a_verified_profile_or_when_turned_off(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    owner = Owner()
    cluster.put("nodes", _manifest(l40s("l40s")))
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
    source = ExtenderSource(
        [NAMESPACE], from_kubeconfig(kubeconfig), watch_seconds=1, room_seconds=0.05
    )
    await source.start(view)
    try:
        await until(lambda: view.ready)
        room = source.room
        assert room is not None
        # Several ticks pass with the profile absent (refused): nothing is published.
        ticks = room.ticks
        await until(lambda: room.ticks >= ticks + 5)
        assert room.writes == 0 and cluster.writes == []
    finally:
        await source.stop()
    off = ExtenderSource([NAMESPACE], from_kubeconfig(kubeconfig), room_seconds=0)
    await off.start(ClusterView(owner.settings(), [NAMESPACE], lambda: NOW))
    try:
        assert off.room is None
    finally:
        await off.stop()


# -- the webhook reads them ---------------------------------------------------------------------


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(NAMESPACE)
    await server.start()
    yield server
    await server.stop()


def _room_configmap(bundle: str, at: datetime, mig: int, share: int) -> dict[str, Any]:
    figures = {
        "schemaVersion": 1,
        "bundle": bundle,
        "observedAt": _stamp(at),
        "bindings": {
            MIG: {"free": mig, "largestOnNode": mig},
            SHARE: {"free": share, "largestOnNode": share},
            WHOLE: {"free": 0, "largestOnNode": 0},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ROOM_CONFIGMAP},
        "data": {ROOM_KEY: json.dumps(figures)},
    }


def _planned(store: PolicyStore, now: datetime) -> dict[str, Any]:
    planned = store.plan_text(json.dumps(request()), "request", now, 65536)
    assert planned.decision is not None and planned.decision.allowed, planned
    body: dict[str, Any] = planned.decision.body
    return body


async def test_the_webhook_plans_the_smallest_binding_with_room_and_falls_back_when_it_cannot(
    api: FakeApiServer, tmp_path: Path
) -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    api.put(owner.sign(envelope))
    now = [NOW]
    store = PolicyStore(owner.settings(), clock=lambda: now[0])
    client = from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
    source = WebhookSource(NAMESPACE, client, 30, backoff_seconds=0.05)
    await source.start(store)
    try:
        await until(lambda: store.ready and store.state.profile is not None)
        sha = store.state.profile.sha256  # type: ignore[union-attr]
        # Nothing published: the smallest binding that fits, and no choice recorded.
        before = _planned(store, NOW)
        assert before["bindingId"] == MIG and "choice" not in before

        # The MIG slices are full: the next compatible binding, the L40S share, with the
        # choice recorded; the answer remembered before the figures is not reused.
        api.put(_room_configmap(sha, NOW, mig=0, share=48))
        await until(lambda: store.room_figures is not None)
        spilled = _planned(store, NOW)
        assert spilled["bindingId"] == SHARE
        assert spilled["choice"] == {"rule": WITH_ROOM, "passed": [MIG]}
        # The grant check replays the recorded choice to this very plan.
        profile = store.state.profile
        assert profile is not None
        plan = parse_plan(json.dumps(spilled))
        pod = {
            "metadata": {
                "creationTimestamp": _stamp(NOW),
                "annotations": {REQUEST_ANNOTATION: json.dumps(request())},
            }
        }
        assert _rederive(pod, plan, profile, store.feed.snapshot.context(NOW), NOW) is None

        # Room again on the slices: the smallest, chosen with room.
        api.put(_room_configmap(sha, NOW, mig=1, share=48))
        await until(lambda: _planned(store, NOW)["bindingId"] == MIG)
        assert _planned(store, NOW)["choice"] == {"rule": WITH_ROOM, "passed": []}

        # Stale figures (older than 90 s) are not used: the smallest that fits, said so.
        api.put(_room_configmap(sha, NOW, mig=0, share=48))
        await until(lambda: _planned(store, NOW)["bindingId"] == SHARE)
        stale = _planned(store, NOW + timedelta(seconds=91))
        assert stale["bindingId"] == MIG and stale["choice"] == {"rule": SMALLEST, "passed": []}

        # Figures for another profile revision, or that cannot be read: the same fallback.
        api.put(_room_configmap("0" * 64, NOW, mig=0, share=48))
        await until(lambda: _planned(store, NOW)["bindingId"] == MIG)
        assert _planned(store, NOW)["choice"]["rule"] == SMALLEST
        broken = _room_configmap(sha, NOW, mig=0, share=48)
        broken["data"][ROOM_KEY] = '{"schemaVersion": 1, "bindings": []}'
        api.put(broken)
        await until(lambda: store.room_unreadable is not None)
        assert "tmi-binding-room room.json is not room figures" in str(store.room_unreadable)
        assert _planned(store, NOW)["choice"]["rule"] == SMALLEST

        # Deleted: as if never published.
        api.delete(ROOM_CONFIGMAP)
        await until(lambda: store.room_unreadable is None and store.room_figures is None)
        assert "choice" not in _planned(store, NOW)
    finally:
        await source.stop()


async def test_a_room_the_role_does_not_let_the_webhook_read_falls_back_and_says_why(
    api: FakeApiServer, tmp_path: Path
) -> None:
    owner = Owner()
    api.put(owner.sign(fleet_envelope(owner)))
    api.forbidden.add(ROOM_CONFIGMAP)
    store = PolicyStore(owner.settings(), clock=lambda: NOW)
    client = from_kubeconfig(str(api.kubeconfig(tmp_path / "kubeconfig")))
    source = WebhookSource(NAMESPACE, client, 30, backoff_seconds=0.05)
    await source.start(store)
    try:
        await until(lambda: store.room_unreadable is not None)
        # Ready all the same: the room only steers which compatible binding is asked for.
        assert store.ready
        assert (
            store.room_unreadable == f"{ROOM_CONFIGMAP} may not be read (HTTP 403; check the Role)"
        )
        body = _planned(store, NOW)
        assert body["bindingId"] == MIG and body["choice"] == {"rule": SMALLEST, "passed": []}
    finally:
        await source.stop()
