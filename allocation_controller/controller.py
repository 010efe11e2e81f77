"""The running controller: informers feed a work queue, workers reconcile, one leader writes.

Every replica lists and watches (so a follower's cache is warm when it takes over), but only the
Lease holder runs workers. On winning the Lease a replica waits until every informer has listed
once (a Pod checked before the profile ConfigMaps are read would be reported against an unknown
revision), then queues every engine Pod, because it cannot know what the previous leader left
undone. On losing it the workers stop and the queue is dropped. A ConfigMap informer whose list
or watch the API server refuses to this replica's credentials or Role (401 or 403) counts as
listed, with nothing readable: the Pods are still checked, and their verdicts name the refusal
and the Role to fix, rather than the controller waiting unready with nothing written (the
webhook and the extender treat the same refusal so). The informer lists again after such a
refusal (`serving.informer`), and that list hands everything back once the read is allowed.

What wakes a Pod up:

* any watch event for it (the reconcile is level-based, so a status-only change costs a pure
  check and no write);
* a profile revision appearing, changing or disappearing, for the Pods planned under it;
* a recipe catalog changing, for every Pod;
* the API server refusing, or again allowing, a read of the profile ConfigMaps or a recipe
  catalog, for every Pod;
* its own timer: the scheduling deadline, or its revision's expiry;
* a failed reconcile, after a per-Pod exponential backoff;
* leaving the watch without being deleted (its engine label removed): one fresh read, and a
  verified Pod that is no longer an engine Pod is marked False, since it is no longer re-checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from allocation_controller.config import ControllerSettings
from allocation_controller.leader import LeaderElector
from allocation_controller.metrics import Metrics
from allocation_controller.ports import JSON, KubePort, PodPort
from allocation_controller.reconciler import NotLeader, Reconciler, ReconcileSettings, Result
from allocation_controller.revisions import PolicyView
from allocation_controller.workqueue import ShutDown, WorkQueue
from inference_policy.grant import node_name, plan_revision
from inference_policy.signing import VerifiedProfile
from inference_policy.wire import ENGINE_LABEL, PLAN_ANNOTATION
from policy_io.state import PROFILE_SELECTOR
from serving.informer import Collection, Delta, Informer, ObjectStore
from serving.kube import not_permitted

log = logging.getLogger(__name__)
# Queue keys are Pod names; a Pod that left the watch is queued under this prefix, which no Pod
# name can carry (names are DNS subdomains).
DEPARTED = "departed/"


class CachedPods:
    """The reconciler's PodPort: reads come from the Pod informer's store, writes go to the API
    server and what they return goes into the store, so the next read sees the write."""

    def __init__(self, api: PodPort, store: ObjectStore) -> None:
        self.api = api
        self.store = store

    @property
    def namespace(self) -> str:
        return self.api.namespace

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        if not fresh:
            return self.store.get(name)
        pod = await self.api.get_pod(name)
        if pod is not None:
            self.store.write_through(pod)
        return pod

    async def list_pods(self, label_selector: str) -> list[JSON]:
        return await self.api.list_pods(label_selector)

    async def patch_pod_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        updated = await self.api.patch_pod_status(name, patch)
        self.store.write_through(updated)
        return updated

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
    ) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.policy = PolicyView(settings.policy)
        self.queue = WorkQueue()
        watch = settings.watch_timeout
        namespace = api.namespace
        self.pods = Informer(
            api,
            Collection("pods", "Pod", namespace, label_selector=ENGINE_LABEL),
            self._on_pod,
            watch_timeout=watch,
            on_listed=lambda _: self._inputs.set(),
        )
        self.profiles = Informer(
            api,
            Collection("configmaps", "ConfigMap", namespace, label_selector=PROFILE_SELECTOR),
            self._on_profile,
            watch_timeout=watch,
            on_listed=self._profiles_listed,
            on_error=self._profiles_failed,
        )
        self.recipes = {
            capability: Informer(
                api,
                Collection(
                    "configmaps", "ConfigMap", namespace, field_selector=f"metadata.name={name}"
                ),
                partial(self._on_recipe, capability),
                watch_timeout=watch,
                on_listed=partial(self._recipe_listed, capability),
                on_error=partial(self._recipe_failed, capability),
            )
            for capability, name in self.policy.recipe_names.items()
        }
        # ConfigMap informers whose last list the API server refused to this replica's Role:
        # what they would hold is known to be unreadable, and every Pod's verdict says so.
        self._unreadable: set[Informer] = set()
        # Set whenever an informer lists or is found unreadable: the workers wait on it.
        self._inputs = asyncio.Event()
        self.elector = (
            LeaderElector(
                api,
                settings.leader,
                namespace=settings.namespace,
                on_started=self._lead,
                on_stopped=self._follow,
                monotonic=monotonic,
            )
            if settings.leader_elect
            else None
        )
        self.reconciler = Reconciler(
            CachedPods(api, self.pods.store),
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
        )
        self._pod_revisions: dict[str, str | None] = {}
        self._departed: dict[str, str] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._starting: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.leading = False

    @property
    def informers(self) -> list[Informer]:
        return [self.pods, self.profiles, *self.recipes.values()]

    @property
    def synced(self) -> bool:
        """Every input is known: listed, or (a ConfigMap) refused to this replica's Role, which
        the verdicts then report; the Pods themselves must have been listed."""
        return self.pods.synced.is_set() and all(
            informer.synced.is_set() or informer in self._unreadable for informer in self.informers
        )

    @property
    def healthy(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    def may_write(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    # -- watch handlers ------------------------------------------------------------------------

    def _on_pod(self, delta: Delta) -> None:
        kind, pod, old = delta.type, delta.object, delta.old
        metadata = pod.get("metadata") or {}
        name, uid = str(metadata.get("name")), str(metadata.get("uid"))
        if kind == "DELETED":
            self.reconciler.forget(uid)
            self._pod_revisions.pop(name, None)
            self.queue.cancel_timer(name)
            if not metadata.get("deletionTimestamp"):
                # Gone from the watch without being deleted (as far as the event says): perhaps
                # only its label was removed. One fresh read settles it.
                self._departed[name] = uid
                self.queue.add(DEPARTED + name)
            return
        if node_name(pod):
            self.reconciler.note_bound(uid)
        before = ((old or {}).get("metadata") or {}).get("annotations") or {}
        after = metadata.get("annotations") or {}
        if old is None or before.get(PLAN_ANNOTATION) != after.get(PLAN_ANNOTATION):
            self._pod_revisions[name] = plan_revision(pod)
        self.queue.add(name)

    def _on_profile(self, delta: Delta) -> None:
        configmap = delta.object
        name = str((configmap.get("metadata") or {}).get("name"))
        if delta.type == "DELETED":
            changed = self.policy.remove_configmap(name)
        else:
            changed = self.policy.apply_configmap(configmap)
        self._revisions_changed(changed)

    def _revisions_changed(self, changed: set[str] | None) -> None:
        """Count the revisions, and recheck the Pods planned with a changed one (None: all)."""
        verified = sum(isinstance(r, VerifiedProfile) for r in self.policy.revisions.values())
        self.metrics.revisions.labels("verified").set(verified)
        self.metrics.revisions.labels("refused").set(len(self.policy.revisions) - verified)
        if changed is None:
            self._recheck_all()
            return
        for pod, digest in self._pod_revisions.items():
            if digest in changed:
                self.queue.add(pod)

    def _recheck_all(self) -> None:
        for pod in self.pods.store.names():
            self.queue.add(pod)

    # A ConfigMap informer's list or refusal. The workers wait on `_inputs`, so it is set first:
    # an exception in what follows must not leave a new leader waiting.

    def _listed_after_refusal(self, informer: Informer) -> bool:
        """The informer listed; True if the API server had refused it before."""
        self._inputs.set()
        refused = informer in self._unreadable
        self._unreadable.discard(informer)
        return refused

    def _refusal(self, informer: Informer, exc: Exception) -> str | None:
        """Why the informer's read was refused to this replica's Role, if that is what failed
        (`serving.kube.not_permitted`); its inputs then count as known, with nothing readable."""
        why = not_permitted(exc)
        if why is not None:
            self._unreadable.add(informer)
            self._inputs.set()
        return why

    def _profiles_listed(self, informer: Informer) -> None:
        if self._listed_after_refusal(informer):
            configmaps = [informer.store.get(name) for name in informer.store.names()]
            self.policy.profiles_listed([c for c in configmaps if c is not None])
            self._revisions_changed(None)

    def _profiles_failed(self, exc: Exception) -> None:
        why = self._refusal(self.profiles, exc)
        if why is not None and self.policy.profiles_not_permitted(why):
            self._revisions_changed(None)

    def _on_recipe(self, capability: str, delta: Delta) -> None:
        self._recipe_changed(capability, None if delta.type == "DELETED" else delta.object)

    def _recipe_changed(self, capability: str, configmap: JSON | None) -> None:
        if self.policy.apply_recipe_catalog(capability, configmap):
            self._recheck_all()

    def _recipe_listed(self, capability: str, informer: Informer) -> None:
        # A list without the catalog delivers nothing, yet "not found" is news on the first one;
        # after a refused list, what it holds is news again.
        if self._listed_after_refusal(informer) or not len(informer.store):
            name = self.policy.recipe_names[capability]
            self._recipe_changed(capability, informer.store.get(name))

    def _recipe_failed(self, capability: str, exc: Exception) -> None:
        why = self._refusal(self.recipes[capability], exc)
        if why is not None and self.policy.recipe_catalog_unusable(capability, why):
            self._recheck_all()

    # -- leadership ----------------------------------------------------------------------------

    def _lead(self) -> None:
        self.leading = True
        self.metrics.is_leader.set(1)
        self._starting = asyncio.get_running_loop().create_task(self._start_workers())

    def _follow(self) -> None:
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
                self.metrics.queue_depth.set(len(self.queue))
            self.queue.done(key)

    # -- running -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Watch, elect, reconcile until `stop` is set; then release the Lease and stop."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(informer.run(), name=f"informer-{informer.what}")
            for informer in self.informers
        ]
        if self.elector is not None:
            self._tasks.append(loop.create_task(self.elector.run(stop), name="leader-election"))
        else:
            self._lead()
        try:
            await stop.wait()
        finally:
            if self.elector is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(self._tasks[-1], timeout=5)
            self._follow()
            self.queue.shutdown()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.reconciler.drain_events(), timeout=5)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
