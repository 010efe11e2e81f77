"""Every signed profile revision in the namespace, verified once, found by its bundle sha256.

The webhook plans against the one ConfigMap its settings name; the controller must check each
Pod against the revision *that Pod* was planned with, which after an upgrade is often not the
current one. So it watches every ConfigMap labelled `kamiwaza.ai/inference-profile=true`,
verifies each once per (uid, resourceVersion) with the install's key, binding id, namespace and
version floor, and files the result under the ConfigMap's `bundle.sha256`: a verified profile,
or the refusal, which the grant check reports as `ProfileRefused`.

The same bundle published under two names is one revision; a verified copy wins over a refused
one. A ConfigMap that is deleted takes its revision with it.

Recipe catalogs (when the install pins recipes) are part of what a plan depends on, so they are
held here too and a configured catalog that cannot be read makes re-derivation impossible,
which the grant check reports rather than guessing.

ConfigMaps the API server refuses to let this replica read (401 or 403: the owner's Role, as
`serving.kube.not_permitted` says) are an install problem, not a server fault, as they are for
the webhook and the extender: what was read before is forgotten, and every Pod's check reports
the lapse and what to fix, until a list succeeds again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from inference_policy.grant import (
    PROFILES_UNREADABLE,
    RECIPE_CATALOG_UNAVAILABLE,
    Evaluation,
    Lapse,
    evaluate,
    refused_lapse,
)
from inference_policy.planner import PlanContext
from inference_policy.recipes import RecipeCatalogError, load_catalog
from inference_policy.signing import (
    DIGEST_KEY,
    VerifiedProfile,
)
from policy_io.catalog import packaged_catalog
from policy_io.state import (
    PROFILE_SELECTOR,
    PolicySettings,
    PolicyState,
    ProfileRevisions,
    revision_of,
)

log = logging.getLogger(__name__)


Revision = VerifiedProfile | Lapse


class PolicyView:
    """The install's planning settings plus every profile revision and recipe catalog seen."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.state = PolicyState(settings, packaged_catalog())
        self.revisions: dict[str, Revision] = {}
        self.recipe_names: dict[str, str] = {}
        for capability in ("gpu", "cpu"):
            name = getattr(settings, f"{capability}_recipe_catalog_configmap")
            if name:
                self.recipe_names[capability] = name
        self._recipe_problems: dict[str, str | None] = {
            capability: f"the {capability} recipe catalog {name} has not been read yet"
            for capability, name in self.recipe_names.items()
        }
        self._recipe_revisions: dict[str, str | None] = {}
        self._profiles_problem: str | None = None

    # -- profile revisions ---------------------------------------------------------------------

    @property
    def followed(self) -> ProfileRevisions:
        """Every labelled profile ConfigMap, verified once per revision (policy_io.state)."""
        return self.state.followed

    @property
    def verifications(self) -> int:
        return self.state.verifications

    def apply_configmap(self, configmap: Mapping[str, Any]) -> set[str]:
        """A profile ConfigMap as it is now; returns the bundle digests whose meaning changed."""
        metadata = configmap.get("metadata") or {}
        name = metadata.get("name")
        data = configmap.get("data") or {}
        digest = data.get(DIGEST_KEY) if isinstance(data, Mapping) else None
        if not isinstance(name, str):
            return set()
        if not isinstance(digest, str) or not digest:
            log.warning("profile ConfigMap %s has no %s; ignored", name, DIGEST_KEY)
            return self.remove_configmap(name)
        previous = self.followed.digests.get(name)
        if not self.followed.apply(name, configmap, self.state.policy(), self.state.trust_error):
            return set()
        self._rebuild()
        return {digest} | ({previous} if previous is not None else set())

    def remove_configmap(self, name: str) -> set[str]:
        previous = self.followed.digests.get(name)
        if not self.followed.apply(name, None, None):
            return set()
        self._rebuild()
        return {previous} if previous is not None else set()

    def profiles_not_permitted(self, why: str) -> bool:
        """The profile ConfigMaps may not be listed (`why`). What was read of them is forgotten,
        as the webhook and the extender forget it; True if that changed anything."""
        problem = (
            f"ConfigMaps labelled {PROFILE_SELECTOR} in namespace {self.settings.namespace!r} {why}"
        )
        changed = bool(self.revisions) or self._profiles_problem != problem
        self.followed.keep_only(set())
        self._rebuild()
        self._profiles_problem = problem
        return changed

    def profiles_listed(self, configmaps: list[Mapping[str, Any]]) -> None:
        """A list of the profile ConfigMaps succeeded after one was refused: what it holds is
        applied again, as this view forgot it."""
        self._profiles_problem = None
        for configmap in configmaps:
            self.apply_configmap(configmap)

    def _rebuild(self) -> None:
        """Revisions by digest: the same bundle under two names is one revision, and a verified
        copy wins over a refused one."""
        revisions: dict[str, Revision] = {}
        entries = self.followed.entries
        for name, digest in sorted(self.followed.digests.items(), key=lambda e: e[1]):
            result = entries[name][1]
            if isinstance(revisions.get(digest), VerifiedProfile):
                continue
            if isinstance(result, VerifiedProfile):
                revisions[digest] = result
            elif digest not in revisions:
                revisions[digest] = refused_lapse(name, result)
        self.revisions = revisions

    # -- recipe catalogs -----------------------------------------------------------------------

    def recipe_catalog_unusable(self, capability: str, why: str) -> bool:
        """No configured recipe catalog to plan with, and `why`, said after the ConfigMap's name
        ("does not exist", or why it may not be read); True if that is news."""
        self._recipe_revisions.pop(capability, None)
        setattr(self.state, f"{capability}_recipes", None)
        problem = f"the {capability} recipe catalog ConfigMap {self.recipe_names[capability]} {why}"
        changed = self._recipe_problems.get(capability) != problem
        self._recipe_problems[capability] = problem
        return changed

    def apply_recipe_catalog(self, capability: str, configmap: Mapping[str, Any] | None) -> bool:
        """A configured recipe catalog as it is now (None: absent); True if anything changed."""
        name = self.recipe_names[capability]
        if configmap is None:
            return self.recipe_catalog_unusable(capability, "does not exist")
        key = revision_of(configmap)
        if key is not None and self._recipe_revisions.get(capability) == key:
            return False
        self._recipe_revisions[capability] = key
        document = dict(configmap)
        # Items of a List arrive without kind; the loader needs it to read a ConfigMap.
        document.setdefault("kind", "ConfigMap")
        try:
            recipes = load_catalog(document, capability)
        except RecipeCatalogError as exc:
            setattr(self.state, f"{capability}_recipes", None)
            self._recipe_problems[capability] = f"the {capability} recipe catalog {name}: {exc}"
            return True
        setattr(self.state, f"{capability}_recipes", recipes)
        self._recipe_problems[capability] = None
        return True

    def lapse(self) -> Lapse | None:
        """Why no plan can be re-derived right now, whatever revision it names, if so."""
        if self._profiles_problem is not None:
            return Lapse(
                PROFILES_UNREADABLE,
                f"{self._profiles_problem}, so no plan can be checked against its revision",
            )
        problems = [p for p in self._recipe_problems.values() if p]
        if not problems:
            return None
        return Lapse(
            RECIPE_CATALOG_UNAVAILABLE,
            "; ".join(problems) + ", so the plan cannot be checked against the core",
        )

    # -- deciding ------------------------------------------------------------------------------

    def context(self, now: datetime) -> PlanContext:
        return self.state.context(now)

    def evaluate(
        self, pod: Mapping[str, Any], now: datetime, scheduling_timeout: float
    ) -> Evaluation:
        return evaluate(
            pod,
            self.revisions,
            self.context(now),
            now,
            scheduling_timeout=scheduling_timeout,
            lapse=self.lapse(),
        )
