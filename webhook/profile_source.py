"""Where the webhook's planning state comes from: the signed profile and recipe catalog ConfigMaps.

`PolicyStore` holds the state every request reads, and changes only when a ConfigMap arrives,
changes or disappears. Sources feed it: `KubernetesSource` lists and watches the ConfigMaps
through the API server with the shared informer, on the event loop, so a slow or unreachable API
server delays the next revision but never a request; `MemorySource` feeds it from dicts, so
tests exercise the same store without an API server.

A profile is verified once per revision (the ConfigMap's uid and resourceVersion): revisions are
immutable, so re-reading one (a resync, a reconnect) costs a dictionary lookup. Decisions are
memoised by the exact request text: a decision depends only on the request, the inputs read
here (any change clears the memo) and, through the profile's validity window, the clock, so a
memoised decision is used only while the clock is inside the window it was made in. Replicas
of one deployment carry the same request, so a scale-up plans once. A recipe catalog
that is configured but missing or unusable refuses local deployments with 503 rather than
letting them fall back to derivation, because the seed forbids silent fallbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Generic, Protocol, TypeVar

from inference_policy import strictjson
from inference_policy.bounded import keep
from inference_policy.catalog import EngineCatalog
from inference_policy.planner import Decision
from inference_policy.recipes import RecipeCatalogError, load_catalog
from inference_policy.refusals import RefusalCode
from inference_policy.signing import DEFAULT_SKEW
from policy_io.catalog import packaged_catalog
from policy_io.state import PROFILE_LABEL, PolicySettings, PolicyState, revision_of
from serving.informer import Collection, Delta, Informer, Informers, ListWatch
from serving.kube import not_permitted
from serving.revisions import ProfileRevisionFeed

log = logging.getLogger(__name__)
PROFILE = "profile"
REVISIONS = "profile revisions"
CAPABILITIES = ("gpu", "cpu")
ARRIVAL = "did not arrive from the configured ConfigMap"
MEMO_ENTRIES = 1024
MEMO_MAX_TEXT = 16 * 1024
K = TypeVar("K", str, bytes, str | bytes)
V = TypeVar("V")


class Planned:
    """A request text decided: its strict-JSON error, or the decision (and a plan's JSON).
    Final attributes; a plain class for the compiled build (setup.py)."""

    def __init__(
        self, error: str | None, decision: Decision | None, plan_json: str | None = None
    ) -> None:
        self.error: Final = error
        self.decision: Final = decision
        self.plan_json: Final = plan_json


class PolicyStore:
    """The planning state of one webhook process, and which of its inputs have been read."""

    def __init__(
        self,
        settings: PolicySettings,
        catalog: EngineCatalog | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.settings = settings
        self.state = PolicyState(settings, catalog or packaged_catalog())
        self.clock = clock or (lambda: datetime.now(UTC))
        self.roles: dict[str, str] = {}
        # Following the newest signed revision, the profile is every labelled ConfigMap rather
        # than one by name (`apply_revision`, `apply_revisions`).
        self.follows = settings.enabled and settings.follow_revisions
        if settings.enabled:
            if not self.follows:
                self.roles[settings.bundle_configmap] = PROFILE
            for capability in CAPABILITIES:
                name = getattr(settings, f"{capability}_recipe_catalog_configmap")
                if name:
                    self.roles[name] = capability
        self.catalog_refusals: dict[str, str | None] = {
            role: f"recipe catalog: {role} recipe catalog {ARRIVAL}: it has not been read yet"
            for role in self.roles.values()
            if role != PROFILE
        }
        self._catalog_revisions: dict[str, str | None] = {}
        self.synced: set[str] = set()
        self.catalog_loads = 0
        self.generation = 0
        self._window_generation = -1
        self._window: tuple[datetime, datetime] | None = None
        self.plans: Memo[str | bytes, Planned] = Memo(self)

    @property
    def names(self) -> list[str]:
        """The ConfigMaps this store needs, in the namespace of the settings."""
        return list(self.roles)

    @property
    def ready(self) -> bool:
        """Every configured input has been read once, whether it was found or not."""
        return all(name in self.synced for name in self.roles) and (
            not self.follows or REVISIONS in self.synced
        )

    def apply_revision(self, name: str, configmap: Mapping[str, Any] | None) -> None:
        """Follow mode: one signed profile ConfigMap as a watch event has it (None: deleted)."""
        if self.state.follow(name, configmap):
            self.generation += 1

    def apply_revisions(self, configmaps: Mapping[str, Mapping[str, Any]]) -> None:
        """Follow mode: every signed profile ConfigMap, as a complete list returned them."""
        self.synced.add(REVISIONS)
        if self.state.follow_list(configmaps):
            self.generation += 1

    def revisions_not_permitted(self, why: str) -> None:
        """Follow mode: the Role does not let this server list the signed profile ConfigMaps
        (`serving.kube.not_permitted`); the profile did not arrive, and the refusal says why."""
        self.synced.add(REVISIONS)
        self.state.revisions_not_permitted(why)
        self.generation += 1

    def apply(self, name: str, configmap: Mapping[str, Any] | None, why: str | None = None) -> None:
        """A ConfigMap as read now (None: it does not exist). Never raises: it runs as a loop
        callback, and an input it cannot use must become a refusal, not a dead watch."""
        role = self.roles.get(name)
        if role is None:
            return
        before = self._inputs()
        try:
            self._apply(name, role, configmap, why)
        except Exception as exc:
            log.exception("ConfigMap %s could not be used", name)
            check = f"ConfigMap {name!r} could not be read: {type(exc).__name__}"
            if role == PROFILE:
                self.state.profile_missing(check)
            else:
                self._set_recipes(
                    role, None, f"recipe catalog: {role} recipe catalog {ARRIVAL}: {check}"
                )
        after = self._inputs()
        # Compared by identity, holding the objects: an id() could be reused by a new object.
        if any(a is not b for a, b in zip(before[:-1], after[:-1], strict=True)) or (
            before[-1] != after[-1]
        ):
            self.generation += 1

    def _inputs(self) -> tuple[Any, ...]:
        state = self.state
        return (
            state.profile,
            state.profile_refusal,
            state.gpu_recipes,
            state.cpu_recipes,
            tuple(self.catalog_refusals.values()),
        )

    def _apply(
        self, name: str, role: str, configmap: Mapping[str, Any] | None, why: str | None
    ) -> None:
        self.synced.add(name)
        where = f"ConfigMap {name!r} {why or 'was not found'} in namespace " + repr(
            self.settings.namespace
        )
        if role == PROFILE:
            if configmap is None:
                self.state.profile_missing(where)
            elif self.state.read_profile(configmap, self.clock()):
                self._log_profile(name)
            return
        self._apply_catalog(role, name, configmap, where)

    def _apply_catalog(
        self, capability: str, name: str, configmap: Mapping[str, Any] | None, where: str
    ) -> None:
        prefix = f"recipe catalog: {capability} recipe catalog {ARRIVAL}: "
        if configmap is None:
            self._set_recipes(capability, None, prefix + where)
            self._catalog_revisions.pop(capability, None)
            return
        revision = revision_of(configmap)
        if revision is not None and self._catalog_revisions.get(capability) == revision:
            return
        self._catalog_revisions[capability] = revision
        self.catalog_loads += 1
        metadata = configmap.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
        if namespace not in (None, self.settings.namespace):
            self._set_recipes(capability, None, prefix + f"ConfigMap is in {namespace!r}")
            return
        try:
            recipes = load_catalog(dict(configmap), capability)
        except RecipeCatalogError as exc:
            self._set_recipes(capability, None, prefix + str(exc))
            return
        self._set_recipes(capability, recipes, None)
        log.info("loaded %s recipe catalog %s (%d recipes)", capability, name, len(recipes.recipes))

    def _set_recipes(self, capability: str, recipes: Any, refusal: str | None) -> None:
        setattr(self.state, f"{capability}_recipes", recipes)
        self.catalog_refusals[capability] = refusal
        if refusal:
            log.warning("%s", refusal)

    def _log_profile(self, name: str) -> None:
        self.state.log_verdict(name)

    def epoch(self, now: datetime) -> int | None:
        """What a memoised answer made now may be reused under: the inputs' generation, or
        None when the clock is outside the profile's validity window (nothing is memoised
        then, so the window refusal is always decided afresh)."""
        if self._window_generation != self.generation:
            self._window_generation = self.generation
            profile = self.state.profile
            self._window = (
                (profile.envelope.issued_at - DEFAULT_SKEW, profile.envelope.expires_at)
                if profile is not None
                else None
            )
        window = self._window
        if window is not None and not window[0] <= now < window[1]:
            return None
        return self.generation

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
            plan_json = decision.plan.text() if decision.plan is not None else None
            planned = Planned(None, decision, plan_json)
        self.plans.put(text, planned, now)
        return planned

    def decide(self, request: Any, now: datetime | None = None) -> Decision:
        """The core's decision, unless a configured recipe catalog is missing or unusable."""
        decision = self.state.decide(request, now or self.clock())
        if self.settings.enabled and (decision.plan is None or decision.plan.local):
            for capability in CAPABILITIES:
                refusal = self.catalog_refusals.get(capability)
                if refusal:
                    return Decision.refused(503, refusal, RefusalCode.CATALOG_UNAVAILABLE)
        return decision


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
        self._epoch = -1
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
    """Something that keeps a store's ConfigMaps current until stopped."""

    async def start(self, store: PolicyStore) -> None: ...

    async def stop(self) -> None: ...


