"""A configured recipe catalog as the core is given it: the catalog, or why it cannot be used.

The seed forbids silent fallbacks: when the install pins recipes and a pinned catalog is
missing or unusable, a local plan must not fall back to derivation. That rule is the core's, so
a server does not override a decision after the fact; it hands the planner (`planner.decide`)
and the grant check (`grant.evaluate`) a `CatalogUnavailable` where the catalog would be, and
they refuse with its words. The two wordings differ on purpose: the planner's is the refusal a
tenant reads (503, `catalog-unavailable`), the grant check's is the AllocationVerified message
(`RecipeCatalogUnavailable`) an operator reads on the Pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from inference_policy.planning.recipes import RecipeCatalog

Capability = Literal["gpu", "cpu"]
CAPABILITIES: tuple[Capability, ...] = ("gpu", "cpu")
ARRIVAL = "did not arrive from the configured ConfigMap"


class Cause(StrEnum):
    """What stands between the install and its configured catalog."""

    UNREAD = "unread"
    ABSENT = "absent"
    REFUSED = "refused"
    FOREIGN = "foreign"
    INVALID = "invalid"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class CatalogUnavailable:
    """Why the configured `capability` catalog (ConfigMap `configmap` in `namespace`) cannot be
    planned with. `detail` is the API server's refusal (REFUSED), the namespace the ConfigMap
    is in, as repr (FOREIGN), the loader's error (INVALID) or the failure's type (FAILED)."""

    capability: Capability
    configmap: str
    namespace: str
    cause: Cause
    detail: str = ""

    @property
    def refusal(self) -> str:
        """The planner's refusal text."""
        prefix = f"recipe catalog: {self.capability} recipe catalog {ARRIVAL}: "
        name, namespace = self.configmap, self.namespace
        match self.cause:
            case Cause.UNREAD:
                said = "it has not been read yet"
            case Cause.ABSENT:
                said = f"ConfigMap {name!r} was not found in namespace {namespace!r}"
            case Cause.REFUSED:
                said = f"ConfigMap {name!r} {self.detail} in namespace {namespace!r}"
            case Cause.FOREIGN:
                said = f"ConfigMap is in {self.detail}"
            case Cause.INVALID:
                said = self.detail
            case Cause.FAILED:
                said = f"ConfigMap {name!r} could not be read: {self.detail}"
        return prefix + said

    @property
    def problem(self) -> str:
        """The grant check's account of it, for the AllocationVerified message."""
        what = f"the {self.capability} recipe catalog"
        name = self.configmap
        match self.cause:
            case Cause.UNREAD:
                return f"{what} {name} has not been read yet"
            case Cause.ABSENT:
                return f"{what} ConfigMap {name} does not exist"
            case Cause.REFUSED:
                return f"{what} ConfigMap {name} {self.detail}"
            case Cause.FOREIGN:
                return f"{what} {name}: ConfigMap is in {self.detail}"
            case Cause.INVALID:
                return f"{what} {name}: {self.detail}"
            case Cause.FAILED:
                return f"{what} {name} could not be read: {self.detail}"


RecipeInput = RecipeCatalog | CatalogUnavailable | None
"""A capability's recipe catalog as the core takes it; None: the install pins none."""


def unavailable(*inputs: RecipeInput) -> list[CatalogUnavailable]:
    """The configured catalogs among `inputs` that cannot be used, in the order given."""
    return [given for given in inputs if isinstance(given, CatalogUnavailable)]


__all__ = [
    "ARRIVAL",
    "CAPABILITIES",
    "Capability",
    "CatalogUnavailable",
    "Cause",
    "RecipeInput",
    "unavailable",
]
