"""The extender's informers against a fake API server: list, watch, 410 Gone, errors, restart.

The fake speaks the wire protocol the official client uses (a List with
`metadata.resourceVersion`, then a stream of JSON watch events that ends after
`timeoutSeconds`), for Nodes, Pods (by label selector) and ConfigMaps (by field selector), so
`KubernetesSource` runs unmodified against it, threads and client and all.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from extender.sources import KubernetesSource
from extender.view import ClusterView
from inference_policy.placement import DEPLOYMENT_LABEL
from localcluster.nodes import FakeNode
from serving.kube import kubernetes_api
from tests.integration.extenderkit import (
    block,
    bound,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from tests.profilekit import NAMESPACE, NOW, Owner

PROFILE = "kamiwaza-inference-profiles"


class FakeCluster:
    """Nodes, Pods and ConfigMaps with list and watch, and knobs to make requests fail."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}, "cms": {}}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.watchers: list[tuple[str, asyncio.Queue[dict[str, Any]]]] = []
        self.version = 100
        self.gone_next: dict[str, int] = {}
        self.fail_next: dict[str, int] = {}
        self.lists: dict[str, int] = {"nodes": 0, "pods": 0, "cms": 0}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self._handler("nodes"))
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._handler("pods"))
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps", self._handler("cms"))
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        for _, queue in self.watchers:
            queue.put_nowait({"type": "CLOSE"})
        if self.runner is not None:
            await self.runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "extender", "user": {"token": "t"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "extender"}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        existing = self.objects[kind].get(key)
        meta.setdefault("uid", existing["metadata"]["uid"] if existing else str(uuid.uuid4()))
        self.version += 1
        meta["resourceVersion"] = str(self.version)
        self.objects[kind][key] = obj
        self._notify(kind, {"type": "MODIFIED" if existing else "ADDED", "object": obj})

    def delete(self, kind: str, key: str) -> None:
        obj = copy.deepcopy(self.objects[kind].pop(key))
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._notify(kind, {"type": "DELETED", "object": obj})

    def _notify(self, kind: str, event: dict[str, Any]) -> None:
        self.history.append((self.version, kind, event))
        for watched, queue in self.watchers:
            if watched == kind:
                queue.put_nowait(event)

    def _matches(self, kind: str, obj: dict[str, Any], request: web.Request) -> bool:
        meta = obj["metadata"]
        ns = request.match_info.get("ns")
        if ns is not None and meta.get("namespace") != ns:
            return False
        label = request.query.get("labelSelector")
        if label and label not in (meta.get("labels") or {}):
            return False
        field = request.query.get("fieldSelector", "")
        return not field or meta["name"] == field.removeprefix("metadata.name=")

    def _handler(self, kind: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if self.fail_next.get(kind, 0) > 0:
                self.fail_next[kind] -= 1
                return web.json_response({"kind": "Status", "code": 500}, status=500)
            if request.query.get("watch") in ("true", "1", "True"):
                return await self._watch(kind, request)
            self.lists[kind] += 1
            items = []
            for obj in self.objects[kind].values():
                if self._matches(kind, obj, request):
                    item = copy.deepcopy(obj)
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                    items.append(item)
            return web.json_response(
                {"metadata": {"resourceVersion": str(self.version)}, "items": items}
            )

        return handle

    async def _watch(self, kind: str, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        if self.gone_next.get(kind, 0) > 0:
            self.gone_next[kind] -= 1
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "old"}}
            await response.write(json.dumps(gone).encode() + b"\n")
            return response
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        since = int(request.query.get("resourceVersion") or self.version)
        for version, watched, event in self.history:
            if watched == kind and version > since:
                queue.put_nowait(event)
        entry = (kind, queue)
        self.watchers.append(entry)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(request.query.get("timeoutSeconds", "30"))
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event["type"] == "CLOSE":
                    break
                if self._matches(kind, event["object"], request):
                    await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(entry)
        return response


@pytest.fixture
async def cluster() -> Any:
    fake = FakeCluster()
    await fake.start()
    yield fake
    await fake.stop()


async def until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def _source(fake: FakeCluster, tmp_path: Path, **kwargs: Any) -> KubernetesSource:
    kubeconfig = str(fake.kubeconfig(tmp_path / "kubeconfig"))
    values: dict[str, Any] = {"watch_seconds": 1, "backoff_seconds": 0.05}
    values.update(kwargs)
    return KubernetesSource([NAMESPACE], api_factory=kubernetes_api(kubeconfig), **values)


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
    cluster.put("cms", configmap)
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
        succeeded = copy.deepcopy(second)
        succeeded["status"] = {"phase": "Succeeded"}
        cluster.put("pods", succeeded)
        await until(lambda: view.ledger.used("n1") == {})
        # Re-reading the same profile revision does not verify it again.
        await asyncio.sleep(1.5)
        assert view.policy.verifications == 1
        cluster.delete("cms", f"{NAMESPACE}/{PROFILE}")
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
