"""Where the extender's `ClusterView` comes from: Nodes, planned Pods and each tenant's profile.

`KubernetesSource` runs one informer per collection (all Nodes; the Pods labelled
`kamiwaza.ai/deployment-id` in each accounted namespace that are bound and not terminated, the
ledger's `HOLDING_PODS_FIELD_SELECTOR`, each kept as its `holding_part`, what decides what it
holds; each tenant's profile ConfigMap by name in its namespace), the
same `serving.informer.Informer` the webhook and the controller use: it lists, then watches from
the list's resource version, and re-lists after `resync_seconds` or a 410 Gone, backing off with
jitter after errors. It runs on the event loop and calls the source's handlers there, so the view
is only ever touched by the loop, with no lock, and a slow or unreachable API server delays the
next update but never a scheduling request.

After a restart, the first list of Pods rebuilds the whole ledger: nothing is persisted, and
nothing needs to be, because every accounted fact is in the API.

The profile is read by the informers every server uses (`serving.revisions`): one named
ConfigMap, or every signed revision when following them, into the view's `policy_io.feed`;
with a rollback record named, the owner's TenantAdmission too (`extender.rollback_record`).
What it writes besides is the room figures of each tenant (`extender.room_publisher`); what it
asks besides is whether the allocation controller keeps its rights in each tenant namespace
(`extender.owner_rights`); given a quota board, it reads each tenant's quota and bound Pods into
it (`extender.quota`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from extender.config import ALL_NAMESPACES
from extender.owner_rights import RightsReviewer
from extender.quota import QuotaBoard
from extender.rollback_record import Requests, RollbackRecord
from extender.room_publisher import DEFAULT_INTERVAL, RoomPublisher
from extender.view import ClusterView
from inference_policy.base.pod_view import ObjectView
from inference_policy.base.wire import ENGINE_LABEL as DEPLOYMENT_LABEL
from inference_policy.placing.ledger import (
    HOLDING_PODS_FIELD_SELECTOR,
    accounted_pod,
    holding_part,
    pod_key,
)
from inference_policy.placing.nodes import NodeFacts, node_facts
from inference_policy.placing.spread import deployment_of
from policy_io.feed import FeedChange
from serving.informer import Collection, Delta, Informer, InformerFactory, Informers, ListWatch
from serving.revisions import feed_informers

log = logging.getLogger(__name__)
Accounted = tuple[str, dict[str, int]] | None


class ClusterSource(Protocol):
    """Something that keeps a view current until stopped."""

    async def start(self, view: ClusterView) -> None: ...

    async def stop(self) -> None: ...


# -- the API server -----------------------------------------------------------------------------


class Api(ListWatch, Requests, Protocol):
    """The API client the source reads with, and writes the rollback record with."""


class KubernetesSource:
    """Informers (`serving.informer`) for Nodes, planned Pods per scope and the profile
    ConfigMap, over one client that the source owns and closes when stopped.

    What a list finds is parsed into the source's own copy and handed to the view whole once the
    list is complete (which is also what makes the view ready); a watch event is parsed once and
    applied to both. A relist's difference arrives as events like any other, so after a 410 the
    view converges without a reset.
    """

    def __init__(
        self,
        pod_namespaces: Iterable[str],
        api: Api,
        *,
        resync_seconds: float = 1800,
        watch_seconds: int = 300,
        backoff_seconds: float = 1.0,
        room_seconds: float = DEFAULT_INTERVAL,
        quota: QuotaBoard | None = None,
    ) -> None:
        self.pod_namespaces = tuple(pod_namespaces)
        # Each tenant's quota and what its namespace holds (`extender.quota`), when held to.
        self.quota = quota
        self.api = api
        self.resync_seconds = resync_seconds
        self.watch_seconds = watch_seconds
        self.backoff_seconds = backoff_seconds
        self.informers = Informers(api)
        self.records: list[RollbackRecord] = []
        self.room_seconds = room_seconds
        self.room: RoomPublisher | None = None
        self.rights: RightsReviewer | None = None

    @property
    def errors(self) -> int:
        return self.informers.errors

    @property
    def lists(self) -> int:
        return self.informers.lists

    @property
    def _informer(self) -> InformerFactory:
        return InformerFactory(
            self.api,
            watch_timeout=self.watch_seconds,
            relist_seconds=self.resync_seconds,
            backoff=self.backoff_seconds,
            max_backoff=30.0 * self.backoff_seconds,
        )

    def _nodes(self, view: ClusterView) -> Informer:
        facts: dict[str, NodeFacts] = {}

        def changed(delta: Delta) -> None:
            node = ObjectView(delta.object).name or ""
            parsed = None if delta.type == "DELETED" else node_facts(delta.object)
            if parsed is None:
                facts.pop(node, None)
            else:
                facts[node] = parsed
            if not delta.listed:
                view.node_changed(node, parsed)

        def listed(informer: Informer) -> None:
            view.replace_nodes(facts.values())

        return self._informer(Collection("nodes", "Node"), changed, listed)

    def _pods(self, view: ClusterView, scope: str) -> Informer:
        pods: dict[str, tuple[Accounted, str | None]] = {}

        def changed(delta: Delta) -> None:
            key = pod_key(delta.object)
            accounted = None if delta.type == "DELETED" else accounted_pod(delta.object)
            deployment = deployment_of(delta.object)
            if delta.type == "DELETED":
                pods.pop(key, None)
            else:
                pods[key] = (accounted, deployment)
            if not delta.listed:
                view.pod_changed(key, accounted, deployment)

        def listed(informer: Informer) -> None:
            view.replace_pods(scope, ((key, *held) for key, held in pods.items()))

        namespace = None if scope == ALL_NAMESPACES else scope
        collection = Collection(
            "pods",
            "Pod",
            namespace,
            label_selector=DEPLOYMENT_LABEL,
            field_selector=HOLDING_PODS_FIELD_SELECTOR,
        )
        # Only what decides what a Pod holds is kept: every bound engine Pod is in this store.
        return self._informer(collection, changed, listed, transform=holding_part)

    async def start(self, view: ClusterView) -> None:
        for feed in view.feeds.values():
            notify = _ignore
            if feed.rollback is not None:
                record = RollbackRecord(feed, feed.rollback, self.api)
                self.records.append(record)
                self.informers.add(record.informer(self._informer))
                notify = record.changed
            for informer in feed_informers(feed, self._informer, notify):
                self.informers.add(informer)
        self.informers.add(self._nodes(view))
        for scope in self.pod_namespaces:
            self.informers.add(self._pods(view, scope))
        for informer in self.quota.informers(self._informer) if self.quota else ():
            self.informers.add(informer)
        self.informers.start()
        if view.rights is not None:
            self.rights = RightsReviewer(view.rights, self.api)
            self.rights.start()
        if self.room_seconds > 0:
            self.room = RoomPublisher(view, self.api, view.clock, interval=self.room_seconds)
            self.room.start()

    async def stop(self) -> None:
        if self.rights is not None:
            await self.rights.stop()
        if self.room is not None:
            await self.room.stop()
        await self.informers.stop()
        for record in self.records:
            await record.stop()


def _ignore(change: FeedChange | None = None) -> None:
    return None
