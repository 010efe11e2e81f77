"""The shared informer (`serving.informer`) over its aiohttp client, against the fake API server.

We test these aspects:

* a list is read page by page, delivered once whole, and the store equals it;
* managed fields are dropped before an object is stored or delivered;
* a continue token that expires mid-list starts the list over, with nothing delivered twice;
* the watch asks for bookmarks and a timeout, resumes from the last version (a bookmark's
  included) without listing again, and bookmarks are never delivered;
* a 410, as an ERROR event or as an HTTP answer, is a fresh list whose difference is delivered:
  a synthetic DELETED for what went away meanwhile, upserts for what changed;
* a duplicate (same uid and resourceVersion) is not delivered again; a name recreated with a
  new uid is a DELETED then an ADDED;
* failures back off exponentially with jitter, and start over after a list or a healthy stream;
* a watch refused for the server's credentials or Role (401/403) lists again, so the consumer
  it told "may not be read" hears of every object once the read is allowed;
* namespace and cluster scope, label selectors;
* a handler that raises does not stop the informer;
* stopping cancels a blocked watch at once and closes its connection.

Every wait is on a condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from kits.fakeapi import FakeCluster
from kits.polling import eventually
from serving import apiserver
from serving.apiserver import ApiClient, from_kubeconfig
from serving.informer import Collection, Delta, Informer

NODES = Collection("nodes", "Node")


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    fake = FakeCluster()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def client(cluster: FakeCluster, tmp_path: Path) -> AsyncIterator[ApiClient]:
    api = from_kubeconfig(str(cluster.kubeconfig(tmp_path / "kubeconfig")))
    yield api
    await api.close()


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def pod(namespace: str, name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


class Recorder:
    """The deltas an informer delivered, and the store's keys at each completed list."""

    def __init__(self) -> None:
        self.deltas: list[Delta] = []
        self.listed: list[list[str]] = []

    def __call__(self, delta: Delta) -> None:
        self.deltas.append(delta)

    def on_listed(self, informer: Informer) -> None:
        self.listed.append(sorted(informer.store.names()))

    def seen(self, kind: str) -> list[str]:
        return [str(d.object["metadata"]["name"]) for d in self.deltas if d.type == kind]


def informer(
    client: ApiClient, recorder: Recorder, collection: Collection = NODES, **options: Any
) -> Informer:
    values: dict[str, Any] = {"watch_timeout": 30, "backoff": 0.01, "max_backoff": 0.1}
    values.update(options)
    return Informer(client, collection, recorder, on_listed=recorder.on_listed, **values)


async def test_a_list_is_read_in_pages_and_delivered_once_whole(
    cluster: FakeCluster, client: ApiClient
) -> None:
    for i in range(7):
        cluster.put("nodes", node(f"n{i}"))
    recorder = Recorder()
    subject = informer(client, recorder, page_size=3)
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        pages = cluster.list_requests
        assert [p.get("limit") for p in pages] == ["3", "3", "3"]
        assert [p.get("continue") is not None for p in pages] == [False, True, True]
        assert sorted(recorder.seen("ADDED")) == [f"n{i}" for i in range(7)]
        assert all(d.listed for d in recorder.deltas)
        assert recorder.listed == [[f"n{i}" for i in range(7)]]
        # List items come without kind and apiVersion; the informer restores them.
        stored = subject.store.get("n0")
        assert stored is not None and (stored["kind"], stored["apiVersion"]) == ("Node", "v1")
        assert subject.lists == 1 and subject.errors == 0
    finally:
        await subject.stop()


async def test_managed_fields_are_neither_stored_nor_delivered(
    cluster: FakeCluster, client: ApiClient
) -> None:
    fields = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    listed = node("n0")
    listed["metadata"]["managedFields"] = fields
    cluster.put("nodes", listed)
    recorder = Recorder()
    subject = informer(client, recorder)
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        watched = node("n1", zone="a")
        watched["metadata"]["managedFields"] = fields
        cluster.put("nodes", watched)
        await eventually(
            lambda: "n1" in recorder.seen("ADDED"), what="'n1' in recorder.seen('ADDED')"
        )
        for name in ("n0", "n1"):
            stored = subject.store.get(name)
            assert stored is not None and "managedFields" not in stored["metadata"]
        assert all("managedFields" not in d.object["metadata"] for d in recorder.deltas)
        kept = subject.store.get("n1")
        assert kept is not None and kept["metadata"]["labels"] == {"zone": "a"}
    finally:
        await subject.stop()


