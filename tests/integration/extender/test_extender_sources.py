"""The extender's informers against a fake API server: list, watch, 410 Gone, errors, restart.

The fake (`kits.fakeapi.FakeCluster`) speaks the API server's wire protocol for
Nodes, Pods (by label selector) and ConfigMaps (by field selector), so `KubernetesSource` runs
unmodified against it, informers and client and all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from extender.sources import KubernetesSource
from extender.view import ClusterView
from inference_policy.base.wire import ENGINE_LABEL as DEPLOYMENT_LABEL
from inference_policy.placing.ledger import HOLDING_PODS_FIELD_SELECTOR, holding_part
from kits import polling
from kits.extenderkit import (
    block,
    bound,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from kits.fakeapi import FakeCluster
from kits.profilekit import NAMESPACE, NOW, Owner
from localcluster.nodes.kwok import FakeNode
from serving.apiserver import from_kubeconfig

PROFILE = "kamiwaza-inference-profiles"


@pytest.fixture
async def cluster() -> Any:
    fake = FakeCluster()
    await fake.start()
    yield fake
    await fake.stop()


async def until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Until `predicate` holds, up to `timeout`; the timeout names the predicate's source line."""
    code = predicate.__code__
    what = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} to hold"
    await polling.eventually(predicate, what=what, timeout=timeout)


def _source(fake: FakeCluster, tmp_path: Path, **kwargs: Any) -> KubernetesSource:
    kubeconfig = str(fake.kubeconfig(tmp_path / "kubeconfig"))
    values: dict[str, Any] = {"watch_seconds": 1, "backoff_seconds": 0.05}
    values.update(kwargs)
    return KubernetesSource([NAMESPACE], from_kubeconfig(kubeconfig), **values)


def _node(name: str, **kwargs: Any) -> dict[str, Any]:
    manifest = FakeNode(name, **kwargs).manifest()
    manifest.pop("apiVersion")
    manifest.pop("kind")
    return manifest


