"""List, then watch: a local copy of the Pods (or ConfigMaps) the controller cares about.

An informer lists once, hands every object to its handler, then watches from the list's
resourceVersion, so a restarted controller resumes from what the API server holds rather than
from anything it remembered. A watch that ends (the server's timeout, a dropped connection) is
resumed from the last version seen; a watch the server answers with 410 Gone (the version was
compacted away) is a fresh list, and objects that vanished meanwhile are reported deleted.
Errors back off exponentially with jitter and never end the loop.

The store also takes the objects the controller's own writes return, so a reconcile that runs
before the watch has delivered the write sees it. Versions are compared as integers where both
are integers (as etcd's are) so an older event still in flight cannot overwrite a newer write.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from allocation_controller.ports import JSON, ApiError, Gone, Resource, WatchPort
from serving.kube import Backoff

log = logging.getLogger(__name__)

Handler = Callable[[str, JSON, JSON | None], None]
"""Called with the event type (ADDED, MODIFIED, DELETED), the object, and the previous copy."""


def _name(obj: JSON) -> str | None:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def _version(obj: JSON | None) -> int | None:
    if obj is None:
        return None
    value = (obj.get("metadata") or {}).get("resourceVersion")
    if not isinstance(value, str):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _uid(obj: JSON | None) -> Any:
    return (obj or {}).get("metadata", {}).get("uid")


class ObjectStore:
    """Objects by name, newest version wins."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}

    def get(self, name: str) -> JSON | None:
        return self.objects.get(name)

    def names(self) -> list[str]:
        return list(self.objects)

    def __len__(self) -> int:
        return len(self.objects)

    def upsert(self, obj: JSON) -> tuple[bool, JSON | None]:
        """Store `obj` unless the store holds this or a newer version: (stored, previous)."""
        name = _name(obj)
        if name is None:
            return False, None
        old = self.objects.get(name)
        if old is not None and _uid(old) == _uid(obj):
            new_version, old_version = _version(obj), _version(old)
            if new_version is not None and old_version is not None and new_version <= old_version:
                return False, old
        self.objects[name] = obj
        return True, old

    def write_through(self, obj: JSON) -> None:
        """An object returned by a write: stored only if the store still holds that object."""
        name = _name(obj)
        old = self.objects.get(name) if name is not None else None
        if old is not None and _uid(old) == _uid(obj):
            self.upsert(obj)

    def remove(self, name: str) -> JSON | None:
        return self.objects.pop(name, None)


class Informer:
    def __init__(
        self,
        api: WatchPort,
        resource: Resource,
        handler: Handler,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: int = 300,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        on_relist: Callable[[ObjectStore], None] | None = None,
    ) -> None:
        self.api = api
        self.resource: Resource = resource
        self.handler = handler
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.on_relist = on_relist
        self.store = ObjectStore()
        self.synced = asyncio.Event()
        self.version = ""
        self.lists = 0
        self.errors = 0

    @property
    def what(self) -> str:
        selector = self.label_selector or self.field_selector or "all"
        return f"{self.resource} ({selector})"

    def _deliver(self, kind: str, obj: JSON, old: JSON | None) -> None:
        try:
            self.handler(kind, obj, old)
        except Exception:
            # A handler bug must not kill the watch: the object is still stored, and the next
            # event for it (or a relist) gives the handler another chance.
            log.exception("handler failed for %s event on %s", kind, self.what)

    async def relist(self) -> None:
        items, version = await self.api.list_objects(
            self.resource, label_selector=self.label_selector, field_selector=self.field_selector
        )
        self.lists += 1
        seen: set[str] = set()
        for obj in items:
            name = _name(obj)
            if name is None:
                continue
            seen.add(name)
            stored, old = self.store.upsert(obj)
            if stored:
                self._deliver("ADDED" if old is None else "MODIFIED", obj, old)
        for name in [n for n in self.store.names() if n not in seen]:
            gone = self.store.remove(name)
            if gone is not None:
                self._deliver("DELETED", gone, gone)
        self.version = version
        if self.on_relist is not None:
            self.on_relist(self.store)
        self.synced.set()

    async def watch_once(self) -> None:
        """Follow one watch stream until the server ends it."""
        stream = self.api.watch_objects(
            self.resource,
            resource_version=self.version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=int(self.watch_timeout * (0.5 + random.random() / 2)),  # noqa: S311
        )
        async for event in stream:
            version = (event.object.get("metadata") or {}).get("resourceVersion")
            if event.type == "BOOKMARK":
                if isinstance(version, str):
                    self.version = version
                continue
            name = _name(event.object)
            if name is None:
                continue
            if event.type == "DELETED":
                old = self.store.remove(name)
                self._deliver("DELETED", event.object, old)
            else:
                stored, previous = self.store.upsert(event.object)
                if stored:
                    self._deliver(event.type, event.object, previous)
            if isinstance(version, str):
                self.version = version

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = Backoff(self.backoff, self.max_backoff)
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                await self.watch_once()
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info(
                    "watch of %s expired at version %s; listing again", self.what, self.version
                )
                need_list = True
            except Exception as exc:
                self.errors += 1
                status = exc.status if isinstance(exc, ApiError) else None
                log.warning(
                    "watching %s failed (%s); retrying in %.1fs",
                    self.what,
                    f"HTTP {status}" if status else f"{type(exc).__name__}: {exc}",
                    backoff.delay,
                )
                await asyncio.sleep(backoff.next())
                # Without a version to resume from (the list itself failed) only a list helps.
                need_list = need_list or not self.version
