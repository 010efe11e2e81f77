"""An in-memory API server for the controller's ports, for the controller's tests and benchmark.

A test double, kept with the tests rather than in the controller's package so that nothing the
controller ships can reach it. It keeps the semantics the controller depends on, so a test that
passes here exercises the same decisions it would make against kube-apiserver:

* every write bumps one global resourceVersion and is appended to a history; a watch replays
  the history after the version it asks for, then follows live changes, and a version older
  than the history kept (`compact`) is 410 Gone, as etcd compaction makes it;
* an object that stops matching a watch's selector is a DELETED event for that watch;
* a strategic merge patch on pods/status merges `status.conditions` by `type` and leaves every
  other condition alone, and honours `metadata.resourceVersion` in the patch as a precondition;
* Lease writes are compare-and-swap on resourceVersion (Conflict otherwise).

Tests drive it with `put`, `mutate`, `delete` and `compact`, inject failures with `fail_next`,
and read back `patches` and `events`. `latency` adds a delay to every call, to model a network.
`beside(namespace)` is the same server as another namespace's port, as a process serving
several tenant namespaces has one port per namespace (`allocation_controller.fleet`): one store,
history and set of watches, while failures, refusals and call counts are each port's own, and a
port reads and patches only its own namespace's Pods.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from allocation_controller.ports import JSON, ApiError, Conflict, Gone, NotFound
from serving.informer import Collection, Page, WatchEvent

_KINDS: dict[str, str] = {
    "pods": "Pod",
    "configmaps": "ConfigMap",
    "leases": "Lease",
    "resourceclaims": "ResourceClaim",
    "resourceslices": "ResourceSlice",
}


# The fake's operations each right of `inference_policy.granting.owner_rights.CONTROLLER_RIGHTS`
# covers.
RIGHT_OPERATIONS = {
    ("list", "pods"): "list_pods",
    ("watch", "pods"): "watch_pods",
    ("get", "pods"): "get_pod",
    ("patch", "pods/status"): "patch_pod_status",
}


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def matches(obj: Mapping[str, Any], label_selector: str | None, field_selector: str | None) -> bool:
    """The subset of selector syntax the controller uses: `k`, `k=v`, `k!=v`, `metadata.name=v`."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in (label_selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term not in labels:
            return False
    for term in filter(None, (t.strip() for t in (field_selector or "").split(","))):
        key, _, value = term.partition("=")
        if key == "metadata.name" and (obj.get("metadata") or {}).get("name") != value:
            return False
    return True


def merge_status_patch(pod: JSON, patch: Mapping[str, Any]) -> JSON:
    """Strategic merge of a pods/status patch: conditions merge by type, maps merge by key."""
    out = copy.deepcopy(pod)
    status = out.setdefault("status", {})
    for key, value in (patch.get("status") or {}).items():
        if key == "conditions":
            conditions = status.setdefault("conditions", [])
            for entry in value:
                index = next(
                    (i for i, c in enumerate(conditions) if c.get("type") == entry.get("type")),
                    None,
                )
                if index is None:
                    conditions.append(copy.deepcopy(entry))
                else:
                    merged = dict(conditions[index])
                    merged.update(entry)
                    conditions[index] = merged
        elif isinstance(value, Mapping) and isinstance(status.get(key), dict):
            status[key].update(value)
        else:
            status[key] = copy.deepcopy(value)
    return out


@dataclass
class _Change:
    version: int
    resource: str
    type: str
    old: JSON | None
    new: JSON | None


@dataclass
class _Versions:
    """The resourceVersion counter's state, one for every port of one fake server."""

    current: int = 999
    compacted: int = 0


@dataclass
class _Watcher:
    resource: str
    label_selector: str | None
    field_selector: str | None
    queue: asyncio.Queue[_Change | None] = field(default_factory=asyncio.Queue)
    namespace: str | None = None


def _in_namespace(obj: Mapping[str, Any], namespace: str | None) -> bool:
    """A collection of one namespace sees that namespace's objects (the fake keeps them all by
    name: a test that puts another namespace's Pods gives them names of their own)."""
    return namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace


@dataclass
class Patch:
    """One pods/status patch as received, and when (time.perf_counter)."""

    name: str
    body: JSON
    at: float


