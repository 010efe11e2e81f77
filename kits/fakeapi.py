"""Fake API servers for list and watch: ConfigMaps by name for the webhook, a small cluster for the
extender and the informer's own tests.

They speak the API server's wire protocol (a List with `metadata.resourceVersion`, paged with
`limit` and `continue`, then a watch stream of JSON lines with bookmarks that ends after
`timeoutSeconds`; label and field selectors, an object that enters or leaves a watch's selection
sent as ADDED or DELETED), so the informer and its `ApiClient` run unmodified against them. Tests
change objects with `put`/`delete`, which bump the resource version and notify open watches, and
can make the next requests fail, expire a watch (as an ERROR event or an HTTP 410) or a continue
token, hold changes back from open watches (`quiet`), send bookmarks and end every watch.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

Queued = tuple[dict[str, Any], dict[str, Any] | None]

TOKEN = "test-token"

# Kind -> (path of the collection, kind of its List).
KINDS = {
    "nodes": ("/api/v1/nodes", "NodeList"),
    "pods": ("/api/v1/namespaces/{ns}/pods", "PodList"),
    "configmaps": ("/api/v1/namespaces/{ns}/configmaps", "ConfigMapList"),
    "resourcequotas": ("/api/v1/namespaces/{ns}/resourcequotas", "ResourceQuotaList"),
}
# Namespaced kinds listed across every namespace.
ALL_NAMESPACES = {"pods": "/api/v1/pods"}


class _FakeApi:
    """Objects of the kinds in `KINDS`, keyed `namespace/name`, with list and watch.

    Subclasses say which requests fail (`_refusal`), which watches end in 410 Gone (`_gone`),
    and count lists and watches (`_listed`, `_watched`).
    """

    def __init__(self, user: str) -> None:
        self.user = user
        self.objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self.version = 100
        # Each event is queued and kept with the object as it was before (None for a new one).
        self.watchers: list[tuple[str, asyncio.Queue[Queued]]] = []
        self.history: list[tuple[int, str, dict[str, Any], dict[str, Any] | None]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""
        # The query of every list and watch request, in order.
        self.list_requests: list[dict[str, str]] = []
        self.watch_requests: list[dict[str, str]] = []
        self.expire_continue_next = 0
        self.gone_as_status = False
        self.quiet = False

    async def start(self) -> None:
        app = web.Application()
        for kind, (path, _) in KINDS.items():
            app.router.add_get(path, self._handler(kind))
        for kind, path in ALL_NAMESPACES.items():
            app.router.add_get(path, self._handler(kind))
        self._routes(app)
        # A client that goes away cancels its watch here, as the real server notices it.
        self.runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        self.close_watches()
        if self.runner is not None:
            await self.runner.cleanup()

    def close_watches(self) -> None:
        """End every open watch, as an API server restart (or a load balancer) does."""
        for _, queue in self.watchers:
            queue.put_nowait(({"type": "CLOSE"}, None))

    def bookmark(self, kind: str) -> str:
        """Move the resource version on (as writes elsewhere do) and send a bookmark carrying it
        to the open watches of `kind` that asked for bookmarks; returns that version."""
        version = self._bump()
        mark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}
        for watched, queue in self.watchers:
            if watched == kind:
                queue.put_nowait((mark, None))
        return version

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": self.user, "user": {"token": TOKEN}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": self.user}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def _put(self, kind: str, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        existing = self.objects[kind].get(key)
        meta.setdefault("uid", existing["metadata"]["uid"] if existing else str(uuid.uuid4()))
        meta["resourceVersion"] = self._bump()
        self.objects[kind][key] = obj
        event = {"type": "MODIFIED" if existing else "ADDED", "object": obj}
        # The object before, kept beside the event (never sent): a watch with a field selector
        # needs it to tell an object entering or leaving its selection.
        self._notify(kind, event, existing)

    def _delete(self, kind: str, key: str) -> None:
        obj = copy.deepcopy(self.objects[kind].pop(key))
        obj["metadata"]["resourceVersion"] = self._bump()
        self._notify(kind, {"type": "DELETED", "object": obj})

    def _notify(
        self, kind: str, event: dict[str, Any], before: dict[str, Any] | None = None
    ) -> None:
        self.history.append((self.version, kind, event, before))
        if self.quiet:
            return
        for watched, queue in self.watchers:
            if watched == kind:
                queue.put_nowait((event, before))

    def _routes(self, app: web.Application) -> None:
        """Routes a subclass adds besides list and watch."""

    def _refusal(self, kind: str, request: web.Request) -> web.Response | None:
        return None

    def _gone(self, kind: str) -> bool:
        return False

    def _listed(self, kind: str) -> None:
        pass

    def _watched(self, kind: str) -> None:
        pass

    @staticmethod
    def _matches(obj: dict[str, Any], request: web.Request) -> bool:
        meta = obj["metadata"]
        ns = request.match_info.get("ns")
        if ns is not None and meta.get("namespace") != ns:
            return False
        label = request.query.get("labelSelector")
        if label:
            # `key` (exists) or `key=value`, the two forms the servers send.
            key, _, value = label.partition("=")
            labels = meta.get("labels") or {}
            if key not in labels or (value and labels[key] != value):
                return False
        return _fields_match(obj, request.query.get("fieldSelector", ""))

    def _handler(self, kind: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            refusal = self._refusal(kind, request)
            if refusal is not None:
                return refusal
            if request.query.get("watch") in ("true", "1", "True"):
                return await self._watch(kind, request)
            self.list_requests.append(dict(request.query))
            token = request.query.get("continue")
            if token and self.expire_continue_next > 0:
                self.expire_continue_next -= 1
                return _failure(410, reason="Expired", message="continue token too old")
            if not token:
                self._listed(kind)
            # A continue token carries the version its list was made at, and where it stopped.
            version, _, offset = token.partition(":") if token else (str(self.version), "", "0")
            items = []
            for key in sorted(self.objects[kind]):
                obj = self.objects[kind][key]
                if self._matches(obj, request):
                    item = copy.deepcopy(obj)
                    # Items of a List carry no kind or apiVersion on the wire.
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                    items.append(item)
            start = int(offset)
            limit = int(request.query.get("limit") or 0) or len(items) + 1
            metadata = {"resourceVersion": version}
            if start + limit < len(items):
                metadata["continue"] = f"{version}:{start + limit}"
            return web.json_response(
                {
                    "kind": KINDS[kind][1],
                    "apiVersion": "v1",
                    "metadata": metadata,
                    "items": items[start : start + limit],
                }
            )

        return handle

    async def _watch(self, kind: str, request: web.Request) -> web.StreamResponse:
        self._watched(kind)
        self.watch_requests.append(dict(request.query))
        if self.gone_as_status and self._gone(kind):
            return _failure(410, reason="Expired", message="too old resource version")
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        if not self.gone_as_status and self._gone(kind):
            gone = {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"},
            }
            await response.write(json.dumps(gone).encode() + b"\n")
            return response
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        # Like the real server: replay what happened after the version the client listed at.
        since = int(request.query.get("resourceVersion") or self.version)
        for version, watched, event, before in self.history:
            if watched == kind and version > since:
                queue.put_nowait((event, before))
        entry = (kind, queue)
        self.watchers.append(entry)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(request.query.get("timeoutSeconds", "30"))
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    event, before = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event["type"] == "CLOSE":
                    break
                if event["type"] == "BOOKMARK":
                    if bookmarks:
                        await response.write(json.dumps(event).encode() + b"\n")
                    continue
                sent = _selected(event, before, lambda obj: self._matches(obj, request))
                if sent is not None:
                    await response.write(json.dumps(sent).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(entry)
        return response


def _selected(
    event: dict[str, Any], before: dict[str, Any] | None, matches: Callable[[Any], bool]
) -> dict[str, Any] | None:
    """The event as a watch with a selector sends it, as the API server does: an object that
    enters the selection is ADDED, one that leaves it is DELETED (in its new state), and one
    outside it before and after is not sent."""
    now = matches(event["object"])
    was = before is not None and matches(before)
    if event["type"] == "MODIFIED" and now != was:
        return {"type": "ADDED" if now else "DELETED", "object": event["object"]}
    return event if now else None


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    # The API server's field sets hold an absent field as the empty string.
    return "" if value is None else str(value)


def _fields_match(obj: dict[str, Any], selector: str) -> bool:
    """A field selector as the API server reads it: terms joined by `,`, each `path=value`,
    `path==value` or `path!=value`, all of which must hold."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            path, _, value = term.partition("!=")
            if _field(obj, path) == value:
                return False
        else:
            path, _, value = term.partition("=")
            if _field(obj, path) != value.removeprefix("="):
                return False
    return True


