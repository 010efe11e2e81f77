"""The planning state a server or the CLI holds: settings, catalog, verified profile.

A profile is verified once per ConfigMap revision and the result kept, so the per-request path
does only the time-window check and the planning itself. `verifications` counts the expensive
verifications so tests and benchmarks can prove it. What is kept of a refused revision is its
reason (`signing.RefusalRecord`), and what tenant data may cost is capped (`policy_io.caps`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from inference_policy.base.pod_view import ObjectView
from inference_policy.planning.catalog import (
    CatalogError,
    EngineCatalog,
    ImageMapError,
    ImageSource,
)
from inference_policy.planning.planner import GpuOptions
from inference_policy.planning.recipe_inputs import CAPABILITIES, Capability, RecipeInput
from inference_policy.trust.signing import (
    DEFAULT_CONFIGMAP_NAME,
    DIGEST_KEY,
    ProfileRefused,
    Reason,
    RefusalRecord,
    TrustedKeys,
    VerifiedProfile,
    VerifyPolicy,
    verify_configmap_content,
)
from policy_io import caps

log = logging.getLogger(__name__)


def revision_of(configmap: Mapping[str, Any]) -> str | None:
    """uid + resourceVersion: a new object or any write gives a new key; a re-read does not."""
    view = ObjectView(configmap)
    uid, version = view.uid, view.resource_version
    if not uid or not version:
        return None
    return f"{uid}/{version}"


@dataclass(frozen=True)
class PolicySettings:
    """The Helm values of the seed, as the servers and `tmi plan` take them."""

    enabled: bool = False
    namespace: str = "kamiwaza"
    bundle_configmap: str = DEFAULT_CONFIGMAP_NAME
    owner_public_keys: tuple[str, ...] = ()
    cluster_binding_id: str = ""
    minimum_bundle_version: int = 1
    engine_image_map: Mapping[str, str] | None = None
    image_registry_prefix: str | None = None
    airgap_registry: str | None = None
    gpu_recipe_catalog_configmap: str | None = None
    cpu_recipe_catalog_configmap: str | None = None
    gpu_registry_credentials_secret: str | None = None
    cpu_registry_credentials_secret: str | None = None
    scheduler_name: str = "kamiwaza-inference-scheduler"
    # Follow the newest verified profile revision among the namespace's signed profile
    # ConfigMaps (label `kamiwaza.ai/inference-profile=true`) instead of the one named by
    # `bundle_configmap`: publishing revision N+1 is then the only step.
    follow_revisions: bool = False
    # What tenant data may cost (`policy_io.caps`): the verified revisions kept per namespace,
    # and the most data a profile ConfigMap may carry to be read at all.
    max_profile_revisions: int = caps.MAX_PROFILE_REVISIONS
    max_revision_bytes: int = caps.MAX_REVISION_BYTES


def recipe_catalog_configmaps(settings: PolicySettings) -> dict[Capability, str]:
    """The recipe catalog ConfigMap each capability is pinned to, for those that are."""
    names = {
        "gpu": settings.gpu_recipe_catalog_configmap,
        "cpu": settings.cpu_recipe_catalog_configmap,
    }
    return {capability: name for capability in CAPABILITIES if (name := names[capability])}


PROFILE_LABEL = "kamiwaza.ai/inference-profile"
PROFILE_SELECTOR = f"{PROFILE_LABEL}=true"


def verify_revision(
    name: str, configmap: Mapping[str, Any], policy: VerifyPolicy | None, trust_error: str | None
) -> VerifiedProfile | RefusalRecord:
    """One profile ConfigMap verified as `name` (the one way every server verifies a revision):
    the verified profile, or why it is refused (its reason alone, never the exception)."""
    if policy is None:
        return RefusalRecord(Reason.KEY, trust_error or "no trusted owner key is configured")
    document = dict(configmap)
    # Items of a List arrive without TypeMeta; the verifier reads a ConfigMap.
    document.setdefault("apiVersion", "v1")
    document.setdefault("kind", "ConfigMap")
    try:
        return verify_configmap_content(document, replace(policy, configmap_name=name))
    except ProfileRefused as refusal:
        return refusal.record()


def log_result(
    name: str, result: VerifiedProfile | ProfileRefused | RefusalRecord | None, code: str = ""
) -> None:
    """The verdict on a profile revision, logged once per revision by whoever verified it."""
    if isinstance(result, VerifiedProfile):
        log.info(
            "verified profile %s version %d (bundle sha256 %s)",
            name,
            result.version,
            result.sha256,
            extra={"profile": name, "version": result.version, "sha256": result.sha256},
        )
    elif result is not None:
        log.warning(
            "profile %s refused: %s (%s)",
            name,
            result.reason.value,
            result.check,
            extra={
                "profile": name,
                "code": code or "profile-refused",
                "reason": result.reason.value,
            },
        )


Result = VerifiedProfile | RefusalRecord


@dataclass(frozen=True, slots=True)
class CapRefusal:
    """A ConfigMap refused by a cap (`policy_io.caps`), for the Event a server may post."""

    name: str
    uid: str
    resource_version: str
    reason: str
    message: str


# Cap refusals waiting for a server to post their Events; older ones give way.
PENDING_NOTICES = 64


@dataclass
class ProfileRevisions:
    """Every signed profile ConfigMap of the namespace, each judged once per revision (uid and
    resourceVersion), by name: the verified profile, or why it was refused. At most
    `max_revisions` verified revisions are kept, and a ConfigMap over `max_bytes` is refused
    unread (`policy_io.caps`)."""

    namespace: str = ""
    max_revisions: int = caps.MAX_PROFILE_REVISIONS
    max_bytes: int = caps.MAX_REVISION_BYTES
    entries: dict[str, tuple[str | None, Result]] = field(default_factory=dict)
    # The bundle sha256 each ConfigMap says it carries, for the controller's revisions by digest.
    digests: dict[str, str] = field(default_factory=dict)
    verifications: int = 0
    # Refusals by `caps.REFUSAL_REASONS`, one per judged revision, for the servers' metrics.
    refused_total: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(caps.REFUSAL_REASONS, 0)
    )
    notices: deque[CapRefusal] = field(default_factory=lambda: deque(maxlen=PENDING_NOTICES))

    def apply(
        self,
        name: str,
        configmap: Mapping[str, Any] | None,
        policy: VerifyPolicy | None,
        trust_error: str | None = None,
    ) -> bool:
        """The ConfigMap as it is now (None: gone); True when what it says changed."""
        if configmap is None:
            self.digests.pop(name, None)
            return self.entries.pop(name, None) is not None
        key = revision_of(configmap)
        previous = self.entries.get(name)
        if previous is not None and key is not None and previous[0] == key:
            return False
        self._judge(name, key, configmap, policy, trust_error)
        return True

    def take(
        self, configmap: dict[str, Any], policy: VerifyPolicy | None, trust_error: str | None
    ) -> dict[str, Any]:
        """An informer's transform: the ConfigMap judged now, unless this revision was, and what
        is kept of it (`caps.slim`), so its data is never stored. Never raises: a ConfigMap it
        cannot judge is kept whole, for `apply` to refuse."""
        try:
            name = ObjectView(configmap).name
            if name is None:
                return configmap
            key = revision_of(configmap)
            if key is None:
                # Without a revision it cannot be told apart from the next read: judged then.
                return configmap
            previous = self.entries.get(name)
            if previous is None or previous[0] != key:
                self._judge(name, key, configmap, policy, trust_error)
            return caps.slim(configmap)
        except Exception:
            log.exception("profile ConfigMap could not be judged")
            return configmap

    def _judge(
        self,
        name: str,
        key: str | None,
        configmap: Mapping[str, Any],
        policy: VerifyPolicy | None,
        trust_error: str | None,
    ) -> None:
        size = caps.data_bytes(configmap)
        digest = caps.digest_of(configmap)
        kept = self._verified_beside(name)
        full = len(kept) >= self.max_revisions
        result: Result
        code = "profile-revision-capped"
        if size > self.max_bytes:
            result = self._capped(
                name, key, caps.TOO_LARGE, caps.too_large(name, size, self.max_bytes)
            )
        elif full and digest is not None and any(p.sha256 == digest for p in kept):
            # A copy of a revision kept already adds nothing: refused unverified.
            result = self._capped(name, key, caps.TOO_MANY, self._too_many(name))
        else:
            self.verifications += 1
            result = verify_revision(name, configmap, policy, trust_error)
            code = ""
            if not isinstance(result, VerifiedProfile):
                self.refused_total[caps.UNVERIFIED] += 1
            elif full:
                # Only what the owner signed gets here, so junk never displaces a revision:
                # the newest distinct revisions are kept, whatever order they arrived in.
                last = max([*kept, result], key=_rank([*kept, result]))
                if last is result:
                    code = "profile-revision-capped"
                    result = self._capped(name, key, caps.TOO_MANY, self._too_many(name))
                else:
                    other = last.configmap_name
                    other_key = self.entries[other][0]
                    record = self._capped(other, other_key, caps.TOO_MANY, self._too_many(other))
                    self.entries[other] = (other_key, record)
                    log_result(other, record, "profile-revision-capped")
        self.entries[name] = (key, result)
        if digest is not None:
            self.digests[name] = digest
        else:
            self.digests.pop(name, None)
            if size <= self.max_bytes:
                log.warning("profile ConfigMap %s has no %s; ignored", name, DIGEST_KEY)
        log_result(name, result, code)

    def _verified_beside(self, name: str) -> list[VerifiedProfile]:
        return [
            result
            for other, (_, result) in self.entries.items()
            if other != name and isinstance(result, VerifiedProfile)
        ]

    def _too_many(self, name: str) -> str:
        return caps.too_many(name, self.namespace, self.max_revisions)

    def _capped(self, name: str, key: str | None, reason: str, check: str) -> RefusalRecord:
        self.note_capped(name, key, reason, check)
        return RefusalRecord(Reason.ARRIVAL, check)

    def note_capped(self, name: str, key: str | None, reason: str, check: str) -> None:
        """Count a cap refusal and keep it for the Event a server may post."""
        self.refused_total[reason] += 1
        uid, _, version = (key or "").partition("/")
        self.notices.append(CapRefusal(name, uid, version, reason, check))

    def take_notices(self) -> list[CapRefusal]:
        """The cap refusals since the last call, oldest first."""
        taken = list(self.notices)
        self.notices.clear()
        return taken

    def keep_only(self, names: set[str]) -> bool:
        """After a full list: forget the ConfigMaps it did not return."""
        gone = [name for name in self.entries if name not in names]
        for name in gone:
            del self.entries[name]
            self.digests.pop(name, None)
        return bool(gone)

    def verified(self) -> list[VerifiedProfile]:
        return [r for _, r in self.entries.values() if isinstance(r, VerifiedProfile)]

    def refused(self) -> list[tuple[str, RefusalRecord]]:
        return [
            (n, r) for n, (_, r) in sorted(self.entries.items()) if isinstance(r, RefusalRecord)
        ]


def _rank(pool: list[VerifiedProfile]) -> Any:
    """The order in which verified revisions are kept past the count cap, last given up first:
    one ConfigMap per bundle before its copies, then the highest version, the latest issued, the
    first name (as `signing.newest` picks, so the revision in use is always kept)."""
    firsts: dict[str, str] = {}
    for profile in sorted(pool, key=lambda p: p.configmap_name):
        firsts.setdefault(profile.sha256, profile.configmap_name)

    def rank(profile: VerifiedProfile) -> tuple[bool, int, float, str]:
        copy = firsts[profile.sha256] != profile.configmap_name
        issued = profile.envelope.issued_at.timestamp()
        return (copy, -profile.version, -issued, profile.configmap_name)

    return rank


def told(current: ProfileRefused | None, record: RefusalRecord) -> ProfileRefused:
    """The refusal a request is told, from a kept record: the one already told while it says
    the same, so an unchanged refusal is not a new input to the feed."""
    if current is not None and (current.reason, current.check, current.schema) == (
        record.reason,
        record.check,
        record.schema,
    ):
        return current
    return record.refusal()


@dataclass
class PolicyState:
    """The feed's working state (`policy_io.feed`): the trust, the relocated catalog, the pinned
    profile and the followed revisions as last read. Nothing decides from it: a decision is made
    from the immutable `PolicySnapshot` the feed draws from it, by the servers and, fed from
    files, by the CLI (`policy_io.offline`)."""

    settings: PolicySettings
    base_catalog: EngineCatalog
    catalog: EngineCatalog = field(init=False)
    catalog_refusal: str | None = field(init=False, default=None)
    trust: TrustedKeys | None = field(init=False, default=None)
    trust_error: str | None = field(init=False, default=None)
    profile: VerifiedProfile | None = field(init=False, default=None)
    profile_refusal: ProfileRefused | None = field(init=False, default=None)
    profile_revision: str | None = field(init=False, default=None)
    # Each configured recipe catalog, or why it cannot be used; set by the `policy_io.feed`
    # that reads them (or by `tmi plan` from files).
    gpu_recipes: RecipeInput = None
    cpu_recipes: RecipeInput = None
    pinned_verifications: int = field(init=False, default=0)
    # Following revisions, every signed profile ConfigMap verified (kept by `policy_io.feed`).
    followed: ProfileRevisions = field(init=False)
    # What each GPU binding offers each engine under the current revision, kept across decisions.
    gpu_options: GpuOptions = field(init=False, default_factory=GpuOptions)

    @property
    def verifications(self) -> int:
        """Full verifications of a profile ConfigMap revision, pinned or followed."""
        return self.pinned_verifications + self.followed.verifications

    def __post_init__(self) -> None:
        settings = self.settings
        self.followed = ProfileRevisions(
            settings.namespace, settings.max_profile_revisions, settings.max_revision_bytes
        )
        source = ImageSource(
            self.settings.engine_image_map,
            self.settings.image_registry_prefix,
            self.settings.airgap_registry,
        )
        try:
            self.catalog = self.base_catalog.relocated(source)
        except ImageMapError as exc:
            self.catalog = self.base_catalog
            self.catalog_refusal = exc.detail
        except CatalogError as exc:
            self.catalog = self.base_catalog
            self.catalog_refusal = str(exc)
        try:
            self.trust = TrustedKeys.from_base64(self.settings.owner_public_keys)
        except ValueError as exc:
            self.trust_error = str(exc)
        self.profile_refusal = ProfileRefused(Reason.ARRIVAL, "no profile has been read yet")

    def policy(self) -> VerifyPolicy | None:
        if self.trust is None:
            return None
        return VerifyPolicy(
            trusted=self.trust,
            cluster_binding_id=self.settings.cluster_binding_id,
            namespace=self.settings.namespace,
            minimum_version=self.settings.minimum_bundle_version,
            configmap_name=self.settings.bundle_configmap,
        )

    def set_profile(self, configmap: Any, revision: str | None, now: datetime) -> None:
        """Verify a ConfigMap unless this exact revision was verified already."""
        if revision is not None and revision == self.profile_revision:
            return
        self.profile_revision = revision
        self.pinned_verifications += 1
        name = self.settings.bundle_configmap
        limit = self.settings.max_revision_bytes
        if not isinstance(configmap, Mapping):
            result: VerifiedProfile | RefusalRecord = RefusalRecord(
                Reason.ARRIVAL, "the object is not a ConfigMap"
            )
        elif (size := caps.data_bytes(configmap)) > limit:
            check = caps.too_large(name, size, limit)
            result = RefusalRecord(Reason.ARRIVAL, check)
            self.followed.note_capped(name, revision, caps.TOO_LARGE, check)
        else:
            result = verify_revision(name, configmap, self.policy(), self.trust_error)
        if isinstance(result, VerifiedProfile):
            self.profile, self.profile_refusal = result, None
        else:
            self.profile, self.profile_refusal = None, result.refusal()

    def read_profile(self, configmap: Mapping[str, Any], now: datetime) -> bool:
        """A profile ConfigMap as read from the API server, verified unless its revision was;
        True when it was verified now (so a server logs each revision's verdict once)."""
        before = self.verifications
        self.set_profile(configmap, revision_of(configmap), now)
        return self.verifications != before

    def log_verdict(self, name: str) -> None:
        """Log the verdict on the pinned profile revision just read, once per revision."""
        log_result(name, self.profile if self.profile_refusal is None else self.profile_refusal)

    def profile_missing(self, check: str) -> None:
        self.profile = None
        self.profile_revision = None
        self.profile_refusal = ProfileRefused(Reason.ARRIVAL, check)
