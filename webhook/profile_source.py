"""The webhook's planning state: the policy feed's snapshot, and the decisions made on it.

`PolicyStore` holds what every request reads, and changes only when a ConfigMap arrives, changes
or disappears: its `policy_io.feed.PolicyFeed` verifies the signed profile once per revision
(the ConfigMap's uid and resourceVersion, so a resync or a reconnect costs a dictionary
lookup), loads the recipe catalogs, and takes a read the API server refuses as a refusal that
says why. A source keeps the feed current: `KubernetesSource` runs the shared informers
(`serving.revisions`) on the event loop, so a slow or unreachable API server delays the next
revision but never a request; tests feed it from dicts through a source of their own.

Decisions are memoised by the exact request text: a decision depends only on the request, the
feed's snapshot (any change is a new generation and clears the memo) and, through the profile's
validity window, the clock, so a memoised decision is used only while the clock is inside the
window it was made in. Replicas of one deployment carry the same request, so a scale-up plans
once. A recipe catalog that is configured but missing or unusable refuses local deployments
with 503, which the core decides from what the feed hands it
(`inference_policy.planning.recipe_inputs`). The owner's quota (`serving.quota`) is never part of a
memoised decision: it is judged on each planned Pod afresh (`quota_refusal`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from inference_policy.base import strictjson
from inference_policy.base.bounded import keep
from inference_policy.base.wire import ENGINE_LABEL
from inference_policy.placing.quota import Refusal, plan_usage
from inference_policy.planning.catalog import EngineCatalog
from inference_policy.planning.plan import Plan
from inference_policy.planning.planner import Decision
from inference_policy.planning.room import (
    ROOM_CONFIGMAP,
    ROOM_KEY,
    Room,
    RoomError,
    RoomFigures,
    live,
    parse_figures,
)
from policy_io.feed import PolicyFeed
from policy_io.state import PolicySettings, PolicyState
from serving.informer import Collection, Delta, Informer, InformerFactory, Informers, ListWatch
from serving.kube import not_permitted
from serving.quota import TenantQuota, quota_informers
from serving.revisions import NewInformer, feed_informers

log = logging.getLogger(__name__)
MEMO_ENTRIES = 1024
MEMO_MAX_TEXT = 16 * 1024
K = TypeVar("K", str, bytes, str | bytes)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Planned:
    """A request text decided: its strict-JSON error, or the decision."""

    error: str | None
    decision: Decision | None


class PolicyStore:
    """The planning state of one webhook process, and which of its inputs have been read."""

    def __init__(
        self,
        settings: PolicySettings,
        catalog: EngineCatalog | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or (lambda: datetime.now(UTC))
        # With tenant mode off nothing is read: every request is answered without a profile.
        self.feed = PolicyFeed(
            settings,
            catalog,
            profile=settings.enabled,
            recipes=settings.enabled,
            clock=self.clock,
        )
        self._window_generation = -1
        self._window: tuple[datetime, datetime] | None = None
        # The owner's room figures as last read (`inference_policy.planning.room`): None, and why,
        # when none could be; `room_generation` moves only when what a choice reads of them does.
        self.room_figures: RoomFigures | None = None
        self.room_unreadable: str | None = None
        self.room_generation = 0
        self.plans: Memo[str | bytes, Planned] = Memo(self)
        # The owner's quota for the namespace and what its engine Pods hold (`serving.quota`),
        # once a source follows them; None: no quota is known, and none refuses.
        self.quota: TenantQuota | None = None

    @property
    def state(self) -> PolicyState:
        """The settings, engine catalog and owner keys the feed plans with."""
        return self.feed.state

    @property
    def names(self) -> list[str]:
        """The ConfigMaps this store reads by name, in the namespace of the settings."""
        return self.feed.names

    @property
    def follows(self) -> bool:
        """The profile is the newest of every signed revision, not one ConfigMap by name."""
        return self.feed.follows

    @property
    def ready(self) -> bool:
        """Every configured input has been read once, whether it was found or not."""
        return self.feed.ready

    @property
    def generation(self) -> int:
        return self.feed.generation

    def room_read(self, configmap: Mapping[str, Any] | None, why: str | None = None) -> None:
        """The room ConfigMap as a watch or list found it (None: absent, or `why` not)."""
        figures, unreadable = None, why
        if configmap is not None:
            text = (configmap.get("data") or {}).get(ROOM_KEY)
            try:
                if not isinstance(text, str):
                    raise RoomError(f"{ROOM_CONFIGMAP} has no {ROOM_KEY} key")
                figures = parse_figures(text)
            except RoomError as exc:
                unreadable = str(exc)
                log.warning("%s", exc, extra={"code": "room-unreadable"})
        before = self.room_figures
        if figures is None or before is None or _choosing(figures) != _choosing(before):
            self.room_generation += 1
        self.room_figures, self.room_unreadable = figures, unreadable

    def room(self, now: datetime) -> Room | None:
        """The room this instant's decisions choose with (`inference_policy.planning.room.live`);
        None while no figures are published at all, so plans record no choice, as without spill."""
        if self.room_figures is None and self.room_unreadable is None:
            return None
        profile = self.feed.snapshot.profile
        return live(
            self.room_figures,
            profile.sha256 if profile is not None else None,
            now,
            unreadable=self.room_unreadable,
        )

    def epoch(self, now: datetime) -> tuple[int, int, bool] | None:
        """What a memoised answer made now may be reused under: the inputs' generation and
        the room's (and whether the room is usable now), or None when the clock is outside the
        profile's validity window (nothing is memoised then, so the window refusal is always
        decided afresh)."""
        generation = self.feed.generation
        if self._window_generation != generation:
            self._window_generation = generation
            profile = self.feed.snapshot.profile
            self._window = profile.usable_window() if profile is not None else None
        window = self._window
        if window is not None and not window[0] <= now < window[1]:
            return None
        room = self.room(now)
        return generation, self.room_generation, room is not None and room.largest is not None

    def plan_text(self, text: str | bytes, what: str, now: datetime, max_bytes: int) -> Planned:
        """Decode a request strictly and decide it, or reuse the decision for the same text."""
        found = self.plans.get(text, now)
        if found is not None:
            return found
        try:
            document = strictjson.loads(text, max_bytes=max_bytes, what=what)
        except strictjson.StrictJSONError as exc:
            planned = Planned(str(exc), None)
        else:
            decision = self.decide(document, now)
            planned = Planned(None, decision)
        self.plans.put(text, planned, now)
        return planned

    def quota_refusal(self, plan: Plan) -> Refusal | None:
        """The owner's quota refusing one more Pod planned with `plan`
        (`inference_policy.placing.quota`), or None. Decided afresh each time, never memoised: what
        the namespace holds moves with every Pod. A quota not known, or unreadable, refuses nothing
        here: the owner's native quota and extender hold the tenant to it whatever this webhook
        answers."""
        quota = self.quota
        if quota is None or not quota.ready or quota.unreadable is not None:
            return None
        return quota.refusal(plan_usage(plan))

    def decide(self, request: Any, now: datetime | None = None) -> Decision:
        """The core's decision on the feed's current snapshot and the room figures."""
        now = now or self.clock()
        return self.feed.snapshot.decide(request, now, self.room(now))


def _choosing(figures: RoomFigures) -> tuple[str, Mapping[str, int]]:
    """What a choice reads of the figures: their revision and each binding's largest room."""
    return figures.bundle, figures.largest