def _failure(code: int, **fields: str) -> web.Response:
    return web.json_response(
        {"kind": "Status", "status": "Failure", "code": code, **fields}, status=code
    )


class FakeApiServer(_FakeApi):
    """The ConfigMaps of one namespace, read by name only (as the webhook's Role allows), or
    by label too when `by_label` (as the Role allows a webhook that follows revisions)."""

    def __init__(self, namespace: str, *, by_label: bool = False) -> None:
        super().__init__("webhook")
        self.namespace = namespace
        self.by_label = by_label
        self.fail_next = 0
        self.forbidden: set[str] = set()
        self.forbid_label_lists = False
        self.gone_next = 0
        self.lists = 0
        self.watches = 0

    def put(self, configmap: dict[str, Any]) -> None:
        obj = copy.deepcopy(configmap)
        obj["metadata"]["namespace"] = self.namespace
        obj["metadata"].pop("uid", None)  # the server keeps the uid it gave
        self._put("configmaps", obj)

    def delete(self, name: str) -> None:
        self._delete("configmaps", f"{self.namespace}/{name}")

    def _refusal(self, kind: str, request: web.Request) -> web.Response | None:
        if kind in ("pods", "resourcequotas"):
            # The owner's quota and the engine Pods it counts (serving.quota): none here.
            return None
        if kind != "configmaps":
            return _failure(404, reason="NotFound")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        if self.fail_next > 0:
            self.fail_next -= 1
            return _failure(500, message="boom")
        selector = request.query.get("fieldSelector", "")
        if not selector.startswith("metadata.name=") and not (
            self.by_label and request.query.get("labelSelector")
        ):
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        if self.forbid_label_lists and request.query.get("labelSelector"):
            # What RBAC answers when the Role grants get by name but not list.
            return _failure(403, reason="Forbidden")
        if selector.removeprefix("metadata.name=") in self.forbidden:
            # What RBAC answers when the Role's resourceNames do not include the name.
            return _failure(403, reason="Forbidden")
        return None

    def _gone(self, kind: str) -> bool:
        if self.gone_next > 0:
            self.gone_next -= 1
            return True
        return False

    def _listed(self, kind: str) -> None:
        self.lists += 1

    def _watched(self, kind: str) -> None:
        self.watches += 1


