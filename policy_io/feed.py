"""The one feed of policy inputs the webhook, the extender and the controller plan with.

Each server reads the same ConfigMaps of the tenant namespace: the signed profile, pinned by
name (`bundleConfigMap`) or, following revisions, every ConfigMap labelled
`kamiwaza.ai/inference-profile=true`; and each configured recipe catalog by name. `PolicyFeed`
is where those reads land, whatever does the reading (the informers of `serving.revisions`, or
a test handing it dicts). It verifies each profile revision once (uid and resourceVersion),
loads each catalog once per revision, and treats a read the API server refuses to this server's
credentials or Role (401 or 403, `serving.kube.not_permitted` says why) as an input that is
known and unreadable, the reason kept for the refusal that names it, so a server is told what
to fix instead of staying unready. What the servers plan with is the feed's `snapshot`, an
immutable `PolicySnapshot`.

Every input method runs as a watch callback and never raises: an input it cannot use becomes
a refusal, not a dead watch. Each returns a `FeedChange`, what the controller re-checks Pods by.

The labelled ConfigMaps are the tenant's to write, so what they may cost is capped
(`policy_io.caps`): an informer hands each to `ProfileRevisions.take` as it arrives, which
judges it once per revision and keeps only its identity; a refused revision keeps its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inference_policy.base.pod_view import ObjectView
from inference_policy.planning.catalog import EngineCatalog
from inference_policy.planning.recipe_inputs import (
    Capability,
    CatalogUnavailable,
    Cause,
    RecipeInput,
)
from inference_policy.planning.recipes import RecipeCatalogError, load_catalog
from inference_policy.trust.rollback import Floor, FloorUnreadable, floor_of
from inference_policy.trust.signing import (
    ProfileRefused,
    Reason,
    RefusalRecord,
    VerifiedProfile,
    newest,
)
from policy_io.catalog import packaged_catalog
from policy_io.snapshot import PolicySnapshot, RefusedRevision, Revision
from policy_io.state import (
    PROFILE_SELECTOR,
    PolicySettings,
    PolicyState,
    recipe_catalog_configmaps,
    revision_of,
    told,
)

log = logging.getLogger(__name__)
# The input that following revisions reads, beside the ConfigMaps read by name.
REVISIONS = "profile revisions"
# The owner's record of the highest version verified (`inference_policy.trust.rollback`).
FLOOR = "rollback floor"


@dataclass(frozen=True, slots=True)
class FeedChange:
    """What one input step changed: the bundle digests whose revision changed meaning, and
    whether anything every plan depends on changed (`whole`)."""

    digests: frozenset[str] = frozenset()
    whole: bool = False

    def __bool__(self) -> bool:
        return self.whole or bool(self.digests)


NO_CHANGE = FeedChange()


class PolicyFeed:
    """The policy inputs of one server process, as last read, and the snapshot drawn from them.

    `profile` is False for a server that reads no profile (the webhook with tenant mode off);
    `recipes` False for one that plans with no catalog (the extender); `follow` overrides the
    settings' `follow_revisions` (the controller always follows, to find each Pod's revision);
    `rollback` names the TenantAdmission whose rollback floor every profile is held to (the
    owner's extender), which must then be read before the feed is ready.
    """

    def __init__(
        self,
        settings: PolicySettings,
        catalog: EngineCatalog | None = None,
        *,
        profile: bool = True,
        recipes: bool = True,
        follow: bool | None = None,
        rollback: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.settings = settings
        self.state = PolicyState(settings, catalog or packaged_catalog())
        self.clock = clock or (lambda: datetime.now(UTC))
        self.follows = profile and (settings.follow_revisions if follow is None else follow)
        self.catalog_names: dict[Capability, str] = (
            recipe_catalog_configmaps(settings) if recipes else {}
        )
        # The profile ConfigMap read by name, unless revisions are followed or none is read.
        self.pinned = settings.bundle_configmap if profile and not self.follows else None
        pinned = [self.pinned] if self.pinned is not None else []
        # The ConfigMaps read by name, and every input that must be read once before `ready`.
        self.names: list[str] = [*pinned, *self.catalog_names.values()]
        self.rollback = rollback if profile else None
        self.inputs: list[str] = [
            *self.names,
            *([REVISIONS] if self.follows else []),
            *([FLOOR] if self.rollback is not None else []),
        ]
        # The floor, or why it cannot be known; only with `rollback`.
        self._floor: Floor | str | None = (
            None if self.rollback is None else f"TenantAdmission {rollback!r} has not been read"
        )
        self.known: set[str] = set()
        self.catalog_loads = 0
        self.generation = 0
        self._catalog_revisions: dict[Capability, str | None] = {}
        self._profiles_unreadable: str | None = None
        self._by_digest: dict[str, tuple[str, VerifiedProfile | RefusalRecord]] = {}
        self._revisions: Mapping[str, Revision] = {}
        self._snapshot: PolicySnapshot | None = None
        for capability, name in self.catalog_names.items():
            self._set_recipes(
                capability, CatalogUnavailable(capability, name, settings.namespace, Cause.UNREAD)
            )

    # -- what the servers read -----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every input has been read once, found or not, or refused to this server."""
        return all(name in self.known for name in self.inputs)

    @property
    def pending(self) -> list[str]:
        return [name for name in self.inputs if name not in self.known]

    @property
    def verifications(self) -> int:
        return self.state.verifications

    @property
    def snapshot(self) -> PolicySnapshot:
        found = self._snapshot
        if found is None:
            state = self.state
            profile, refusal, revisions = self._held_to_floor()
            found = self._snapshot = PolicySnapshot(
                generation=self.generation,
                enabled=self.settings.enabled,
                catalog=state.catalog,
                catalog_refusal=state.catalog_refusal,
                profile=profile,
                profile_refusal=refusal,
                gpu_recipes=state.gpu_recipes,
                cpu_recipes=state.cpu_recipes,
                revisions=revisions,
                profiles_unreadable=self._profiles_unreadable,
                profile_revision=state.profile_revision,
                catalog_revisions=dict(self._catalog_revisions),
                options=state.gpu_options,
            )
        return found

    def read(
        self, name: str, configmap: Mapping[str, Any] | None, why: str | None = None
    ) -> FeedChange:
        """A ConfigMap this feed reads by name (the pinned profile or a catalog) as read now;
        any other name changes nothing."""
        if name == self.pinned:
            return self.profile_read(configmap, why)
        for capability, catalog in self.catalog_names.items():
            if catalog == name:
                return self.catalog_read(capability, configmap, why)
        return NO_CHANGE

    # -- the pinned profile --------------------------------------------------------------------

    def profile_read(
        self, configmap: Mapping[str, Any] | None, why: str | None = None
    ) -> FeedChange:
        """The pinned profile ConfigMap as read now (None: absent, or unreadable for `why`)."""
        name, namespace = self.settings.bundle_configmap, self.settings.namespace
        self.known.add(name)

        def step() -> FeedChange:
            if configmap is None:
                self.state.profile_missing(
                    f"ConfigMap {name!r} {why or 'was not found'} in namespace {namespace!r}"
                )
            elif self.state.read_profile(configmap, self.clock()):
                self.state.log_verdict(name)
            return FeedChange(whole=True)

        def failed(exc: Exception) -> None:
            log.exception("ConfigMap %s could not be used", name)
            self.state.profile_missing(
                f"ConfigMap {name!r} could not be read: {type(exc).__name__}"
            )

        return self._step(step, failed)

    # -- following revisions -------------------------------------------------------------------

    def revision_changed(self, name: str, configmap: Mapping[str, Any] | None) -> FeedChange:
        """One signed profile ConfigMap as a watch event has it (None: deleted)."""

        def step() -> FeedChange:
            self._apply_revision(name, configmap)
            return self._followed()

        return self._step(step, self._following_failed)

    def revisions_listed(self, configmaps: Mapping[str, Mapping[str, Any]]) -> FeedChange:
        """Every signed profile ConfigMap, as a complete list returned them: what was read
        before a refusal is read again."""
        self.known.add(REVISIONS)
        was_refused = self._profiles_unreadable is not None

        def step() -> FeedChange:
            self._profiles_unreadable = None
            self.state.followed.keep_only(set(configmaps))
            for name, configmap in configmaps.items():
                self._apply_revision(name, configmap)
            change = self._followed()
            return FeedChange(change.digests, change.whole or was_refused)

        return self._step(step, self._following_failed)

    def revisions_refused(self, why: str) -> FeedChange:
        """The signed profile ConfigMaps may not be listed (`why`). What was read of them is
        forgotten, as a pinned ConfigMap that may no longer be read is: the profile did not
        arrive, and says why."""
        self.known.add(REVISIONS)
        problem = (
            f"ConfigMaps labelled {PROFILE_SELECTOR} in namespace {self.settings.namespace!r} {why}"
        )
        news = bool(self._by_digest) or self._profiles_unreadable != problem

        def step() -> FeedChange:
            self._profiles_unreadable = problem
            self.state.followed.keep_only(set())
            change = self._followed()
            self.state.profile_missing(problem)
            return FeedChange(change.digests, news)

        return self._step(step, self._following_failed)

    def _apply_revision(self, name: str, configmap: Mapping[str, Any] | None) -> None:
        state = self.state
        state.followed.apply(name, configmap, state.policy(), state.trust_error)

    def _followed(self) -> FeedChange:
        """The profile in use becomes the newest verified revision (`signing.newest`); with
        none verified, the refusal of one that was refused, or "did not arrive" when there is
        none at all. The revisions by digest are rebuilt, and the digests that changed told."""
        state, followed = self.state, self.state.followed
        best = newest(followed.verified())
        if best is not None:
            state.profile, state.profile_refusal = best, None
        else:
            refused = followed.refused()
            state.profile = None
            state.profile_refusal = (
                told(state.profile_refusal, refused[-1][1])
                if refused
                else ProfileRefused(
                    Reason.ARRIVAL,
                    f"no ConfigMap labelled {PROFILE_SELECTOR} in namespace "
                    f"{self.settings.namespace!r}",
                )
            )
        by_digest: dict[str, tuple[str, VerifiedProfile | RefusalRecord]] = {}
        for name, digest in sorted(followed.digests.items(), key=lambda entry: entry[::-1]):
            result = followed.entries[name][1]
            kept = by_digest.get(digest)
            if kept is None or (
                isinstance(result, VerifiedProfile) and not isinstance(kept[1], VerifiedProfile)
            ):
                by_digest[digest] = (name, result)
        before = self._by_digest
        changed = frozenset(
            digest
            for digest in before.keys() | by_digest.keys()
            if not _same(before.get(digest), by_digest.get(digest))
        )
        if changed:
            self._by_digest = by_digest
            self._revisions = {
                digest: result
                if isinstance(result, VerifiedProfile)
                else RefusedRevision(name, result)
                for digest, (name, result) in by_digest.items()
            }
        return FeedChange(changed)

    def _following_failed(self, exc: Exception) -> None:
        # Each revision's verdict is logged where it is verified; this logs only the unexpected.
        log.exception("profile revisions could not be followed")
        self.state.profile_missing("the signed profile ConfigMaps could not be read")

    # -- the rollback floor --------------------------------------------------------------------

    @property
    def floor(self) -> Floor | None:
        """The rollback floor as last read (None: not read, unreadable, or not held to one)."""
        return self._floor if isinstance(self._floor, Floor) else None

    def floor_read(
        self, tenant_admission: Mapping[str, Any] | None, why: str | None = None
    ) -> FeedChange:
        """The TenantAdmission holding the rollback floor as read now (None: absent, or
        unreadable for `why`). Without it no profile is used: the floor is fail-closed."""
        if self.rollback is None:
            return NO_CHANGE
        self.known.add(FLOOR)
        name = self.rollback

        def step() -> FeedChange:
            if tenant_admission is None:
                self._floor = f"TenantAdmission {name!r} {why or 'was not found'}"
            else:
                try:
                    self._floor = floor_of(tenant_admission, self.settings.minimum_bundle_version)
                except FloorUnreadable as exc:
                    self._floor = f"TenantAdmission {name!r}: {exc}"
            return FeedChange(whole=True)

        def failed(exc: Exception) -> None:
            log.exception("TenantAdmission %s could not be used", name)
            self._floor = f"TenantAdmission {name!r} could not be read: {type(exc).__name__}"

        return self._step(step, failed)

    def _held_to_floor(
        self,
    ) -> tuple[VerifiedProfile | None, ProfileRefused | None, Mapping[str, Revision]]:
        """The profile, its refusal and the revisions by digest, each verified revision below
        the rollback floor refused (`inference_policy.trust.rollback`)."""
        state, floor = self.state, self._floor
        if floor is None:
            return state.profile, state.profile_refusal, self._revisions
        if isinstance(floor, str):
            unknown = ProfileRefused(
                Reason.ARRIVAL, f"{floor}: the owner's rollback floor is unknown"
            )
            revisions: dict[str, Revision] = {
                digest: RefusedRevision(revision.configmap_name, unknown.record())
                if isinstance(revision, VerifiedProfile)
                else revision
                for digest, revision in self._revisions.items()
            }
            return None, unknown, revisions
        profile: VerifiedProfile | None = state.profile
        refusal: ProfileRefused | None = state.profile_refusal
        if profile is not None and (below := floor.refusal(profile.version)) is not None:
            profile, refusal = None, below
        revisions = {}
        for digest, revision in self._revisions.items():
            if isinstance(revision, VerifiedProfile):
                held = floor.refusal(revision.version)
                if held is not None:
                    revisions[digest] = RefusedRevision(revision.configmap_name, held.record())
                    continue
            revisions[digest] = revision
        return profile, refusal, revisions

    # -- recipe catalogs -----------------------------------------------------------------------

    def catalog_read(
        self, capability: Capability, configmap: Mapping[str, Any] | None, why: str | None = None
    ) -> FeedChange:
        """A configured recipe catalog as read now (None: absent, or unreadable for `why`)."""
        name = self.catalog_names.get(capability)
        if name is None:
            return NO_CHANGE
        self.known.add(name)

        def step() -> FeedChange:
            self._load_catalog(capability, name, configmap, why)
            return FeedChange(whole=True)

        def failed(exc: Exception) -> None:
            log.exception("ConfigMap %s could not be used", name)
            self._catalog_revisions.pop(capability, None)
            self._unusable(capability, Cause.FAILED, type(exc).__name__)

        return self._step(step, failed)

    def _load_catalog(
        self,
        capability: Capability,
        name: str,
        configmap: Mapping[str, Any] | None,
        why: str | None,
    ) -> None:
        if configmap is None:
            self._catalog_revisions.pop(capability, None)
            if why is None:
                self._unusable(capability, Cause.ABSENT)
            else:
                self._unusable(capability, Cause.REFUSED, why)
            return
        revision = revision_of(configmap)
        if revision is not None and self._catalog_revisions.get(capability) == revision:
            return
        self._catalog_revisions[capability] = revision
        self.catalog_loads += 1
        namespace = ObjectView(configmap).metadata.get("namespace")
        if namespace not in (None, self.settings.namespace):
            self._unusable(capability, Cause.FOREIGN, repr(namespace))
            return
        document = dict(configmap)
        # Items of a List arrive without kind; the loader needs it to read a ConfigMap.
        document.setdefault("kind", "ConfigMap")
        try:
            recipes = load_catalog(document, capability)
        except RecipeCatalogError as exc:
            self._unusable(capability, Cause.INVALID, str(exc))
            return
        self._set_recipes(capability, recipes)
        log.info("loaded %s recipe catalog %s (%d recipes)", capability, name, len(recipes.recipes))

    def _unusable(self, capability: Capability, cause: Cause, detail: str = "") -> None:
        name = self.catalog_names[capability]
        unusable = CatalogUnavailable(capability, name, self.settings.namespace, cause, detail)
        self._set_recipes(capability, unusable)
        log.warning("%s", unusable.refusal)

    def _set_recipes(self, capability: Capability, recipes: RecipeInput) -> None:
        if capability == "gpu":
            self.state.gpu_recipes = recipes
        else:
            self.state.cpu_recipes = recipes

    # -- every step ----------------------------------------------------------------------------

    def _inputs(self) -> tuple[Any, ...]:
        state = self.state
        return (
            state.profile,
            state.profile_refusal,
            state.gpu_recipes,
            state.cpu_recipes,
            self._revisions,
            self._profiles_unreadable,
            self._floor,
        )

    def _step(
        self, step: Callable[[], FeedChange], failed: Callable[[Exception], None]
    ) -> FeedChange:
        before = self._inputs()
        try:
            change = step()
        except Exception as exc:
            failed(exc)
            change = FeedChange(whole=True)
        after = self._inputs()
        if any(not _same(a, b) for a, b in zip(before, after, strict=True)):
            self.generation += 1
            self._snapshot = None
            return change
        return FeedChange(change.digests) if change.digests else NO_CHANGE


def _same(a: Any, b: Any) -> bool:
    """The same input: the very object (a verified profile, a loaded catalog, a refusal, the
    revisions by digest), or an equal value (a catalog's unavailability, a string, a digest's
    ConfigMap name with the very verdict on it)."""
    if a is b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] == b[0] and a[1] is b[1]
    return isinstance(a, (CatalogUnavailable, Floor, str)) and type(a) is type(b) and a == b


__all__ = ["FLOOR", "NO_CHANGE", "REVISIONS", "FeedChange", "PolicyFeed"]
