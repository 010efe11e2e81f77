"""List, then watch: the one way the webhook, the extender and the controller follow the cluster.

Each server keeps a local copy of a few collections (ConfigMaps by name, Nodes, engine Pods) and
reacts to changes. An `Informer` lists a collection page by page, hands every object to its
handler, then watches from the list's resourceVersion, so a restarted process resumes from what
the API server holds rather than from anything it remembered. Everything runs on the event loop
and handlers are called there, one delta at a time, so what they change needs no lock.

How it keeps the copy right:

* A watch that ends (its `timeoutSeconds`, a dropped connection, any error) is resumed from the
  last version seen, which bookmarks keep moving while nothing in the collection changes.
* A version the API server no longer keeps (410 Gone, as an answer or as an ERROR event) is a
  fresh list, and the difference from the copy is delivered: a synthetic DELETED for what is
  gone, ADDED or MODIFIED for what is new or changed. A continue token that expired mid-list
  starts that list over. Consumers therefore converge without ever seeing a list as such.
* resourceVersion is opaque: it is sent back as received and compared only for equality. An
  object whose uid and resourceVersion equal the stored copy's is a duplicate and not delivered
  again; anything else is the newer state, as the API server sends changes in order.
* Failures back off exponentially with jitter; the delay starts over after a healthy stream, one
  that delivered something or stayed open a while, so a server that closes every watch at once
  is retried at the backoff pace rather than in a tight loop.

What it keeps of an object: never `metadata.managedFields`, and, with a `transform`, only what
the transform returns, stored and delivered alike (the extender keeps a Pod's `holding_part`).
A transform that does more than select (the policy feed judges each profile revision as it
arrives, `serving.revisions`) takes a `transform_gone` for the last state of a deleted object,
which is stored nowhere.

The transport is a port (`ListWatch`): `serving.apiserver.ApiClient` over aiohttp in the
servers, an in-memory fake in the controller's tests. Cancelling `run` stops it at once, a
blocked watch included, because the watch is an awaited read, not a thread.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from serving.kube import Backoff, Gone, api_error, describe_error, not_permitted
from serving.watched import (
    JSON,
    Collection,
    Delta,
    ListWatch,
    ObjectStore,
    Page,
    WatchEvent,
    same_revision,
    uid_of,
    version_of,
)

log = logging.getLogger(__name__)

# A continue token can expire again while the restarted list pages; past this many restarts the
# list counts as failed and backs off like any other error.
LIST_RESTARTS = 3


async def list_all(
    api: ListWatch,
    collection: Collection,
    *,
    page_size: int = 500,
    keep: Callable[[JSON], JSON] | None = None,
) -> Page:
    """Every object of the collection, page by page, as one consistent list: the items (with
    their kind and apiVersion, which list items lack) and the list's resourceVersion. A continue
    token that expires mid-list starts the list over, a few times at most.

    ``keep`` is applied to each page's items as the page arrives, so a list of many objects
    never holds more than one page of them whole (an extender restarting with 150,000 engine
    Pods would otherwise hold them all decoded before keeping a tenth of each)."""
    restarts = 0
    while True:
        items: list[JSON] = []
        token: str | None = None
        try:
            while True:
                page = await api.list_page(collection, limit=page_size, continue_token=token)
                for item in page.items:
                    item.setdefault("apiVersion", collection.api_version)
                    item.setdefault("kind", collection.kind)
                    items.append(item if keep is None else keep(item))
                # What `keep` did not keep goes now, before the next page is awaited.
                page.items.clear()
                token = page.continue_token or None
                if token is None:
                    break
        except Gone:
            if token is None or restarts >= LIST_RESTARTS:
                raise
            restarts += 1
            log.info("list of %s expired between pages; listing again", collection)
            continue
        return Page(items, page.resource_version)


Handler = Callable[[Delta], None]


class Informer:
    """One collection listed, then watched, until cancelled; see the module docstring."""

    def __init__(
        self,
        api: ListWatch,
        collection: Collection,
        handler: Handler,
        *,
        on_listed: Callable[[Informer], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        relist_seconds: float | None = None,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        healthy_seconds: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        transform: Callable[[JSON], JSON] | None = None,
    ) -> None:
        self.api = api
        # What is kept of each object, stored and delivered (client-go's SetTransform): a
        # consumer that reads a few fields of many objects need not hold the rest.
        self.transform = transform
        # What is delivered of a deleted object's last state (None: the `transform`).
        self.transform_gone: Callable[[JSON], JSON] | None = None
        self.collection = collection
        self.handler = handler
        self.on_listed = on_listed
        self.on_error = on_error
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.relist_seconds = relist_seconds
        self.backoff = Backoff(backoff, max_backoff)
        self.healthy_seconds = healthy_seconds
        self.sleep = sleep
        self.monotonic = monotonic
        self.store = ObjectStore(collection.key)
        self.synced = asyncio.Event()
        self.version = ""
        self.lists = 0
        self.watches = 0
        self.errors = 0
        self._listed_at = 0.0
        self._heard = False
        self._watch_started = 0.0
        self._task: asyncio.Task[None] | None = None

    def write_through(self, obj: JSON) -> JSON:
        """An object a request of the owner's returned (a fresh read, a write's answer), kept
        as this informer keeps what it delivers (`transform`) and stored if the store still
        holds that object: every path into the store is held to the same cap."""
        kept = self.transform(obj) if self.transform is not None else obj
        self.store.write_through(kept)
        return kept

    @property
    def what(self) -> str:
        return str(self.collection)

    # -- running -------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Run in a task of its own (once); `stop` ends it."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"informer {self.what}"
            )
        return self._task

    async def stop(self) -> None:
        """Cancel the run and wait for it, which closes an open watch."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        """List and watch until cancelled; no error ends it."""
        need_list = True
        while True:
            self._heard = False
            listed = False
            try:
                if need_list:
                    await self.relist()
                    need_list, listed = False, True
                    # A fresh list is as good as a healthy stream: failures start over.
                    self.backoff.reset()
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Gone as exc:
                if need_list:
                    # The list itself, not a watch: an error like any other.
                    await self._failed(exc, healthy=False)
                    continue
                log.info(
                    "watch of %s expired at version %r; listing again", self.what, self.version
                )
                need_list = True
                if listed and not self._heard:
                    # Expired at once from a version just listed: do not relist in a tight loop.
                    await self.sleep(self.backoff.next())
                continue
            except Exception as exc:
                await self._failed(exc, healthy=not need_list and self._healthy())
                # Without a version to resume from (the list itself failed) only a list helps.
                # After a refusal of this server's credentials or Role, the consumer has been
                # told what it holds may not be read (`on_error`): only a list, whose
                # `on_listed` hands it all again, can say the read is allowed once more.
                need_list = need_list or not self.version or not_permitted(exc) is not None
                continue
            if self._healthy():
                self.backoff.reset()
            else:
                # Closed at once with nothing said: wait as after an error, or this would spin.
                await self.sleep(self.backoff.next())
            if self._relist_due():
                need_list = True

    def _healthy(self) -> bool:
        """The last watch delivered something, or stayed open a while."""
        if self._heard:
            return True
        lasted = self.monotonic() - self._watch_started
        return lasted >= min(self.healthy_seconds, self.watch_timeout / 2)

    def _relist_due(self) -> bool:
        return (
            self.relist_seconds is not None
            and self.monotonic() - self._listed_at >= self.relist_seconds
        )

    async def _failed(self, exc: Exception, *, healthy: bool) -> None:
        self.errors += 1
        if healthy:
            # The stream was fine until now: this failure starts the backoff over.
            self.backoff.reset()
        log.warning(
            "list/watch of %s failed (%s); retrying in about %.1fs",
            self.what,
            describe_error(exc),
            self.backoff.delay,
        )
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("error handler failed for %s", self.what)
        await self.sleep(self.backoff.next())

    # -- list ----------------------------------------------------------------------------------

    async def relist(self) -> None:
        """List the collection and deliver its difference from the store."""
        page = await list_all(self.api, self.collection, page_size=self.page_size, keep=self._kept)
        self.lists += 1
        self._listed_at = self.monotonic()
        seen: set[str] = set()
        for obj in page.items:
            key = self.collection.key(obj)
            if key is None:
                continue
            seen.add(key)
            self._upsert(obj, listed=True, kept=True)
        for key in [k for k in self.store.names() if k not in seen]:
            gone = self.store.remove(key)
            if gone is not None:
                self._deliver(Delta("DELETED", gone, gone, listed=True))
        self.version = page.resource_version
        if self.on_listed is not None:
            try:
                self.on_listed(self)
            except Exception:
                log.exception("list handler failed for %s", self.what)
        self.synced.set()

    # -- watch ---------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Follow one watch stream until the server ends it."""
        self.watches += 1
        self._watch_started = self.monotonic()
        timeout = max(1, int(self.watch_timeout * (0.5 + random.random() / 2)))  # noqa: S311
        stream = self.api.watch(
            self.collection, resource_version=self.version, timeout_seconds=timeout
        )
        try:
            async for event in stream:
                self._heard = True
                self._on_event(event)
        finally:
            # An ERROR event or a cancellation leaves the stream half read: close it now, so its
            # connection goes back at once rather than when the collector finds it.
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()

    def _on_event(self, event: WatchEvent) -> None:
        obj = event.object
        if event.type == "ERROR":
            code = obj.get("code")
            raise api_error(
                code if isinstance(code, int) else 500,
                str(obj.get("reason") or ""),
                str(obj.get("message") or ""),
            )
        version = version_of(obj)
        if event.type == "BOOKMARK":
            if version:
                self.version = version
            return
        key = self.collection.key(obj)
        if key is not None:
            if event.type == "DELETED":
                old = self.store.remove(key)
                # Nothing held (a relist already reported it gone): nothing to tell.
                if old is not None:
                    self._deliver(Delta("DELETED", self._kept(obj, gone=True), old, listed=False))
            elif event.type in ("ADDED", "MODIFIED"):
                self._upsert(obj, listed=False)
            else:
                log.debug("ignoring a %s event on %s", event.type, self.what)
        if version:
            self.version = version

    # -- delivery ------------------------------------------------------------------------------

    def _upsert(self, obj: JSON, *, listed: bool, kept: bool = False) -> None:
        key = self.collection.key(obj)
        if key is None:
            return
        if not kept:
            obj = self._kept(obj)
        old = self.store.get(key)
        if same_revision(old, obj):
            return
        if old is not None and uid_of(old) != uid_of(obj):
            # Deleted and created again under the same name: to a consumer keyed by uid these
            # are two objects, so it hears of the old one's end first.
            self.store.remove(key)
            self._deliver(Delta("DELETED", old, old, listed=listed))
            old = None
        self.store.put(obj)
        self._deliver(Delta("ADDED" if old is None else "MODIFIED", obj, old, listed=listed))

    def _kept(self, obj: JSON, *, gone: bool = False) -> JSON:
        """What is stored and delivered of an object as the API server sent it."""
        _trim(obj)
        transform = self.transform_gone if gone and self.transform_gone else self.transform
        return obj if transform is None else transform(obj)

    def _deliver(self, delta: Delta) -> None:
        try:
            self.handler(delta)
        except Exception:
            # A handler bug must not kill the watch: the object is still stored, and the next
            # change to it (or a relist) gives the handler another chance.
            log.exception("handler failed for %s event on %s", delta.type, self.what)