class FakeCluster(_FakeApi):
    """Nodes, Pods (by label selector) and ConfigMaps (by field selector), as the extender reads
    them, with per-kind knobs to make requests fail and watches expire."""

    def __init__(self) -> None:
        super().__init__("extender")
        self.fail_next: dict[str, int] = {}
        self.gone_next: dict[str, int] = {}
        # Kinds the extender's Role does not let it read: RBAC's 403.
        self.forbidden: set[str] = set()
        self.lists: dict[str, int] = dict.fromkeys(KINDS, 0)
        # Every ConfigMap write, as (method, namespace, name), and how many to fail with a 500.
        self.writes: list[tuple[str, str, str]] = []
        self.fail_writes = 0
        # SubjectAccessReviews as received; the (namespace, verb, resource[/subresource]) they
        # answer not allowed; a status every review fails with instead (None: answered).
        self.reviews: list[dict[str, Any]] = []
        self.denied: set[tuple[str, str, str]] = set()
        self.review_failure: int | None = None

    def _routes(self, app: web.Application) -> None:
        # ConfigMap writes, as an update by name (404 when absent) and a create (409 when
        # present): what the extender's room figures need.
        collection = KINDS["configmaps"][0]
        app.router.add_put(collection + "/{name}", self._write)
        app.router.add_post(collection, self._write)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._review)

    async def _review(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.reviews.append(body)
        if self.review_failure is not None:
            return _failure(self.review_failure, reason="Failure")
        attributes = body["spec"]["resourceAttributes"]
        resource = attributes["resource"]
        if attributes.get("subresource"):
            resource += "/" + attributes["subresource"]
        asked = (attributes["namespace"], attributes["verb"], resource)
        body["status"] = {"allowed": asked not in self.denied}
        return web.json_response(body, status=201)

    async def _write(self, request: web.Request) -> web.Response:
        namespace = request.match_info["ns"]
        body = await request.json()
        name = request.match_info.get("name") or body["metadata"]["name"]
        self.writes.append((request.method, namespace, name))
        if self.fail_writes > 0:
            self.fail_writes -= 1
            return _failure(500, message="boom")
        exists = f"{namespace}/{name}" in self.objects["configmaps"]
        if request.method == "PUT" and not exists:
            return _failure(404, reason="NotFound", message=f'configmaps "{name}" not found')
        if request.method == "POST" and exists:
            return _failure(409, reason="AlreadyExists")
        body["metadata"]["namespace"] = namespace
        self._put("configmaps", body)
        return web.json_response(self.objects["configmaps"][f"{namespace}/{name}"])

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        self._put(kind, obj)

    def delete(self, kind: str, key: str) -> None:
        self._delete(kind, key)

    def _refusal(self, kind: str, request: web.Request) -> web.Response | None:
        if kind in self.forbidden:
            return _failure(403, reason="Forbidden")
        if self.fail_next.get(kind, 0) > 0:
            self.fail_next[kind] -= 1
            return _failure(500, message="boom")
        return None

    def _gone(self, kind: str) -> bool:
        if self.gone_next.get(kind, 0) > 0:
            self.gone_next[kind] -= 1
            return True
        return False

    def _listed(self, kind: str) -> None:
        self.lists[kind] += 1
