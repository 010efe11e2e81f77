"""Every signed profile revision in the namespace, found by its bundle sha256, for the grant check.

The webhook plans against the profile in use; the controller must check each Pod against the
revision *that Pod* was planned with, which after an upgrade is often not the current one. So its
policy feed (`policy_io.feed`, the one the webhook and the extender read through) always follows
every ConfigMap labelled `kamiwaza.ai/inference-profile=true`, verifies each once per (uid,
resourceVersion) with the install's key, binding id, namespace and version floor, and keeps
the result under the ConfigMap's `bundle.sha256`: a verified profile, or the refusal, which the
grant check reports as `ProfileRefused`. The same bundle published under two names is one
revision; a verified copy wins over a refused one. A ConfigMap that is deleted takes its revision
with it.

Recipe catalogs (when the install pins recipes) are part of what a plan depends on, so the feed
reads them too; one that cannot be used is handed to the core as such, and the grant check
reports it (`RecipeCatalogUnavailable`) rather than guessing.

ConfigMaps the API server refuses to let this replica read (401 or 403) are an install problem,
not a server fault, as they are for the webhook and the extender: the feed forgets what was read
of them, and every Pod's check reports the lapse and what to fix, until a list succeeds again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from inference_policy.base.pod_view import ObjectView
from inference_policy.granting.grant import (
    PROFILES_UNREADABLE,
    Evaluation,
    Lapse,
    evaluate,
    refused_lapse,
)
from inference_policy.planning.planner import PlanContext
from inference_policy.planning.recipe_inputs import Capability
from inference_policy.trust.signing import VerifiedProfile
from policy_io.feed import PolicyFeed
from policy_io.snapshot import PolicySnapshot
from policy_io.state import PolicySettings, PolicyState, ProfileRevisions

Revision = VerifiedProfile | Lapse


class PolicyView:
    """The controller's reading of its policy feed: revisions by digest as the grant check takes
    them, and the evaluation of a Pod against the feed's snapshot."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.feed = PolicyFeed(settings, follow=True)
        self._generation = -1
        self._revisions: dict[str, Revision] = {}

    @property
    def state(self) -> PolicyState:
        """The settings, engine catalog and owner keys the feed plans with."""
        return self.feed.state

    @property
    def followed(self) -> ProfileRevisions:
        """Every labelled profile ConfigMap, verified once per revision (policy_io.state)."""
        return self.feed.state.followed

    @property
    def verifications(self) -> int:
        return self.feed.verifications

    @property
    def recipe_names(self) -> Mapping[Capability, str]:
        return self.feed.catalog_names

    @property
    def revisions(self) -> Mapping[str, Revision]:
        """Each known revision by bundle sha256: verified, or the lapse its refusal is."""
        snapshot = self.feed.snapshot
        if snapshot.generation != self._generation:
            self._generation = snapshot.generation
            self._revisions = {
                digest: found
                if isinstance(found, VerifiedProfile)
                else refused_lapse(found.configmap, found.refusal.refusal())
                for digest, found in snapshot.revisions.items()
            }
        return self._revisions

    # -- as watch events would (tests, benchmarks) -----------------------------------------------

    def apply_configmap(self, configmap: Mapping[str, Any]) -> set[str]:
        """A profile ConfigMap as it is now; returns the bundle digests whose meaning changed."""
        name = ObjectView(configmap).name
        if name is None:
            return set()
        return set(self.feed.revision_changed(name, configmap).digests)

    def remove_configmap(self, name: str) -> set[str]:
        return set(self.feed.revision_changed(name, None).digests)

    # -- deciding ------------------------------------------------------------------------------

    def lapse(self, snapshot: PolicySnapshot | None = None) -> Lapse | None:
        """Why no plan can be checked against its revision right now, whatever it names, if so
        (a configured recipe catalog that cannot be used is the core's to report)."""
        unreadable = (snapshot or self.feed.snapshot).profiles_unreadable
        if unreadable is None:
            return None
        return Lapse(
            PROFILES_UNREADABLE, f"{unreadable}, so no plan can be checked against its revision"
        )

    def context(self, now: datetime) -> PlanContext:
        return self.feed.snapshot.context(now)

    def evaluate(
        self, pod: Mapping[str, Any], now: datetime, scheduling_timeout: float
    ) -> Evaluation:
        snapshot = self.feed.snapshot
        return evaluate(
            pod,
            self.revisions,
            snapshot.context(now),
            now,
            scheduling_timeout=scheduling_timeout,
            lapse=self.lapse(snapshot),
            options=snapshot.options,
        )
