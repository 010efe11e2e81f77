"""The rollback floor: the lowest profile version the owner's side plans or places under.

A signed revision stays valid until it expires, and the name of the ConfigMap that carries it is
not signed, so anyone who can write the tenant namespace can put an older revision back (delete
r2, recreate it with r1's data) and plan under a binding the newer one withdrew. The configured
floor (`minimumBundleVersion`) stops that only once the owner raises it by hand. So the owner's
extender also keeps the highest version it has verified for each tenant, in the status of that
tenant's cluster-scoped TenantAdmission, which no namespace admin can write, and holds every
profile to the higher of the two.

The owner lowers the floor by changing the TenantAdmission's `spec.minimumBundleVersion` (the
chart's value): a record counts only while the configured floor is the one it was made under, so
after the change the floor is what the owner wrote until a higher revision is verified again. (To
allow a rollback without changing the configured floor, the owner clears the status.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference_policy.trust.signing import ProfileRefused, Reason

# Where the record lives: the TenantAdmission named after the tenant namespace.
GROUP = "tmi.kamiwaza.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TenantAdmission"
PLURAL = "tenantadmissions"


@dataclass(frozen=True, slots=True)
class Floor:
    """The configured floor, and the highest version recorded under it (0: none yet)."""

    configured: int = 1
    recorded: int = 0

    @property
    def value(self) -> int:
        return max(self.configured, self.recorded)

    def refusal(self, version: int) -> ProfileRefused | None:
        """Why a verified profile of this version may not be used, or None."""
        if version >= self.value:
            return None
        if self.recorded > self.configured:
            check = (
                f"version {version} is below the floor {self.value}, the highest version "
                "verified for this tenant (a rollback: the owner lowers the floor to allow it)"
            )
        else:
            check = f"version {version} is below the floor {self.value}"
        return ProfileRefused(Reason.TARGET, check)

    def record(self, version: int) -> dict[str, Any] | None:
        """The status to write once `version` has been verified, or None when the record
        already holds it."""
        if version <= self.recorded:
            return None
        return {"highestVerifiedVersion": version, "configuredFloor": self.configured}


class FloorUnreadable(ValueError):
    """A TenantAdmission whose floor cannot be read; the message says which field."""


def floor_of(tenant_admission: Mapping[str, Any], configured: int = 1) -> Floor:
    """The floor a TenantAdmission sets, over `configured` (the extender's own setting):
    `spec.minimumBundleVersion` when given, and the status record if it was made under that
    floor. Raises FloorUnreadable for a field of the wrong type."""
    spec = tenant_admission.get("spec")
    status = tenant_admission.get("status")
    floor = max(configured, _whole(spec, "minimumBundleVersion", "spec.minimumBundleVersion", 1))
    recorded = _whole(status, "highestVerifiedVersion", "status.highestVerifiedVersion", 0)
    under = _whole(status, "configuredFloor", "status.configuredFloor", 0)
    return Floor(floor, recorded if under == floor else 0)


def _whole(block: Any, key: str, where: str, default: int) -> int:
    if block is None:
        return default
    if not isinstance(block, Mapping):
        raise FloorUnreadable(f"{where.rsplit('.', 1)[0]} is not an object")
    value = block.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FloorUnreadable(f"{where} is not a whole number")
    return value


__all__ = [
    "API_VERSION",
    "KIND",
    "PLURAL",
    "Floor",
    "FloorUnreadable",
    "floor_of",
]