def _trim(obj: JSON) -> None:
    """Drop `metadata.managedFields` before an object is stored or delivered.

    It is the API server's record of which client set each field: often as large as the rest of
    a Pod or Node, and read by none of the servers. client-go's informers are given the same
    transform for the same reason: the store holds what the servers use, so a large fleet costs
    memory for its objects, not for their history. (An object is decoded afresh for each list
    page and watch event, so it is changed in place.)"""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


@dataclass(frozen=True)
class InformerFactory:
    """How one server makes its informers: its API client and its timing, once, so that every
    informer of the server (the policy feed's, the room's, the quota's, the nodes', the Pods')
    lists, watches, resyncs and backs off alike. Called with a collection and its handlers."""

    api: ListWatch
    watch_timeout: int = 300
    relist_seconds: float | None = None
    backoff: float = 0.5
    max_backoff: float = 30.0

    def __call__(
        self,
        collection: Collection,
        changed: Handler,
        listed: Callable[[Informer], None] | None = None,
        failed: Callable[[Exception], None] | None = None,
        *,
        transform: Callable[[JSON], JSON] | None = None,
    ) -> Informer:
        return Informer(
            self.api,
            collection,
            changed,
            on_listed=listed,
            on_error=failed,
            watch_timeout=self.watch_timeout,
            relist_seconds=self.relist_seconds,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            transform=transform,
        )


class Informers:
    """A server's informers over one client: started together, stopped together, and the client
    closed after them, so a stop leaves no watch open."""

    def __init__(self, api: ListWatch) -> None:
        self.api = api
        self.informers: list[Informer] = []

    def add(self, informer: Informer) -> Informer:
        self.informers.append(informer)
        return informer

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    async def stop(self) -> None:
        await asyncio.gather(*(informer.stop() for informer in self.informers))
        close = getattr(self.api, "close", None)
        if close is not None:
            await close()

    @property
    def errors(self) -> int:
        return sum(informer.errors for informer in self.informers)

    @property
    def lists(self) -> int:
        return sum(informer.lists for informer in self.informers)


__all__ = [
    "JSON",
    "LIST_RESTARTS",
    "Collection",
    "Delta",
    "Handler",
    "Informer",
    "InformerFactory",
    "Informers",
    "ListWatch",
    "ObjectStore",
    "Page",
    "WatchEvent",
    "list_all",
    "same_revision",
    "uid_of",
    "version_of",
]
