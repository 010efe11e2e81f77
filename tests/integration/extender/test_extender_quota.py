"""The owner's quota held by the owner's extender: a Pod that would take its tenant past it is
refused on every node (node verdict `quota`, naming the quota, the limit and what is held),
whatever the tenant's webhook let through; Pods the filter passed count until seen bound; a
bound Pod whose engine label was removed still counts; another tenant's Pods are untouched.
First through the HTTP app with the board fed from memory, then with the real informers against
a fake API server."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from extender.app import create_app
from extender.quota import QuotaBoard
from extender.sources import KubernetesSource
from extender.tenants import Tenant
from inference_policy.placing.ledger import HOLDING_PODS_FIELD_SELECTOR
from inference_policy.placing.quota import QUOTA_ANNOTATION, QUOTA_NAME, Usage
from kits import polling
from kits.extenderkit import (
    NAMESPACE,
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
from kits.fakeapi import FakeCluster
from kits.fleetkit import FLEET
from kits.memory_sources import ExtenderMemorySource
from kits.profilekit import NOW, Owner
from localcluster.plane.metrics import metric, parse_metrics
from serving.apiserver import from_kubeconfig
from serving.quota import usage_part

OTHER = "team-b"
NODES = ["h100-8a", "cpu-1"]
GPU = "nvidia.com/gpu"
DEPLOYMENT_LABEL = "kamiwaza.ai/deployment-id"


def quota_object(namespace: str = NAMESPACE, gpus: int | None = 1, **limits: Any) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": QUOTA_NAME,
            "namespace": namespace,
            "annotations": {QUOTA_ANNOTATION: json.dumps({"schemaVersion": 1, **limits})},
        },
        "spec": {"hard": {} if gpus is None else {f"requests.{GPU}": str(gpus)}},
    }


@pytest.fixture
def owner() -> Owner:
    return Owner()


def envelopes(owner: Owner) -> dict[str, dict[str, Any]]:
    """Each tenant's profile: the same fleet, signed for its namespace."""
    first = fleet_envelope(owner)
    other = copy.deepcopy(first)
    other["namespace"] = OTHER
    return {NAMESPACE: first, OTHER: other}


