"""The profile revisions the controller's feed refused by a cap, reported where people look.

The tenant's namespace admin may write as many labelled ConfigMaps, as large, as the API server
takes; the feed refuses those past its caps unread or unverified (`policy_io.caps`). Of the
servers that follow revisions, the controller is the one that may post Events in the tenant
namespace, so it tells of each such refusal there, regarding the ConfigMap: the reason
`ProfileRevisionRefused` and the refusal's message, which names the cap and the ConfigMap. And
it exports every refusal of its feed as `tmi_allocation_profile_revisions_refused_total{reason}`
(`too-large`, `too-many`, `unverified`).

What the tenant can make of this is bounded too: one Event per refused revision at most, only
the leader posts, at most `BURST` at once and `PER_SECOND` after, the rest only counted and
logged; a write that fails is logged, never retried.

The tenants of one process (`allocation_controller.fleet`) share its registry, which takes each
metric name once: the first feed on a registry registers the collector, and every feed after it
joins that collector, which exports their sum.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from allocation_controller.ports import JSON, PodPort
from policy_io.caps import REFUSAL_REASONS
from policy_io.feed import PolicyFeed
from policy_io.state import CapRefusal

log = logging.getLogger(__name__)

EVENT_REASON = "ProfileRevisionRefused"
EVENT_ACTION = "FollowProfileRevisions"
BURST = 16
PER_SECOND = 1.0


class _Refused(Collector):
    def __init__(self) -> None:
        self.feeds: list[PolicyFeed] = []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "tmi_allocation_profile_revisions_refused",
            "Profile revisions refused: over the size cap (too-large), over the count cap "
            "(too-many), or by the verifier (unverified).",
            labels=["reason"],
        )
        totals = [feed.state.followed.refused_total for feed in self.feeds]
        for reason in REFUSAL_REASONS:
            family.add_metric([reason], float(sum(t.get(reason, 0) for t in totals)))
        yield family


# Each registry's one collector of refusals, for the next feed on it to join.
_REFUSED: weakref.WeakKeyDictionary[CollectorRegistry, _Refused] = weakref.WeakKeyDictionary()


def _count_refusals(registry: CollectorRegistry, feed: PolicyFeed) -> None:
    collector = _REFUSED.get(registry)
    if collector is None:
        collector = _REFUSED[registry] = _Refused()
        registry.register(collector)
    collector.feeds.append(feed)


class CapEvents:
    """Posts an Event for each cap refusal of `feed` while `may_write` says this replica leads."""

    def __init__(
        self,
        feed: PolicyFeed,
        port: PodPort,
        registry: CollectorRegistry,
        *,
        may_write: Callable[[], bool],
        controller: str,
        instance: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.feed = feed
        self.port = port
        self.may_write = may_write
        self.controller = controller
        self.instance = instance[:128]
        self.monotonic = monotonic
        self.posted = 0
        self.dropped = 0
        self._tokens = float(BURST)
        self._filled = monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        _count_refusals(registry, feed)

    def changed(self) -> None:
        """After a feed step: an Event for each cap refusal since the last step (on the loop)."""
        notices = self.feed.state.followed.take_notices()
        if not notices or not self.may_write():
            return
        loop = asyncio.get_running_loop()
        for notice in notices:
            if not self._take_token():
                self.dropped += 1
                log.info(
                    "no Event for refused profile ConfigMap %s: too many at once",
                    notice.name,
                    extra={"code": "profile-revision-event-dropped", "profile": notice.name},
                )
                continue
            task = loop.create_task(self._post(notice))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take_token(self) -> bool:
        now = self.monotonic()
        self._tokens = min(float(BURST), self._tokens + (now - self._filled) * PER_SECOND)
        self._filled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def event(self, notice: CapRefusal, now: datetime) -> JSON:
        namespace = self.port.namespace
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{notice.name[:200]}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "eventTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": EVENT_ACTION,
            "reason": EVENT_REASON,
            "note": notice.message[:1024],
            "type": "Warning",
            "regarding": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "namespace": namespace,
                "name": notice.name,
                "uid": notice.uid,
                "resourceVersion": notice.resource_version,
            },
        }

    async def _post(self, notice: CapRefusal) -> None:
        try:
            await self.port.create_event(self.event(notice, datetime.now(UTC)))
            self.posted += 1
        except Exception as exc:
            log.warning(
                "could not record an Event for profile ConfigMap %s: %s",
                notice.name,
                exc,
                extra={"code": "profile-revision-event-failed", "profile": notice.name},
            )

    async def drain(self) -> None:
        """Wait for the Events in flight (shutdown, tests)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["BURST", "EVENT_REASON", "PER_SECOND", "CapEvents"]
