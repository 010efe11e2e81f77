"""The planning state a server or the CLI holds: settings, catalog, verified profile.

A profile is verified once per ConfigMap revision and the result kept, so the per-request path
does only the time-window check and the planning itself. `verifications` counts the expensive
verifications so tests and benchmarks can prove it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from inference_policy.catalog import CatalogError, EngineCatalog, ImageMapError, ImageSource
from inference_policy.planner import Decision, GpuOptions, PlanContext, decide
from inference_policy.recipe_inputs import CAPABILITIES, Capability, RecipeInput
from inference_policy.signing import (
    DEFAULT_CONFIGMAP_NAME,
    DIGEST_KEY,
    ProfileRefused,
    Reason,
    TrustedKeys,
    VerifiedProfile,
    VerifyPolicy,
    verify_configmap_content,
)

log = logging.getLogger(__name__)


def revision_of(configmap: Mapping[str, Any]) -> str | None:
    """uid + resourceVersion: a new object or any write gives a new key; a re-read does not."""
    metadata = configmap.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    uid, version = metadata.get("uid"), metadata.get("resourceVersion")
    if not isinstance(uid, str) or not isinstance(version, str) or not uid or not version:
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
) -> VerifiedProfile | ProfileRefused:
    """One profile ConfigMap verified as `name` (the one way every server verifies a revision):
    the verified profile, or why it is refused."""
    if policy is None:
        return ProfileRefused(Reason.KEY, trust_error or "no trusted owner key is configured")
    document = dict(configmap)
    # Items of a List arrive without TypeMeta; the verifier reads a ConfigMap.
    document.setdefault("apiVersion", "v1")
    document.setdefault("kind", "ConfigMap")
    try:
        return verify_configmap_content(document, replace(policy, configmap_name=name))
    except ProfileRefused as refusal:
        return refusal


def log_result(name: str, result: VerifiedProfile | ProfileRefused | None) -> None:
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
            extra={"profile": name, "code": "profile-refused", "reason": result.reason.value},
        )


@dataclass
class ProfileRevisions:
    """Every signed profile ConfigMap of the namespace, each verified once per revision (uid and
    resourceVersion), by name: the verified profile, or why it was refused."""

    entries: dict[str, tuple[str | None, VerifiedProfile | ProfileRefused]] = field(
        default_factory=dict
    )
    # The bundle sha256 each ConfigMap says it carries, for the controller's revisions by digest.
    digests: dict[str, str] = field(default_factory=dict)
    verifications: int = 0

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
        self.verifications += 1
        result = verify_revision(name, configmap, policy, trust_error)
        self.entries[name] = (key, result)
        data = configmap.get("data")
        digest = data.get(DIGEST_KEY) if isinstance(data, Mapping) else None
        if isinstance(digest, str) and digest:
            self.digests[name] = digest
        else:
            self.digests.pop(name, None)
        log_result(name, result)
        return True

    def keep_only(self, names: set[str]) -> bool:
        """After a full list: forget the ConfigMaps it did not return."""
        gone = [name for name in self.entries if name not in names]
        for name in gone:
            del self.entries[name]
            self.digests.pop(name, None)
        return bool(gone)

    def verified(self) -> list[VerifiedProfile]:
        return [r for _, r in self.entries.values() if isinstance(r, VerifiedProfile)]

    def refused(self) -> list[tuple[str, ProfileRefused]]:
        return [
            (n, r) for n, (_, r) in sorted(self.entries.items()) if isinstance(r, ProfileRefused)
        ]


@dataclass
class PolicyState:
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
    followed: ProfileRevisions = field(init=False, default_factory=ProfileRevisions)
    # What each GPU binding offers each engine under the current revision, kept across decisions.
    gpu_options: GpuOptions = field(init=False, default_factory=GpuOptions)

    @property
    def verifications(self) -> int:
        """Full verifications of a profile ConfigMap revision, pinned or followed."""
        return self.pinned_verifications + self.followed.verifications

    def __post_init__(self) -> None:
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
        if not isinstance(configmap, Mapping):
            result: VerifiedProfile | ProfileRefused = ProfileRefused(
                Reason.ARRIVAL, "the object is not a ConfigMap"
            )
        else:
            result = verify_revision(
                self.settings.bundle_configmap, configmap, self.policy(), self.trust_error
            )
        if isinstance(result, VerifiedProfile):
            self.profile, self.profile_refusal = result, None
        else:
            self.profile, self.profile_refusal = None, result

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

    def context(self, now: datetime) -> PlanContext:
        return PlanContext(
            catalog=self.catalog,
            now=now,
            enabled=self.settings.enabled,
            profile=self.profile,
            profile_refusal=self.profile_refusal,
            catalog_refusal=self.catalog_refusal,
            gpu_recipes=self.gpu_recipes,
            cpu_recipes=self.cpu_recipes,
            options=self.gpu_options,
        )

    def decide(self, request: Any, now: datetime) -> Decision:
        return decide(request, self.context(now))