@pytest.fixture
def plans(owner: Owner) -> dict[str, Any]:
    signed = envelopes(owner)
    whole = request(inferenceResources=block("nvidia-whole"))
    return {
        "whole": plan_for(owner, signed[NAMESPACE], whole),
        "other": plan_for(owner, signed[OTHER], whole, namespace=OTHER),
        "cpu": plan_for(owner, signed[NAMESPACE], request(config__force_cpu=True)),
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def quota_app(
    aiohttp_client: AiohttpClient, owner: Owner, clock: Clock
) -> tuple[TestClient[Any, Any], QuotaBoard, web.Application]:
    """The extender for two tenants (the same owner key), fed from memory, holding Pods to
    the quotas in the board the test feeds."""
    signed = envelopes(owner)
    source = ExtenderMemorySource(
        [n.manifest() for n in FLEET],
        (),
        profiles={ns: published(owner.sign(envelope)) for ns, envelope in signed.items()},
    )
    settings = owner.settings(scheduler_name=SCHEDULER)
    tenants = [
        Tenant(settings),
        Tenant(owner.settings(namespace=OTHER, scheduler_name=SCHEDULER)),
    ]
    board = QuotaBoard([NAMESPACE, OTHER], monotonic=clock)
    app = create_app(settings, source, clock=lambda: NOW, tenants=tenants, quota=board)
    return await aiohttp_client(app), board, app


async def post(client: TestClient[Any, Any], body: Any) -> Any:
    response = await client.post(
        "/filter", data=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status == 200, await response.text()
    return await response.json()


def read(board: QuotaBoard, namespace: str, quota: Any, pods: dict[str, Any]) -> None:
    tenant = board.tenants[namespace]
    tenant.quota_changed(quota)
    tenant.pods_listed({name: usage_part(pod) for name, pod in pods.items()})


async def test_a_pod_past_its_tenants_quota_passes_no_node_and_the_other_tenant_is_untouched(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    clock = Clock()
    client, board, _ = await quota_app(aiohttp_client, owner, clock)
    # Until the quota and the Pods are read: unready, and engine Pods are retried.
    ready = await client.get("/readyz")
    assert ready.status == 503 and f"quota/{NAMESPACE}" in (await ready.json())["detail"]
    read(board, NAMESPACE, quota_object(gpus=1), {})
    read(board, OTHER, None, {})
    assert (await client.get("/readyz")).status == 200

    first = planned_pod(plans["whole"], name="first")
    assert (await post(client, cache_args(first, NODES)))["NodeNames"] == ["h100-8a"]
    # Passed, not yet seen bound: the next Pod's filter counts it.
    second = planned_pod(plans["whole"], name="second")
    refused = await post(client, cache_args(second, NODES))
    assert refused["NodeNames"] == [] and not refused["FailedNodes"]
    reason = (
        f"namespace {NAMESPACE} would pass the owner's quota {QUOTA_NAME} "
        f"({GPU} devices: limit 1, held now 1, this Pod asks 1)"
    )
    assert refused["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, reason)
    # The first is filtered again (a retry): its own hold does not count against it.
    assert (await post(client, cache_args(first, NODES)))["NodeNames"] == ["h100-8a"]
    # Seen bound: its hold goes and its usage counts in its place.
    board.tenants[NAMESPACE].pod_changed("first", usage_part(bound(first, "h100-8a")))
    assert (await post(client, cache_args(second, NODES)))["FailedAndUnresolvableNodes"]
    # The other tenant has no quota: its Pods place as before.
    other = planned_pod(plans["other"], name="b", namespace=OTHER)
    assert (await post(client, cache_args(other, NODES)))["NodeNames"] == ["h100-8a"]
    # A CPU engine Pod asks no device, and no engine-Pod limit is set.
    cpu = planned_pod(plans["cpu"], name="cpu")
    assert (await post(client, cache_args(cpu, NODES)))["NodeNames"]
    # The first ends: the second fits.
    board.tenants[NAMESPACE].pod_changed("first", None)
    assert (await post(client, cache_args(second, NODES)))["NodeNames"] == ["h100-8a"]
    text = await (await client.get("/metrics")).text()
    assert metric(parse_metrics(text), "tmi_extender_node_verdicts_total", code="quota") == 4


async def test_a_hold_lapses_when_the_pod_is_never_seen_bound(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    clock = Clock()
    client, board, _ = await quota_app(aiohttp_client, owner, clock)
    read(board, NAMESPACE, quota_object(gpus=None, enginePods=1), {})
    read(board, OTHER, None, {})
    assert (await post(client, cache_args(planned_pod(plans["whole"]), NODES)))["NodeNames"]
    later = planned_pod(plans["cpu"], name="later")
    answer = await post(client, cache_args(later, NODES))
    assert "enginePods: limit 1, held now 1, this Pod asks 1" in next(
        iter(answer["FailedAndUnresolvableNodes"].values())
    )
    clock.now += board.hold_seconds + 1
    assert (await post(client, cache_args(later, NODES)))["NodeNames"]


async def test_a_bound_pod_whose_engine_label_was_removed_still_counts(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    clock = Clock()
    client, board, _ = await quota_app(aiohttp_client, owner, clock)
    held = bound(planned_pod(plans["whole"]), "h100-8a")
    del held["metadata"]["labels"][DEPLOYMENT_LABEL]
    read(
        board,
        NAMESPACE,
        quota_object(gpus=None, bindings={plans["whole"]["bindingId"]: 1}),
        {held["metadata"]["name"]: held},
    )
    read(board, OTHER, None, {})
    answer = await post(client, cache_args(planned_pod(plans["whole"]), NODES))
    (reason,) = set(answer["FailedAndUnresolvableNodes"].values())
    assert f"binding {plans['whole']['bindingId']} devices: limit 1, held now 1" in reason


async def test_a_quota_the_extender_cannot_read_places_no_engine_pod_of_its_tenant(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    clock = Clock()
    client, board, _ = await quota_app(aiohttp_client, owner, clock)
    malformed = quota_object()
    malformed["metadata"]["annotations"][QUOTA_ANNOTATION] = '{"borrowing": true}'
    read(board, NAMESPACE, malformed, {})
    board.tenants[OTHER].quota_changed(None, "may not be read (HTTP 403; check the Role)")
    board.tenants[OTHER].pods_listed({})
    answer = await post(client, cache_args(planned_pod(plans["whole"]), NODES))
    (reason,) = set(answer["FailedAndUnresolvableNodes"].values())
    assert "the owner's quota cannot be judged" in reason and "borrowing" in reason
    # A read the extender's Role refuses is its own trouble: an Error, retried.
    other = planned_pod(plans["other"], namespace=OTHER)
    answer = await post(client, cache_args(other, NODES))
    assert not answer["NodeNames"] and not answer["FailedAndUnresolvableNodes"]
    assert "ResourceQuota tmi-quota may not be read (HTTP 403" in answer["Error"]
    # A Pod without a plan is not an engine Pod: untouched.
    plain = planned_pod(None, resources={"requests": {"cpu": "1"}})
    assert (await post(client, cache_args(plain, NODES)))["NodeNames"] == NODES


# -- the informers, against a fake API server ---------------------------------------------------


@pytest.fixture
async def cluster() -> Any:
    fake = FakeCluster()
    await fake.start()
    yield fake
    await fake.stop()


async def until(predicate: Callable[[], bool]) -> None:
    await polling.eventually(predicate, what="the board to follow the API", timeout=15.0)


async def test_the_source_reads_the_quota_and_every_bound_pod_of_each_tenant(
    cluster: FakeCluster, tmp_path: Path, owner: Owner, plans: dict[str, Any]
) -> None:
    quota = quota_object(gpus=4, enginePods=3)
    cluster.put("resourcequotas", quota)
    unlabelled = bound(planned_pod(plans["whole"]), "h100-8a")
    del unlabelled["metadata"]["labels"][DEPLOYMENT_LABEL]
    cluster.put("pods", unlabelled)
    cluster.put("pods", planned_pod(plans["whole"]))  # Pending: holds nothing yet
    finished = bound(planned_pod(plans["whole"]), "h100-8a", phase="Succeeded")
    cluster.put("pods", finished)
    board = QuotaBoard([NAMESPACE])
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    source = KubernetesSource(
        [NAMESPACE], from_kubeconfig(kubeconfig), watch_seconds=1, backoff_seconds=0.05, quota=board
    )
    from extender.view import ClusterView

    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
    await source.start(view)
    tenant = board.tenants[NAMESPACE]
    try:
        await until(lambda: tenant.ready)
        assert tenant.quota is not None and tenant.quota.engine_pods == 3
        assert tenant.usage.total() == Usage({GPU: 1}, {plans["whole"]["bindingId"]: 1}, 0, 1)
        # What the informer keeps of a Pod: its identity and its usage.
        [pods] = [
            i
            for i in source.informers.informers
            if i.collection.kind == "Pod" and not i.collection.label_selector
        ]
        assert pods.collection.field_selector == HOLDING_PODS_FIELD_SELECTOR
        kept = pods.store.get(unlabelled["metadata"]["name"])
        assert kept is not None and set(kept) == {"apiVersion", "kind", "metadata", "usage"}
        assert set(kept["usage"]) == {"devices", "bindings", "enginePods"}
        cluster.put("pods", bound(planned_pod(plans["whole"]), "h100-8b"))
        await until(lambda: tenant.usage.total().engine_pods == 2)
        quota["metadata"]["annotations"][QUOTA_ANNOTATION] = json.dumps({"enginePods": 1})
        cluster.put("resourcequotas", quota)
        await until(lambda: tenant.quota is not None and tenant.quota.engine_pods == 1)
        cluster.delete("resourcequotas", f"{NAMESPACE}/{QUOTA_NAME}")
        await until(lambda: tenant.quota is None)
    finally:
        await source.stop()