class Memo(Generic[K, V]):
    """Answers remembered for as long as the store's epoch (inputs and window) holds.

    Bounded in entries and key size; when full it starts over, which a burst of identical
    requests refills at once and which keeps every operation O(1).
    """

    def __init__(
        self, store: PolicyStore, entries: int = MEMO_ENTRIES, max_key: int = MEMO_MAX_TEXT
    ) -> None:
        self.store = store
        self.entries = entries
        self.max_key = max_key
        self._values: dict[K, V] = {}
        self._epoch: object = None
        self.hits = 0

    def _current(self, now: datetime) -> bool:
        epoch = self.store.epoch(now)
        if epoch is None:
            return False
        if epoch != self._epoch:
            self._values.clear()
            self._epoch = epoch
        return True

    def get(self, key: K, now: datetime) -> V | None:
        if not self._current(now):
            return None
        value = self._values.get(key)
        if value is not None:
            self.hits += 1
        return value

    def put(self, key: K, value: V, now: datetime) -> None:
        if len(key) > self.max_key or not self._current(now):
            return
        keep(self._values, key, value, self.entries)


class ConfigMapSource(Protocol):
    """Something that keeps a store's feed current until stopped."""

    async def start(self, store: PolicyStore) -> None: ...

    async def stop(self) -> None: ...


class KubernetesSource:
    """The feed's informers (`serving.revisions`), each relisted every `resync_seconds`, over
    one client that the source owns and closes when stopped."""

    def __init__(
        self,
        namespace: str,
        api: ListWatch | None,
        resync_seconds: int = 300,
        *,
        backoff_seconds: float = 1.0,
    ) -> None:
        self.namespace = namespace
        self.api = api
        self.resync_seconds = resync_seconds
        self.backoff_seconds = backoff_seconds
        self.informers: Informers | None = None

    @property
    def errors(self) -> int:
        return self.informers.errors if self.informers is not None else 0

    async def start(self, store: PolicyStore) -> None:
        if not store.feed.inputs:
            return
        api = self.api
        if api is None:
            raise ValueError("ConfigMaps to read, but no API server client")
        self.informers = Informers(api)

        new = InformerFactory(
            api,
            watch_timeout=self.resync_seconds,
            relist_seconds=self.resync_seconds,
            backoff=self.backoff_seconds,
            max_backoff=30.0 * self.backoff_seconds,
        )

        for informer in feed_informers(store.feed, new):
            self.informers.add(informer)
        if store.settings.enabled:
            self.informers.add(_room_informer(store, self.namespace, new))
            store.quota = TenantQuota(self.namespace)
            for informer in quota_informers(store.quota, new, engine_pods(self.namespace)):
                self.informers.add(informer)
        self.informers.start()

    async def stop(self) -> None:
        if self.informers is not None:
            await self.informers.stop()


def engine_pods(namespace: str) -> Collection:
    """The namespace's engine Pods that have not terminated, Pending ones included: what the
    native quota counts at create, so the webhook refuses what the API server would."""
    return Collection(
        "pods",
        "Pod",
        namespace,
        label_selector=ENGINE_LABEL,
        field_selector="status.phase!=Succeeded,status.phase!=Failed",
    )


def _room_informer(store: PolicyStore, namespace: str, new: NewInformer) -> Informer:
    """The owner's room figures in the webhook's namespace, by name; a read the Role refuses
    leaves the store planning the smallest binding that fits, and saying why."""

    def changed(delta: Delta) -> None:
        if not delta.listed:
            store.room_read(None if delta.type == "DELETED" else delta.object)

    def listed(informer: Informer) -> None:
        store.room_read(informer.store.get(ROOM_CONFIGMAP))

    def failed(exc: Exception) -> None:
        why = not_permitted(exc)
        if why is not None:
            store.room_read(None, f"{ROOM_CONFIGMAP} {why}")

    collection = Collection(
        "configmaps", "ConfigMap", namespace, field_selector=f"metadata.name={ROOM_CONFIGMAP}"
    )
    return new(collection, changed, listed, failed)