def _is_profile(configmap: Mapping[str, Any] | None) -> bool:
    metadata = configmap.get("metadata") if configmap is not None else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(PROFILE_LABEL) == "true"


class MemorySource:
    """ConfigMaps from memory: what tests and the benchmark use instead of an API server."""

    def __init__(self, configmaps: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.configmaps: dict[str, Mapping[str, Any]] = dict(configmaps or {})
        self.store: PolicyStore | None = None

    async def start(self, store: PolicyStore) -> None:
        self.store = store
        for name in store.names:
            store.apply(name, self.configmaps.get(name))
        if store.follows:
            store.apply_revisions({n: c for n, c in self.configmaps.items() if _is_profile(c)})

    def put(self, name: str, configmap: Mapping[str, Any] | None) -> None:
        """Create, replace (None: delete) a ConfigMap, as a watch event would."""
        previous = self.configmaps.get(name)
        if configmap is None:
            self.configmaps.pop(name, None)
        else:
            self.configmaps[name] = configmap
        if self.store is not None:
            self.store.apply(name, configmap)
            if self.store.follows and (_is_profile(configmap) or _is_profile(previous)):
                self.store.apply_revision(name, configmap if _is_profile(configmap) else None)

    async def stop(self) -> None:
        self.store = None


class KubernetesSource:
    """Each ConfigMap by name through an informer of its own (`serving.informer`), relisted
    every `resync_seconds`. Watching by `metadata.name` lets the Role name the ConfigMaps it may
    read (`resourceNames`) instead of every ConfigMap in the namespace. The source owns `api`
    and closes it when stopped."""

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
        if not store.names and not store.follows:
            return
        if self.api is None:
            raise ValueError("ConfigMaps to read, but no API server client")
        self.informers = Informers(self.api)
        for name in store.names:
            self.informers.add(self._informer(store, name, self.api))
        if store.follows:
            self.informers.add(self._revisions(store, self.api))
        self.informers.start()

    def _revisions(self, store: PolicyStore, api: ListWatch) -> Informer:
        """Every signed profile ConfigMap of the namespace, by label (follow mode)."""

        def failed(exc: Exception) -> None:
            why = not_permitted(exc)
            if why is not None:
                store.revisions_not_permitted(why)

        feed = ProfileRevisionFeed(self.namespace, store.apply_revision, store.apply_revisions)
        return self._new(api, feed.collection, feed.changed, feed.listed, failed)

    async def stop(self) -> None:
        if self.informers is not None:
            await self.informers.stop()

    def _new(
        self,
        api: ListWatch,
        collection: Collection,
        changed: Callable[[Delta], None],
        listed: Callable[[Informer], None],
        failed: Callable[[Exception], None],
    ) -> Informer:
        """An informer relisted every `resync_seconds`, backing off from `backoff_seconds`."""
        return Informer(
            api,
            collection,
            changed,
            on_listed=listed,
            on_error=failed,
            watch_timeout=self.resync_seconds,
            relist_seconds=self.resync_seconds,
            backoff=self.backoff_seconds,
            max_backoff=30.0 * self.backoff_seconds,
        )

    def _informer(self, store: PolicyStore, name: str, api: ListWatch) -> Informer:
        def changed(delta: Delta) -> None:
            # What a list found is applied once the list is complete (`listed`).
            if not delta.listed:
                store.apply(name, None if delta.type == "DELETED" else delta.object)

        def listed(informer: Informer) -> None:
            store.apply(name, informer.store.get(name))

        def failed(exc: Exception) -> None:
            why = not_permitted(exc)
            if why is not None:
                # The Role does not name this ConfigMap (a new revision's name, say).
                store.apply(name, None, why)

        collection = Collection(
            "configmaps", "ConfigMap", self.namespace, field_selector=f"metadata.name={name}"
        )
        return self._new(api, collection, changed, listed, failed)