async def test_informers_list_then_follow_watch_events(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    plan = plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole")))
    configmap = owner.sign(envelope)
    configmap["metadata"]["namespace"] = NAMESPACE
    cluster.put("configmaps", configmap)
    cluster.put("nodes", _node("n1", gpus=2))
    first = bound(planned_pod(plan), "n1")
    cluster.put("pods", first)
    unlabelled = bound(planned_pod(plan), "n1")
    del unlabelled["metadata"]["labels"][DEPLOYMENT_LABEL]
    cluster.put("pods", unlabelled)  # not an engine Pod: the label selector leaves it out

    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
    source = _source(cluster, tmp_path)
    await source.start(view)
    try:
        await until(lambda: view.ready)
        assert set(view.nodes) == {"n1"}
        assert view.ledger.used("n1") == {"nvidia.com/gpu": 1}
        assert view.policy.profile is not None and view.policy.verifications == 1
        # The Pod informer keeps what decides what a Pod holds, not its plan or environment.
        [pods] = [i for i in source.informers.informers if i.collection.kind == "Pod"]
        kept = pods.store.get(first["metadata"]["name"])
        assert kept is not None and kept["spec"] == holding_part(first)["spec"]
        assert set(kept["metadata"]) == {"name", "namespace", "uid", "resourceVersion", "labels"}
        # Of the labels, only the deployment the Pod is a replica of (for spreading replicas).
        assert kept["metadata"]["labels"] == {
            DEPLOYMENT_LABEL: first["metadata"]["labels"][DEPLOYMENT_LABEL]
        }

        cluster.put("nodes", _node("n2", gpus=8))
        second = bound(planned_pod(plan), "n1")
        cluster.put("pods", second)
        await until(
            lambda: "n2" in view.nodes and view.ledger.used("n1").get("nvidia.com/gpu") == 2
        )
        cluster.delete("pods", f"{NAMESPACE}/{first['metadata']['name']}")
        cluster.delete("nodes", "/n2")
        await until(lambda: "n2" not in view.nodes)
        await until(lambda: view.ledger.used("n1") == {"nvidia.com/gpu": 1})
        # A Pod is heard of once it is bound: the watch asks for bound, unfinished Pods only.
        pending = planned_pod(plan)
        events = view.events
        cluster.put("pods", pending)
        cluster.put("pods", {**pending, "status": {"phase": "Pending"}})
        running = copy.deepcopy(pending)
        running["spec"]["nodeName"] = "n1"
        running["status"] = {"phase": "Running"}
        cluster.put("pods", running)
        await until(lambda: view.ledger.used("n1") == {"nvidia.com/gpu": 2})
        assert view.events == events + 1
        watched = [q for q in cluster.watch_requests if q.get("labelSelector") == DEPLOYMENT_LABEL]
        assert watched and all(
            q.get("fieldSelector") == HOLDING_PODS_FIELD_SELECTOR for q in watched
        )
        cluster.delete("pods", f"{NAMESPACE}/{pending['metadata']['name']}")
        await until(lambda: view.ledger.used("n1") == {"nvidia.com/gpu": 1})
        # A Pod that terminates leaves the selection: the watch says DELETED, its GPU is free.
        succeeded = copy.deepcopy(second)
        succeeded["status"] = {"phase": "Succeeded"}
        cluster.put("pods", succeeded)
        await until(lambda: view.ledger.used("n1") == {})
        # Re-reading the same profile revision does not verify it again: the watch expires
        # (410 Gone) and the fresh list hands the profile to the view once more (an informer
        # counts a list before its handler runs, in the same step of the loop).
        [profile] = [i for i in source.informers.informers if i.collection.kind == "ConfigMap"]
        lists = profile.lists
        cluster.gone_next["configmaps"] = 1
        await until(lambda: profile.lists > lists)
        assert view.policy.verifications == 1
        cluster.delete("configmaps", f"{NAMESPACE}/{PROFILE}")
        await until(lambda: view.policy.profile is None)
    finally:
        await source.stop()


async def test_gone_and_errors_lead_to_a_fresh_list(cluster: FakeCluster, tmp_path: Path) -> None:
    owner = Owner()
    cluster.put("nodes", _node("n1"))
    cluster.fail_next["pods"] = 2
    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
    source = _source(cluster, tmp_path)
    await source.start(view)
    try:
        await until(lambda: view.ready)
        assert source.errors >= 2
        lists = cluster.lists["nodes"]
        cluster.gone_next["nodes"] = 1
        await until(lambda: cluster.lists["nodes"] > lists)
        # A node that changed while the watch was gone is picked up by the fresh list.
        cluster.put("nodes", _node("n3"))
        await until(lambda: "n3" in view.nodes)
    finally:
        await source.stop()


async def test_a_restarted_extender_rebuilds_the_ledger_from_the_list(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    plan = plan_for(owner, envelope, request(inferenceResources=block("nvidia-vram-share")))
    cluster.put("nodes", _node("l40s", vram_budget=True, vram_gb=48))
    for _ in range(3):
        cluster.put("pods", bound(planned_pod(plan), "l40s"))
    used: list[dict[str, int]] = []
    for _ in range(2):
        view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
        source = _source(cluster, tmp_path)
        await source.start(view)
        try:
            await until(lambda v=view: v.ready)  # type: ignore[misc]
            used.append(dict(view.ledger.used("l40s")))
        finally:
            await source.stop()
    assert used == [{"kamiwaza.ai/vram-gb-gpu-0": 24}] * 2


@pytest.mark.parametrize("follow", [False, True], ids=["pinned", "following revisions"])
async def test_a_profile_the_role_does_not_let_it_read_did_not_arrive(
    cluster: FakeCluster, tmp_path: Path, follow: bool
) -> None:
    # As in the webhook: a 403 on the profile is the owner's install to fix, told in every
    # node's rejection, not an extender that stays unready and fails every scheduling call.
    owner = Owner()
    configmap = owner.sign(fleet_envelope(owner))
    configmap["metadata"]["namespace"] = NAMESPACE
    cluster.put("configmaps", configmap)
    cluster.put("nodes", _node("n1", gpus=2))
    cluster.forbidden.add("configmaps")
    view = ClusterView(owner.settings(follow_revisions=follow), [NAMESPACE], lambda: NOW)
    source = _source(cluster, tmp_path)
    await source.start(view)
    try:
        await until(lambda: view.ready)
        refusal = view.policy.profile_refusal
        assert view.policy.profile is None and refusal is not None
        assert "may not be read (HTTP 403; check the Role)" in refusal.check
        assert f"in namespace {NAMESPACE!r}" in refusal.check
        cluster.forbidden.clear()  # the Role is fixed
        await until(lambda: view.policy.profile is not None)
        assert view.policy.profile_refusal is None
    finally:
        await source.stop()
