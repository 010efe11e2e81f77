"""The running controller: informers feed a work queue, workers reconcile, one leader writes.

Every replica lists and watches (so a follower's cache is warm when it takes over), but only the
Lease holder runs workers. On winning the Lease a replica waits until every informer has listed
once (a Pod checked before the profile ConfigMaps are read would be reported against an unknown
revision), then queues every engine Pod, because it cannot know what the previous leader left
undone. On losing it the workers stop and the queue is dropped. The ConfigMaps are read by the
informers every server uses (`serving.revisions`) into the policy feed (`policy_io.feed`): one
whose list or watch the API server refuses to this replica's credentials or Role (401 or 403)
counts as read, with nothing readable, so the Pods are still checked and their verdicts name the
refusal and the Role to fix, rather than the controller waiting unready with nothing written.
The informer lists again after such a refusal (`serving.informer`), and that list hands
everything back once the read is allowed.

What wakes a Pod up:

* any watch event for it (the reconcile is level-based, so a status-only change costs a pure
  check and no write);
* a profile revision appearing, changing or disappearing, for the Pods planned under it;
* a recipe catalog changing, for every Pod;
* the API server refusing, or again allowing, a read of the profile ConfigMaps or a recipe
  catalog, for every Pod;
* its own timer: the scheduling deadline, or its revision's expiry;
* a failed reconcile, after a per-Pod exponential backoff;
* leaving the watch (deleted, or its engine label removed, terminating or not): one fresh read,
  and a verified Pod that is no longer an engine Pod is marked False, since it is no longer
  re-checked.

The engine Pods of the owner release's other tenant namespaces are followed too
(`allocation_controller.neighbours`): a Pod of this tenant whose accounted share meets one of
theirs on a GPU is reported (`inference_policy.granting.grant_tenants`), and is checked again
whenever a neighbour's Pod arrives on its node or leaves it.

In a process serving every tenant (`allocation_controller.fleet`) the tenants' controllers share
one elector (`leadership`: the fleet starts and stops every tenant's workers together) and one
`Commons`, fed by each tenant's own Pod informer, in place of the neighbours' informers.

Its own rights in the tenant namespace are reviewed beside all this (`allocation_controller.
rights`), and at once when the API server refuses it the Pod list or watch, a Pod read or a
status patch: a refused Pod list counts as read, like a refused ConfigMap, so the replica stays
ready, and the informer lists again with backoff until the rights are back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import orjson

from allocation_controller.capped import CapEvents
from allocation_controller.config import ControllerSettings
from allocation_controller.leader import LeaderElector, Leadership
from allocation_controller.metrics import Metrics
from allocation_controller.neighbours import Commons, Neighbours, NeighbourView
from allocation_controller.ports import JSON, KubePort, PodPort
from allocation_controller.reconciler import (
    CONTROLLER_NAME,
    NotLeader,
    Reconciler,
    ReconcileSettings,
    Result,
)
from allocation_controller.revisions import PolicyView
from allocation_controller.rights import RightsMonitor, reporter_for
from allocation_controller.workqueue import ShutDown, WorkQueue
from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION
from inference_policy.granting.grant import plan_revision
from inference_policy.granting.kept_pod import kept_pod
from inference_policy.trust.signing import VerifiedProfile
from policy_io.feed import FeedChange
from serving.informer import Collection, Delta, Informer, InformerFactory
from serving.kube import not_permitted
from serving.revisions import feed_informers

log = logging.getLogger(__name__)
# Queue keys are Pod names; a Pod that left the watch is queued under this prefix, which no Pod
# name can carry (names are DNS subdomains).
DEPARTED = "departed/"


def _kept(pod: JSON) -> JSON:
    return kept_pod(pod, len(orjson.dumps(pod)))


class CachedPods:
    """The reconciler's PodPort: reads come from the Pod informer's store, writes go to the API
    server and what they return goes into the store, so the next read sees the write."""

    def __init__(self, api: PodPort, informer: Informer) -> None:
        self.api = api
        self.informer = informer
        self.store = informer.store

    @property
    def namespace(self) -> str:
        return self.api.namespace

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        if not fresh:
            return self.store.get(name)
        pod = await self.api.get_pod(name)
        # Kept as the informer keeps it: a padded Pod is judged as its skeleton, however read.
        return None if pod is None else self.informer.write_through(pod)

    async def list_pods(self, label_selector: str) -> list[JSON]:
        return await self.api.list_pods(label_selector)

    async def patch_pod_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        return self.informer.write_through(await self.api.patch_pod_status(name, patch))

    async def create_event(self, event: Mapping[str, Any]) -> None:
        await self.api.create_event(event)


class Controller:
    def __init__(
        self,
        api: KubePort,
        settings: ControllerSettings,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        leadership: Leadership | None = None,
        commons: Commons | None = None,
    ) -> None:
        """`leadership`: an elector shared with other tenants' controllers, which then starts
        and stops this one's workers (`lead`, `follow`); None: this controller elects itself
        (or, with `leader_elect` off, leads from the start). `commons`: the fleet's shared view
        of every tenant's Pods, in place of `settings.other_tenants`' informers."""
        self.api = api
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.policy = PolicyView(settings.policy)
        self.queue = WorkQueue()
        self.metrics.follow_queue(self.queue)
        watch = settings.watch_timeout
        namespace = api.namespace
        self.namespace = namespace
        # Every informer of this tenant's controller lists and watches alike.
        new = InformerFactory(api, watch_timeout=watch)
        self.pods = new(
            Collection("pods", "Pod", namespace, label_selector=ENGINE_LABEL),
            self._on_pod,
            self._pods_listed,
            self._pods_failed,
            # The tenant decides how large its engine-labelled Pods are: one past the cap is
            # kept as a skeleton, and its verdict says so (`inference_policy.granting.kept_pod`).
            transform=_kept,
        )
        # The API server refuses this replica the Pod list (its Role or binding is gone): the
        # Pods are as known as they can be, and `rights` reports the loss.
        self.pods_refused = False
        # This tenant's Pods by the node they are bound to, for a neighbour's move there.
        self._on_node: dict[str, set[str]] = {}
        self._node_of: dict[str, str] = {}
        self.commons = commons
        self.neighbours: NeighbourView
        if commons is not None:
            self.neighbours = commons.join(
                namespace, self._neighbour_moved, self._inputs_read, self._pods_known
            )
        else:
            self.neighbours = Neighbours(
                new, settings.other_tenants, self._neighbour_moved, self._inputs_read
            )
        lease_namespace = settings.lease_namespace or settings.namespace
        self.rights = RightsMonitor(
            api,
            namespace,
            reporter_for(
                lease_namespace,
                settings.pod_name,
                settings.leader.name,
                CONTROLLER_NAME,
                settings.leader.identity,
            ),
            self.metrics,
            interval=settings.rights_seconds,
            clock=clock,
        )

        # The signed profile revisions and the configured recipe catalogs, into the feed.
        self.policy_informers = feed_informers(self.policy.feed, new, self._policy_changed)
        # Set whenever an input is read or found unreadable: the workers wait on it.
        self._inputs = asyncio.Event()
        self.elector = (
            LeaderElector(
                api,
                settings.leader,
                namespace=settings.lease_namespace or settings.namespace,
                on_started=self.lead,
                on_stopped=self.follow,
                monotonic=monotonic,
            )
            if settings.leader_elect and leadership is None
            else None
        )
        # Whoever says whether this replica may write: the shared elector, its own, or none.
        self.driven = leadership is not None
        self.leadership: Leadership | None = leadership or self.elector
        self.reconciler = Reconciler(
            CachedPods(api, self.pods),
            self.policy,
            ReconcileSettings(
                settings.scheduling_timeout,
                instance=settings.leader.identity,
                pause_before_patch=settings.fault_pause_before_patch,
            ),
            clock=clock,
            metrics=self.metrics,
            may_write=self.may_write,
            monotonic=monotonic,
            background_events=True,
            claims=api,
            neighbours=(
                self.neighbours.shares if commons is not None or settings.other_tenants else None
            ),
        )
        # The labelled ConfigMaps its feed refused by a cap: counted, and told as Events.
        self.capped = CapEvents(
            self.policy.feed,
            api,
            self.metrics.registry,
            may_write=self.may_write,
            controller=self.reconciler.settings.controller_name,
            instance=settings.leader.identity,
        )
        self._pod_revisions: dict[str, str | None] = {}
        self._departed: dict[str, str] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._starting: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.leading = False

    @property
    def informers(self) -> list[Informer]:
        return [self.pods, *self.policy_informers, *self.neighbours.informers]

    @property
    def synced(self) -> bool:
        """Every input is known: listed, or refused to this replica's Role, which the verdicts
        (a ConfigMap) or the rights report (the Pods, `allocation_controller.rights`) then say."""
        return self._pods_known() and self.policy.feed.ready and self.neighbours.synced

    @property
    def healthy(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    def lacking(self) -> list[str]:
        """What its rights review found missing, in a sentence (for /readyz); empty if none."""
        return [self.rights.summary()] if self.rights.missing else []

    def may_write(self) -> bool:
        return self.leadership is None or self.leadership.is_leader()

    # -- watch handlers ------------------------------------------------------------------------

    def _pods_known(self) -> bool:
        return self.pods.synced.is_set() or self.pods_refused

    def _pods_listed(self, informer: Informer) -> None:
        self.pods_refused = False
        self._inputs.set()
        if self.commons is not None:
            self.commons.read(self.namespace)

    def _pods_failed(self, exc: Exception) -> None:
        if not_permitted(exc) is not None:
            self.pods_refused = True
            self._inputs.set()
            self.rights.wake()
            if self.commons is not None:
                self.commons.read(self.namespace)

    def _inputs_read(self) -> None:
        self._inputs.set()

    def _neighbour_moved(self, node: str) -> None:
        for name in self._on_node.get(node, ()):
            self.queue.add(name)

    def _placed(self, name: str, node: str | None) -> None:
        before = self._node_of.pop(name, None)
        if before is not None and before != node:
            names = self._on_node.get(before)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._on_node[before]
        if node is not None:
            self._node_of[name] = node
            self._on_node.setdefault(node, set()).add(name)

    def _on_pod(self, delta: Delta) -> None:
        kind, pod, old = delta.type, delta.object, delta.old
        if self.commons is not None:
            # Before this tenant's own handling, which may fail on a malformed Pod.
            self.commons.seen(self.namespace, delta)
        view = PodView(pod)
        name, uid = str(view.name), str(view.uid)
        self._placed(name, None if kind == "DELETED" else view.node_name)
        if kind == "DELETED":
            self.reconciler.forget(uid)
            self._pod_revisions.pop(name, None)
            self.queue.cancel_timer(name)
            # Gone from the watch: deleted, or its engine label removed. The event cannot tell:
            # the API server sends a Pod that leaves the label selection as DELETED with its
            # previous state (label and all), and a deletion under way says nothing, since the
            # tenant can hold a terminating Pod with a finalizer or a long grace period. One
            # fresh read settles it (a deleted Pod reads 404 and is skipped).
            self._departed[name] = uid
            self.queue.add(DEPARTED + name)
            return
        if view.node_name:
            self.reconciler.note_bound(uid)
        before = PodView(old).annotations.get(PLAN_ANNOTATION)
        if old is None or before != view.annotations.get(PLAN_ANNOTATION):
            self._pod_revisions[name] = plan_revision(pod)
        self.queue.add(name)

    def _policy_changed(self, change: FeedChange) -> None:
        # The workers wait on `_inputs`, so it is set first: an exception in what follows must
        # not leave a new leader waiting.
        self._inputs.set()
        self.capped.changed()
        if change:
            self._revisions_changed(None if change.whole else change.digests)

    def _revisions_changed(self, changed: frozenset[str] | None) -> None:
        """Count the revisions, and recheck the Pods planned with a changed one (None: all)."""
        verified = sum(isinstance(r, VerifiedProfile) for r in self.policy.revisions.values())
        self.metrics.count_revisions(
            self.namespace, verified, len(self.policy.revisions) - verified
        )
        if changed is None:
            self._recheck_all()
            return
        for pod, digest in self._pod_revisions.items():
            if digest in changed:
                self.queue.add(pod)

    def _recheck_all(self) -> None:
        for pod in self.pods.store.names():
            self.queue.add(pod)

    # -- leadership ----------------------------------------------------------------------------

    def lead(self) -> None:
        """This replica leads: start the workers once every input has been read."""
        if self.leading:
            return
        self.leading = True
        self.metrics.is_leader.set(1)
        self._starting = asyncio.get_running_loop().create_task(self._start_workers())

    def follow(self) -> None:
        """This replica no longer leads: stop the workers and drop the queue."""
        self.leading = False
        self.metrics.is_leader.set(0)
        self._stop_workers()
        self.queue.clear()

    async def _start_workers(self) -> None:
        while not self.synced:
            self._inputs.clear()
            await self._inputs.wait()
        if not self.leading:
            return
        for name in self.pods.store.names():
            self.queue.add(name)
        self._workers = [
            asyncio.get_running_loop().create_task(self._work(), name=f"worker-{i}")
            for i in range(self.settings.workers)
        ]
        log.info("started %d workers over %d engine Pods", len(self._workers), len(self.pods.store))

    def _stop_workers(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None
        for task in self._workers:
            task.cancel()
        self._workers = []

    async def _reconcile(self, key: str) -> Result:
        if key.startswith(DEPARTED):
            name = key.removeprefix(DEPARTED)
            uid = self._departed.get(name)
            if uid is None:
                return Result("skipped")
            result = await self.reconciler.reconcile_departed(name, uid)
            self._departed.pop(name, None)
            return result
        return await self.reconciler.reconcile(key)

    async def _work(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            started = time.perf_counter()
            outcome = "error"
            try:
                async with asyncio.timeout(self.settings.reconcile_timeout):
                    result = await self._reconcile(key)
            except NotLeader:
                outcome = "not-leader"
            except asyncio.CancelledError:
                self.queue.done(key)
                raise
            except Exception as exc:
                if not_permitted(exc) is not None:
                    # A status patch or a Pod read refused: the binding may be gone.
                    self.rights.wake()
                delay = self.queue.add_rate_limited(key)
                log.warning(
                    "reconcile of Pod %s failed (%s: %s); retrying in %.2fs",
                    key,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            else:
                outcome = result.outcome
                self.queue.forget(key)
                self.queue.cancel_timer(key)
                if result.requeue_after is not None:
                    self.queue.add_after(key, result.requeue_after)
            finally:
                self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
                self.metrics.reconciles.labels(outcome).inc()
            self.queue.done(key)

    # -- running -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Watch, elect, reconcile until `stop` is set; then release the Lease and stop. Driven
        by a shared elector, it neither elects nor leads by itself: the fleet says when."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(informer.run(), name=f"informer-{informer.what}")
            for informer in self.informers
        ]
        self._tasks.append(loop.create_task(self.rights.run(), name="rights"))
        if self.elector is not None:
            self._tasks.append(loop.create_task(self.elector.run(stop), name="leader-election"))
        elif not self.driven:
            self.lead()
        try:
            await stop.wait()
        finally:
            if self.elector is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(self._tasks[-1], timeout=5)
            self.follow()
            self.queue.shutdown()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.reconciler.drain_events(), timeout=5)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
