"""The owner's record of the highest profile version the extender has verified for its tenant.

`inference_policy.trust.rollback` says why the floor exists and what it is; this keeps it: an
informer on the one cluster-scoped TenantAdmission named in the settings hands every read to the
view's feed (which uses no profile until the first read, and none while it cannot be read), and each
time the feed's profile is a version above the record the status is written, with the object's
resourceVersion as the precondition so that of two extender replicas the later writer re-reads
instead of overwriting. A write that fails is logged and tried again at the next change: the
record only ever rises, and what it guards is already guarded by the configured floor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

from inference_policy.base.pod_view import ObjectView
from inference_policy.trust.rollback import API_VERSION, KIND, PLURAL
from policy_io.feed import FeedChange, PolicyFeed
from serving.informer import Collection, Delta, Informer
from serving.kube import describe_error, not_permitted

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"

NewInformer = Callable[
    [Collection, Callable[[Delta], None], Callable[[Informer], None], Callable[[Exception], None]],
    Informer,
]


class Requests(Protocol):
    """What writing the record needs of the API client."""

    async def request(
        self, method: str, path: str, *, body: Any = None, content_type: str = ...
    ) -> Any: ...


class RollbackRecord:
    """Keeps `feed`'s floor read from TenantAdmission `name` and its record current."""

    def __init__(self, feed: PolicyFeed, name: str, api: Requests) -> None:
        self.feed = feed
        self.name = name
        self.api = api
        self.writes = 0
        self._resource_version: str | None = None
        self._writing: asyncio.Task[None] | None = None

    def informer(self, new: NewInformer) -> Informer:
        def read(obj: dict[str, Any] | None, why: str | None) -> None:
            self._resource_version = ObjectView(obj).resource_version if obj else None
            self.changed(self.feed.floor_read(obj, why))

        def changed(delta: Delta) -> None:
            if not delta.listed:
                read(None if delta.type == "DELETED" else delta.object, None)

        def listed(informer: Informer) -> None:
            read(informer.store.get(self.name), None)

        def failed(exc: Exception) -> None:
            why = not_permitted(exc)
            if why is not None:
                read(None, why)

        collection = Collection(
            PLURAL, KIND, None, api_version=API_VERSION, field_selector=f"metadata.name={self.name}"
        )
        return new(collection, changed, listed, failed)

    def changed(self, change: FeedChange | None = None) -> None:
        """After any input: write the record if the profile in use is above it."""
        floor, profile = self.feed.floor, self.feed.snapshot.profile
        if floor is None or profile is None or self._resource_version is None:
            return
        status = floor.record(profile.version)
        if status is None or (self._writing is not None and not self._writing.done()):
            return
        self._writing = asyncio.get_running_loop().create_task(
            self._write(status, self._resource_version)
        )

    async def _write(self, status: dict[str, Any], resource_version: str) -> None:
        path = f"/apis/{API_VERSION}/{PLURAL}/{quote(self.name, safe='')}/status"
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            await self.api.request("PATCH", path, body=body, content_type=MERGE_PATCH)
        except Exception as exc:
            # A conflict means another replica wrote first; the watch brings its record.
            log.warning(
                "could not record version %s in TenantAdmission %s: %s",
                status["highestVerifiedVersion"],
                self.name,
                describe_error(exc),
                extra={"code": "rollback-record-failed"},
            )
            return
        self.writes += 1
        log.info(
            "recorded version %s as the highest verified in TenantAdmission %s",
            status["highestVerifiedVersion"],
            self.name,
        )

    async def stop(self) -> None:
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)


__all__ = ["RollbackRecord"]
