"""What a server plans with at one moment: the policy inputs as `policy_io.feed` last read them.

A snapshot is immutable, so a request decided against one sees one consistent set of inputs even
while a watch delivers the next revision, and a server can remember answers for as long as the
snapshot's `generation` holds. It carries each input or why it is not usable: the verified
profile or its refusal, each configured recipe catalog or why not (`recipe_inputs`), the signed
revisions by bundle digest (what the controller checks a Pod against), and, when the API server
refuses this server's read of the signed profiles, that refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inference_policy.planning.catalog import EngineCatalog
from inference_policy.planning.planner import Decision, GpuOptions, PlanContext, decide
from inference_policy.planning.recipe_inputs import Capability, RecipeInput
from inference_policy.planning.room import Room
from inference_policy.trust.signing import ProfileRefused, RefusalRecord, VerifiedProfile


@dataclass(frozen=True, slots=True)
class RefusedRevision:
    """A signed profile revision that was refused, and the ConfigMap that carried it: its name
    and the reason alone, never the exception or the data."""

    configmap: str
    refusal: RefusalRecord


Revision = VerifiedProfile | RefusedRevision


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The inputs of every decision a server makes until the next change (`generation`)."""

    generation: int
    enabled: bool
    catalog: EngineCatalog
    catalog_refusal: str | None
    profile: VerifiedProfile | None
    profile_refusal: ProfileRefused | None
    gpu_recipes: RecipeInput
    cpu_recipes: RecipeInput
    # Every followed revision by its bundle sha256: the same bundle under two names is one
    # revision, and a verified copy wins over a refused one.
    revisions: Mapping[str, Revision]
    # Why the signed profile ConfigMaps may not be listed, while the API server says so.
    profiles_unreadable: str | None
    # The pinned profile's and each catalog's revision (uid/resourceVersion) in use.
    profile_revision: str | None
    catalog_revisions: Mapping[Capability, str | None]
    # The GPU options kept across decisions; it keys what it keeps by the objects above.
    options: GpuOptions = field(repr=False, compare=False)

    def recipes(self, capability: Capability) -> RecipeInput:
        return self.gpu_recipes if capability == "gpu" else self.cpu_recipes

    def context(self, now: datetime, room: Room | None = None) -> PlanContext:
        return PlanContext(
            catalog=self.catalog,
            now=now,
            enabled=self.enabled,
            profile=self.profile,
            profile_refusal=self.profile_refusal,
            catalog_refusal=self.catalog_refusal,
            gpu_recipes=self.gpu_recipes,
            cpu_recipes=self.cpu_recipes,
            room=room,
        )

    def decide(self, request: Any, now: datetime, room: Room | None = None) -> Decision:
        return decide(request, self.context(now, room), self.options)


__all__ = ["PolicySnapshot", "RefusedRevision", "Revision"]
