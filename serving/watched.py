"""What the informer lists and watches, and the local copy it keeps: the shared vocabulary.

A `Collection` names a resource, its namespace and selector; `Page` and `WatchEvent` are what the
API server's list and watch return; `Delta` is what a consumer is handed; `ObjectStore` is the
local copy, keyed as the collection keys its objects. The transport is the `ListWatch` port.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import quote

from inference_policy.base.pod_view import ObjectView

JSON = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Collection:
    """One collection to list and watch: which resource, where, and which of its objects."""

    resource: str
    """The plural resource name, as in the URL: `pods`, `configmaps`, `nodes`."""
    kind: str
    """The kind of its objects; items of a list arrive without it and consumers expect it."""
    namespace: str | None = None
    """One namespace; None for a cluster-scoped resource, or a namespaced one in every
    namespace (then objects are keyed `namespace/name`)."""
    api_version: str = "v1"
    label_selector: str | None = None
    field_selector: str | None = None

    @property
    def path(self) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespace:
            return f"{base}/namespaces/{quote(self.namespace, safe='')}/{self.resource}"
        return f"{base}/{self.resource}"

    def params(self) -> dict[str, str]:
        """The selectors as query parameters."""
        params: dict[str, str] = {}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        return params

    def key(self, obj: JSON) -> str | None:
        """Where the store files an object: its name within one namespace (or for a cluster
        resource), `namespace/name` across namespaces; None for what is not an object."""
        view = ObjectView(obj)
        name = view.name
        if name is None:
            return None
        namespace = view.namespace
        if self.namespace is None and namespace:
            return f"{namespace}/{name}"
        return name

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        selector = ", ".join(s for s in (self.label_selector, self.field_selector) if s)
        return f"{self.resource}{where}" + (f" ({selector})" if selector else "")


@dataclass(frozen=True)
class Page:
    """One page of a list: its items, the list's resourceVersion, and the token for the next
    page (None on the last)."""

    items: list[JSON]
    resource_version: str
    continue_token: str | None = None


@dataclass(frozen=True)
class WatchEvent:
    """One line of a watch stream: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR, and the object
    (a `Status` for ERROR)."""

    type: str
    object: JSON


class ListWatch(Protocol):
    """What an informer needs from the API server."""

    async def list_page(
        self, collection: Collection, *, limit: int, continue_token: str | None = None
    ) -> Page:
        """One page of the collection; raises Gone when `continue_token` has expired."""

    def watch(
        self, collection: Collection, *, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent]:
        """Changes after `resource_version`, with bookmarks, until the server ends the stream;
        raises Gone (or yields an ERROR event with code 410) when that version is no longer
        kept."""


@dataclass(frozen=True)
class Delta:
    """A change delivered to a handler."""

    type: EventType
    object: JSON
    """The object now; for DELETED, its last state (the store's copy for a synthetic delete)."""
    old: JSON | None
    """The copy the store held before, if any."""
    listed: bool
    """Found by a (re)list rather than received from a watch: the list's `on_listed` follows
    once every difference of that list has been delivered."""


def version_of(obj: JSON | None) -> str | None:
    """The object's resourceVersion, as the opaque string it is."""
    return ObjectView(obj).resource_version


def uid_of(obj: JSON | None) -> str | None:
    return ObjectView(obj).uid


def same_revision(a: JSON | None, b: JSON | None) -> bool:
    """The same object at the same version: uid and resourceVersion both present and equal."""
    if a is None or b is None:
        return False
    version = version_of(a)
    return version is not None and version == version_of(b) and uid_of(a) == uid_of(b)


class ObjectStore:
    """Objects by key (see `Collection.key`), as last delivered."""

    def __init__(self, key: Callable[[JSON], str | None]) -> None:
        self.key = key
        self.objects: dict[str, JSON] = {}

    def get(self, key: str) -> JSON | None:
        return self.objects.get(key)

    def names(self) -> list[str]:
        return list(self.objects)

    def values(self) -> list[JSON]:
        return list(self.objects.values())

    def __len__(self) -> int:
        return len(self.objects)

    def __contains__(self, key: object) -> bool:
        return key in self.objects

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.objects))

    def put(self, obj: JSON) -> JSON | None:
        """Store `obj` under its key; returns the copy it replaced."""
        key = self.key(obj)
        if key is None:
            return None
        old = self.objects.get(key)
        self.objects[key] = obj
        return old

    def write_through(self, obj: JSON) -> None:
        """An object a write returned: stored only if the store still holds that object (the
        same uid), so the next read sees the write before the watch brings it."""
        key = self.key(obj)
        old = self.objects.get(key) if key is not None else None
        if key is not None and old is not None and uid_of(old) == uid_of(obj):
            self.objects[key] = obj

    def remove(self, key: str) -> JSON | None:
        return self.objects.pop(key, None)


__all__ = [
    "JSON",
    "Collection",
    "Delta",
    "EventType",
    "ListWatch",
    "ObjectStore",
    "Page",
    "WatchEvent",
    "same_revision",
    "uid_of",
    "version_of",
]