class MemoryKube:
    """The fake API server for one namespace. Not thread-safe: use it from one event loop."""

    def __init__(self, namespace: str = "kamiwaza") -> None:
        self._namespace = namespace
        self.objects: dict[str, dict[str, JSON]] = {kind: {} for kind in _KINDS}
        self._version = itertools.count(1000)
        self._versions = _Versions()
        self.history: list[_Change] = []
        self._watchers: list[_Watcher] = []
        self.patches: list[Patch] = []
        self.events: list[JSON] = []
        self.calls: dict[str, int] = {}
        self.failures: dict[str, list[ApiError]] = {}
        self.latency = 0.0
        self.on_patch: Callable[[Patch], object] | None = None
        # Operations (method names, as `calls` counts them) RBAC refuses with 403, as after the
        # tenant deleted the controller's RoleBinding; its access reviews answer the same.
        self.forbidden: set[str] = set()
        self.owner_events: list[JSON] = []

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def current_version(self) -> int:
        return self._versions.current

    @current_version.setter
    def current_version(self, version: int) -> None:
        self._versions.current = version

    @property
    def compacted(self) -> int:
        return self._versions.compacted

    @compacted.setter
    def compacted(self, version: int) -> None:
        self._versions.compacted = version

    def beside(self, namespace: str) -> MemoryKube:
        """This server as the port of another namespace (see the module's docstring)."""
        other = MemoryKube(namespace)
        for shared in (
            "objects",
            "_version",
            "_versions",
            "history",
            "_watchers",
            "patches",
            "events",
            "owner_events",
        ):
            setattr(other, shared, getattr(self, shared))
        return other

    def _own_pod(self, name: str) -> JSON | None:
        pod = self.objects["pods"].get(name)
        return pod if pod is not None and _in_namespace(pod, self._namespace) else None

    # -- driving the fake ----------------------------------------------------------------------

    def fail_next(self, operation: str, error: ApiError, times: int = 1) -> None:
        """Make the next `times` calls of an operation (a method name) raise `error`."""
        self.failures.setdefault(operation, []).extend([error] * times)

    def _bump(self) -> str:
        self.current_version = next(self._version)
        return str(self.current_version)

    def _record(self, resource: str, kind: str, old: JSON | None, new: JSON | None) -> None:
        change = _Change(self.current_version, resource, kind, old, new)
        self.history.append(change)
        for watcher in self._watchers:
            if watcher.resource == resource:
                watcher.queue.put_nowait(change)

    def put(self, resource: str, obj: Mapping[str, Any]) -> JSON:
        """Create or replace an object as a client would; returns the stored copy."""
        stored = copy.deepcopy(dict(obj))
        metadata = stored.setdefault("metadata", {})
        name = metadata["name"]
        old = self.objects[resource].get(name)
        metadata.setdefault("namespace", self._namespace)
        metadata.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        metadata.setdefault(
            "creationTimestamp", old["metadata"]["creationTimestamp"] if old else _now_text()
        )
        stored.setdefault("apiVersion", "v1")
        stored.setdefault("kind", _KINDS[resource])
        metadata["resourceVersion"] = self._bump()
        self.objects[resource][name] = stored
        self._record(resource, "MODIFIED" if old else "ADDED", old, stored)
        return copy.deepcopy(stored)

    def mutate(self, resource: str, name: str, change: Callable[[JSON], None]) -> JSON:
        """Apply `change` to a copy of the stored object and store it as a new version."""
        obj = copy.deepcopy(self.objects[resource][name])
        change(obj)
        return self.put(resource, obj)

    def delete(self, resource: str, name: str) -> None:
        old = self.objects[resource].pop(name)
        self._bump()
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self.current_version)
        self._record(resource, "DELETED", old, gone)

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: older watches get 410 Gone."""
        self.history.clear()
        self.compacted = self.current_version

    def get(self, resource: str, name: str) -> JSON | None:
        obj = self.objects[resource].get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def _call(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        if self.latency:
            await asyncio.sleep(self.latency)
        if operation in self.forbidden:
            raise ApiError(403, "Forbidden", f"the Role does not allow {operation}")
        pending = self.failures.get(operation)
        if pending:
            raise pending.pop(0)

    # -- AccessPort ----------------------------------------------------------------------------

    async def review_access(self, review: Mapping[str, Any]) -> JSON:
        await self._call("review_access")
        attributes = review["spec"]["resourceAttributes"]
        resource = attributes["resource"]
        if attributes.get("subresource"):
            resource += "/" + attributes["subresource"]
        operation = RIGHT_OPERATIONS.get((attributes["verb"], resource))
        return {
            **copy.deepcopy(dict(review)),
            "status": {"allowed": operation not in self.forbidden},
        }

    async def create_owner_event(self, event: Mapping[str, Any]) -> None:
        await self._call("create_owner_event")
        self.owner_events.append(copy.deepcopy(dict(event)))

    # -- ClaimReader ---------------------------------------------------------------------------

    async def get_resource_claim(self, name: str) -> JSON | None:
        await self._call("get_resource_claim")
        return self.get("resourceclaims", name)

    async def list_resource_slices(self, node: str) -> list[JSON]:
        await self._call("list_resource_slices")
        return [
            copy.deepcopy(s)
            for s in self.objects["resourceslices"].values()
            if s.get("spec", {}).get("nodeName") == node
        ]

    # -- PodPort -------------------------------------------------------------------------------

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        await self._call("get_pod")
        pod = self._own_pod(name)
        return copy.deepcopy(pod) if pod is not None else None

    async def list_pods(self, label_selector: str) -> list[JSON]:
        await self._call("list_pods")
        return [
            copy.deepcopy(p)
            for p in self.objects["pods"].values()
            if matches(p, label_selector, None)
        ]

    async def patch_pod_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        await self._call("patch_pod_status")
        pod = self._own_pod(name)
        if pod is None:
            raise NotFound(404, "NotFound", f'pods "{name}" not found')
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != pod["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        body = copy.deepcopy(dict(patch))
        record = Patch(name, body, time.perf_counter())
        self.patches.append(record)
        updated = merge_status_patch(pod, patch)
        stored = self.put("pods", updated)
        if self.on_patch is not None:
            self.on_patch(record)
        return stored

    async def create_event(self, event: Mapping[str, Any]) -> None:
        await self._call("create_event")
        self.events.append(copy.deepcopy(dict(event)))

    # -- ListWatch -----------------------------------------------------------------------------

    async def list_page(
        self, collection: Collection, *, limit: int, continue_token: str | None = None
    ) -> Page:
        """The whole list as one page: the controller's tests do not page (the informer's own
        tests do, against `kits.fakeapi`)."""
        resource = collection.resource
        await self._call(f"list_{resource}")
        items = [
            copy.deepcopy(o)
            for o in self.objects[resource].values()
            if matches(o, collection.label_selector, collection.field_selector)
            and _in_namespace(o, collection.namespace)
        ]
        return Page(items, str(self.current_version))

    async def watch(
        self, collection: Collection, *, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent]:
        resource = collection.resource
        await self._call(f"watch_{resource}")
        # The fake's versions are its own counter, so it may read them as numbers.
        since = int(resource_version or 0)
        if since < self.compacted:
            raise Gone(410, "Expired", f"too old resource version: {since} ({self.compacted})")
        watcher = _Watcher(
            resource,
            collection.label_selector,
            collection.field_selector,
            namespace=collection.namespace,
        )
        self._watchers.append(watcher)
        try:
            backlog = [c for c in self.history if c.resource == resource and c.version > since]
            last = since
            deadline = asyncio.get_running_loop().time() + timeout_seconds
            for past in backlog:
                event = self._event_for(past, watcher)
                last = past.version
                if event is not None:
                    yield event
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return
                try:
                    async with asyncio.timeout(remaining):
                        change = await watcher.queue.get()
                except TimeoutError:
                    return
                if change is None:
                    return
                if change.version <= last:
                    continue
                last = change.version
                event = self._event_for(change, watcher)
                if event is not None:
                    yield event
        finally:
            self._watchers.remove(watcher)

    def close_watches(self) -> None:
        """End every open watch, as an API server restart would."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    @staticmethod
    def _event_for(change: _Change, watcher: _Watcher) -> WatchEvent | None:
        def selected(obj: JSON | None) -> bool:
            return (
                obj is not None
                and matches(obj, watcher.label_selector, watcher.field_selector)
                and _in_namespace(obj, watcher.namespace)
            )

        was, now = selected(change.old), selected(change.new)
        if change.type == "DELETED":
            return WatchEvent("DELETED", copy.deepcopy(change.new or {})) if was else None
        if now:
            kind = "MODIFIED" if was else "ADDED"
            return WatchEvent(kind, copy.deepcopy(change.new or {}))
        if was:
            return WatchEvent("DELETED", copy.deepcopy(change.new or {}))
        return None

    # -- LeasePort -----------------------------------------------------------------------------

    async def get_lease(self, name: str) -> JSON | None:
        await self._call("get_lease")
        return self.get("leases", name)

    async def create_lease(self, lease: Mapping[str, Any]) -> JSON:
        await self._call("create_lease")
        name = lease["metadata"]["name"]
        if name in self.objects["leases"]:
            raise Conflict(409, "AlreadyExists", f'leases "{name}" already exists')
        body = copy.deepcopy(dict(lease))
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        return self.put("leases", body)

    async def replace_lease(self, name: str, lease: Mapping[str, Any]) -> JSON:
        await self._call("replace_lease")
        current = self.objects["leases"].get(name)
        if current is None:
            raise NotFound(404, "NotFound", f'leases "{name}" not found')
        wanted = (lease.get("metadata") or {}).get("resourceVersion")
        if wanted != current["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        return self.put("leases", lease)