async def test_a_list_keeps_each_page_before_asking_for_the_next(
    cluster: FakeCluster, client: ApiClient
) -> None:
    """The transform runs on each page as it arrives, once per object, so a long list is never
    held whole (150,000 engine Pods decoded at once would outgrow the extender's memory)."""
    for i in range(7):
        cluster.put("nodes", node(f"n{i}"))
    pages_when_kept: dict[str, int] = {}

    def keep(obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        assert name not in pages_when_kept, f"{name} kept twice"
        pages_when_kept[name] = len(cluster.list_requests)
        return obj

    recorder = Recorder()
    subject = informer(client, recorder, page_size=3, transform=keep)
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        assert [p.get("limit") for p in cluster.list_requests] == ["3", "3", "3"]
        # Pages of n0-n2, n3-n5, n6: each kept while only its own page had been asked for.
        assert pages_when_kept == {f"n{i}": i // 3 + 1 for i in range(7)}
        assert recorder.seen("ADDED") == [f"n{i}" for i in range(7)]
    finally:
        await subject.stop()


async def test_a_transform_decides_what_is_stored_and_delivered(
    cluster: FakeCluster, client: ApiClient
) -> None:
    """Listed, added, modified and deleted objects are all stored and delivered as the
    transform leaves them (the extender keeps a Pod's `holding_part`)."""

    def keep(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {"metadata": {k: meta[k] for k in ("name", "resourceVersion", "uid") if k in meta}}

    cluster.put("nodes", node("n0", zone="a"))
    recorder = Recorder()
    subject = informer(client, recorder, transform=keep)
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        cluster.put("nodes", node("n1", zone="b"))
        cluster.put("nodes", node("n0", zone="c"))
        cluster.delete("nodes", "/n1")
        await eventually(
            lambda: "n1" in recorder.seen("DELETED"), what="'n1' in recorder.seen('DELETED')"
        )
        assert [(d.type, d.object["metadata"]["name"]) for d in recorder.deltas] == [
            ("ADDED", "n0"),
            ("ADDED", "n1"),
            ("MODIFIED", "n0"),
            ("DELETED", "n1"),
        ]
        for delta in recorder.deltas:
            assert set(delta.object) == {"metadata"}
            assert "labels" not in delta.object["metadata"]
        stored = subject.store.get("n0")
        assert stored is not None and stored == keep(stored)
        assert stored["metadata"]["resourceVersion"]
        assert subject.store.names() == ["n0"]
    finally:
        await subject.stop()


async def test_an_expired_continue_token_starts_the_list_over(
    cluster: FakeCluster, client: ApiClient
) -> None:
    for i in range(5):
        cluster.put("nodes", node(f"n{i}"))
    cluster.expire_continue_next = 1
    recorder = Recorder()
    subject = informer(client, recorder, page_size=2)
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        # First page, an expired second page, then the whole list again in three pages.
        tokens = [p.get("continue") is not None for p in cluster.list_requests]
        assert tokens == [False, True, False, True, True]
        assert sorted(recorder.seen("ADDED")) == [f"n{i}" for i in range(5)]
        assert len(recorder.deltas) == 5 and subject.errors == 0 and subject.lists == 1
    finally:
        await subject.stop()


async def test_the_watch_resumes_from_bookmarks_and_never_delivers_them(
    cluster: FakeCluster, client: ApiClient
) -> None:
    cluster.put("nodes", node("n1"))
    recorder = Recorder()
    subject = informer(client, recorder, watch_timeout=30)
    subject.start()
    try:
        await eventually(lambda: len(cluster.watchers) == 1, what="len(cluster.watchers) == 1")
        first = cluster.watch_requests[0]
        assert first["allowWatchBookmarks"] == "true"
        assert first["resourceVersion"] == subject.version
        # Jittered, so that replicas do not all reconnect at once.
        assert 15 <= int(first["timeoutSeconds"]) <= 30
        marked = cluster.bookmark("nodes")
        await eventually(lambda: subject.version == marked, what="subject.version == marked")
        assert len(recorder.deltas) == 1  # the listed n1, nothing for the bookmark
        cluster.close_watches()
        await eventually(
            lambda: len(cluster.watch_requests) == 2, what="len(cluster.watch_requests) == 2"
        )
        assert cluster.watch_requests[1]["resourceVersion"] == marked
        # A resumed watch is not a list, and what changes after it is delivered as it happens.
        cluster.put("nodes", node("n2"))
        await eventually(lambda: "n2" in subject.store, what="'n2' in subject.store")
        assert subject.lists == 1
        assert recorder.deltas[-1].type == "ADDED" and not recorder.deltas[-1].listed
    finally:
        await subject.stop()


@pytest.mark.parametrize("as_status", [False, True], ids=["error-event", "http-410"])
async def test_gone_relists_and_delivers_the_difference(
    cluster: FakeCluster, client: ApiClient, as_status: bool
) -> None:
    for name in ("keep", "change", "vanish"):
        cluster.put("nodes", node(name))
    recorder = Recorder()
    subject = informer(client, recorder)
    subject.start()
    try:
        await eventually(lambda: len(cluster.watchers) == 1, what="len(cluster.watchers) == 1")
        assert recorder.listed == [["change", "keep", "vanish"]]
        # While the watch is away, its version is compacted and the collection changes.
        cluster.quiet = True
        cluster.gone_as_status = as_status
        cluster.gone_next["nodes"] = 1
        cluster.delete("nodes", "/vanish")
        cluster.put("nodes", node("change", colour="blue"))
        cluster.put("nodes", node("new"))
        cluster.close_watches()
        await eventually(lambda: len(recorder.listed) == 2, what="len(recorder.listed) == 2")
        cluster.quiet = False
        after = recorder.deltas[3:]
        assert all(d.listed for d in after)
        assert {(d.type, d.object["metadata"]["name"]) for d in after} == {
            ("DELETED", "vanish"),
            ("MODIFIED", "change"),
            ("ADDED", "new"),
        }
        changed = next(d for d in after if d.type == "MODIFIED")
        assert changed.old is not None and changed.old["metadata"]["labels"] == {}
        assert recorder.listed[-1] == ["change", "keep", "new"]
        assert subject.lists == 2 and subject.errors == 0
        # The watch goes on from the fresh list.
        cluster.delete("nodes", "/keep")
        await eventually(lambda: "keep" not in subject.store, what="'keep' not in subject.store")
        assert recorder.deltas[-1].type == "DELETED" and not recorder.deltas[-1].listed
    finally:
        await subject.stop()


async def test_duplicates_are_skipped_and_a_recreated_name_is_two_objects(
    cluster: FakeCluster, client: ApiClient
) -> None:
    cluster.put("nodes", node("a"))
    cluster.put("nodes", node("b"))
    recorder = Recorder()
    subject = informer(client, recorder, relist_seconds=0, watch_timeout=1)
    subject.start()
    try:
        # relist_seconds=0: every watch that ends is followed by a list of unchanged objects.
        await eventually(lambda: subject.lists >= 3, what="subject.lists >= 3")
        assert sorted(recorder.seen("ADDED")) == ["a", "b"] and len(recorder.deltas) == 2
        old_uid = subject.store.get("a")["metadata"]["uid"]  # type: ignore[index]
        cluster.quiet = True
        cluster.delete("nodes", "/a")
        cluster.put("nodes", node("a"))
        lists = subject.lists
        await eventually(lambda: subject.lists > lists, what="subject.lists > lists")
        cluster.quiet = False
        assert [(d.type, d.object["metadata"]["uid"]) for d in recorder.deltas[2:]] == [
            ("DELETED", old_uid),
            ("ADDED", cluster.objects["nodes"]["/a"]["metadata"]["uid"]),
        ]
    finally:
        await subject.stop()


async def test_failures_back_off_with_jitter_and_start_over_after_success(
    cluster: FakeCluster, client: ApiClient
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    errors: list[int] = []
    cluster.fail_next["nodes"] = 3
    subject = Informer(
        client,
        NODES,
        lambda delta: None,
        on_error=lambda exc: errors.append(getattr(exc, "status", 0)),
        backoff=1.0,
        max_backoff=8.0,
        sleep=sleep,
    )
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        assert errors == [500, 500, 500] and subject.errors == 3
        # Doubling from 1s, each jittered within ±50%.
        assert len(waits) == 3
        for wait, base in zip(waits, (1.0, 2.0, 4.0), strict=True):
            assert 0.5 * base <= wait <= 1.5 * base
        # The list succeeded, so the backoff starts over: a watch closed at once with nothing
        # said waits the base delay (rather than spinning), then two failures double it.
        await eventually(lambda: len(cluster.watchers) == 1, what="len(cluster.watchers) == 1")
        cluster.fail_next["nodes"] = 2
        cluster.close_watches()
        await eventually(
            lambda: len(waits) >= 6 and len(cluster.watchers) == 1,
            what="len(waits) >= 6 and len(cluster.watchers) == 1",
        )
        for wait, base in zip(waits[3:], (1.0, 2.0, 4.0), strict=True):
            assert 0.5 * base <= wait <= 1.5 * base
        # Watch failures resume the watch; they do not list again.
        assert subject.lists == 1 and subject.errors == 5
        # A watch that delivered something was healthy: after it, the delay starts over.
        cluster.put("nodes", node("n1"))
        await eventually(lambda: "n1" in subject.store, what="'n1' in subject.store")
        cluster.fail_next["nodes"] = 1
        cluster.close_watches()
        await eventually(
            lambda: len(waits) >= 7 and len(cluster.watchers) == 1,
            what="len(waits) >= 7 and len(cluster.watchers) == 1",
        )
        assert len(waits) == 7 and 0.5 <= waits[6] <= 1.5
    finally:
        await subject.stop()


async def test_a_refused_watch_lists_again_once_the_read_is_allowed(
    cluster: FakeCluster, client: ApiClient
) -> None:
    # A 401/403 tells the consumer (`on_error`) its objects may not be read; only a list, whose
    # `on_listed` hands them all over again, can tell it they may be once more. A watch that
    # merely resumed would deliver nothing for objects that did not change meanwhile.
    recorder = Recorder()
    refusals: list[int] = []
    cluster.put("nodes", node("n1"))
    subject = informer(
        client, recorder, on_error=lambda exc: refusals.append(getattr(exc, "status", 0))
    )
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        await eventually(lambda: len(cluster.watchers) == 1, what="len(cluster.watchers) == 1")
        cluster.forbidden.add("nodes")
        cluster.close_watches()
        await eventually(lambda: len(refusals) >= 2, what="len(refusals) >= 2")
        assert set(refusals) == {403}
        cluster.forbidden.discard("nodes")
        await eventually(lambda: len(recorder.listed) == 2, what="len(recorder.listed) == 2")
        assert recorder.listed == [["n1"], ["n1"]] and subject.lists == 2
    finally:
        await subject.stop()


async def test_namespace_and_cluster_scope_with_a_label_selector(
    cluster: FakeCluster, client: ApiClient
) -> None:
    cluster.put("pods", pod("a", "p", app="x"))
    cluster.put("pods", pod("b", "p", app="x"))
    cluster.put("pods", pod("a", "unlabelled"))
    recorder_all, in_a = Recorder(), Recorder()
    subjects = [
        informer(client, recorder_all, Collection("pods", "Pod", label_selector="app")),
        informer(client, in_a, Collection("pods", "Pod", "a", label_selector="app")),
    ]
    for subject in subjects:
        subject.start()
    try:
        await eventually(
            lambda: all(s.synced.is_set() for s in subjects),
            what="all(s.synced.is_set() for s in subjects)",
        )
        assert recorder_all.listed == [["a/p", "b/p"]]
        assert in_a.listed == [["p"]]
        cluster.put("pods", pod("b", "q", app="x"))
        await eventually(lambda: "b/q" in subjects[0].store, what="'b/q' in subjects[0].store")
        assert recorder_all.deltas[-1].object["metadata"]["namespace"] == "b"
        assert [d.object["metadata"]["name"] for d in in_a.deltas] == ["p"]
    finally:
        for subject in subjects:
            await subject.stop()


async def test_a_failing_handler_does_not_stop_the_informer(
    cluster: FakeCluster, client: ApiClient
) -> None:
    seen: list[str] = []

    def handler(delta: Delta) -> None:
        seen.append(delta.object["metadata"]["name"])
        raise RuntimeError("a consumer bug")

    subject = Informer(client, NODES, handler, backoff=0.01)
    cluster.put("nodes", node("n1"))
    subject.start()
    try:
        await asyncio.wait_for(subject.synced.wait(), 10)
        cluster.put("nodes", node("n2"))
        await eventually(lambda: seen == ["n1", "n2"], what="seen == ['n1', 'n2']")
        assert subject.store.names() == ["n1", "n2"] and subject.errors == 0
    finally:
        await subject.stop()


async def test_stop_cancels_a_blocked_watch_and_closes_its_connection(
    cluster: FakeCluster, client: ApiClient
) -> None:
    subject = informer(client, Recorder(), watch_timeout=3600)
    task = subject.start()
    await eventually(lambda: len(cluster.watchers) == 1, what="len(cluster.watchers) == 1")
    await asyncio.wait_for(subject.stop(), 2)
    assert task.done() and task.cancelled()
    # The server sees the connection go: its watch handler is cancelled and deregistered.
    await eventually(lambda: not cluster.watchers, timeout=5, what="not cluster.watchers")
    assert len(cluster.watch_requests) == 1


async def test_watch_lines_are_read_whatever_pieces_they_arrive_in(
    aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server's chunks do not follow its lines: one carries several events, an event
    comes in several, blank lines come between. Each event is read whole and once, in order;
    an event past the line limit ends the watch with a TooLarge error."""
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": f"n{i}", "resourceVersion": str(i)}}}
        for i in range(6)
    ]
    lines = [orjson.dumps(e) + b"\n" for e in events]
    big = lines[3]
    pieces = [
        lines[0] + lines[1] + lines[2][:7],  # two whole events and the start of a third
        lines[2][7:],  # the rest of it, ending its line
        b"\n",  # a blank line
        big[:5],
        big[5:11],
        big[11:] + lines[4][:1],  # an event in three pieces, ending mid-chunk
        lines[4][1:] + lines[5],
    ]

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for piece in pieces if request.query.get("labelSelector") != "large" else [b"{" * 64]:
            await response.write(piece)
            # Each piece in its own read: the client must not rely on whole lines per chunk.
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes", watch)
    server = await aiohttp_server(app)
    api = ApiClient(str(server.make_url("")))
    try:
        got = [e.object async for e in api.watch(NODES, resource_version="0", timeout_seconds=5)]
        assert got == [e["object"] for e in events]

        monkeypatch.setattr(apiserver, "MAX_LINE_BYTES", 32)
        large = Collection("nodes", "Node", label_selector="large")
        with pytest.raises(Exception, match="larger than allowed"):
            async for _ in api.watch(large, resource_version="0", timeout_seconds=5):
                pass
    finally:
        await api.close()


async def test_watches_past_the_request_pool_leave_room_for_requests(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    """A server watches one collection per tenant namespace and more; with many tenants its
    watches outnumbered the 32 connections of its request pool, and every list, write and
    review waited until it timed out (the extender never got ready past six tenants). Watches
    have their own pool: with 12 open on a client of 4 connections, a list is answered."""
    options = apiserver.ApiClient.options(str(cluster.kubeconfig(tmp_path / "kubeconfig")))
    api = ApiClient(options.pop("server"), connections=4, timeout=5.0, **options)
    namespaces = [f"team-{i}" for i in range(12)]

    async def hold(namespace: str) -> None:
        async for _ in api.watch(
            Collection("pods", "Pod", namespace), resource_version="", timeout_seconds=60
        ):
            pass

    watches = [asyncio.get_running_loop().create_task(hold(ns)) for ns in namespaces]
    try:
        await eventually(lambda: len(cluster.watchers) == len(namespaces), what="every watch open")
        page = await api.list_page(Collection("nodes", "Node"), limit=10)
        assert page.items == []
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await api.close()


async def test_an_object_written_through_is_kept_as_the_informer_keeps_what_it_delivers(
    cluster: FakeCluster, client: ApiClient
) -> None:
    """A fresh read or a write's answer enters the store through the informer, held to its
    transform (the controller's size cap): a padded Pod read afresh was once judged whole."""
    cluster.put("pods", pod("team-a", "engine"))
    recorder = Recorder()

    def skeleton(obj: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": obj["metadata"], "kept": "skeleton"}

    informer = Informer(client, Collection("pods", "Pod", "team-a"), recorder, transform=skeleton)
    task = asyncio.get_running_loop().create_task(informer.run())
    try:
        await eventually(lambda: informer.store.get("engine"), what="the Pod listed")
        stored = informer.store.get("engine")
        assert stored is not None
        padded = {**stored, "spec": {"padding": "x" * 1024}}
        kept = informer.write_through(padded)
        assert kept == {"metadata": stored["metadata"], "kept": "skeleton"}
        assert informer.store.get("engine") == kept
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
