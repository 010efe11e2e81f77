"""The reasons of the `kamiwaza.ai/AllocationVerified` condition, each a stable CamelCase code.

The condition's reason, the Event the controller records with it and the `reason` label of
`tmi_allocation_verdicts_total` carry one of these; the runbook (docs/operations.md) has a
section for each, and a test holds the list and the runbook together.
"""

from __future__ import annotations

# Reasons, in the order a Pod with several problems reports them: what is wrong with the Pod
# itself comes first, since that is what an operator can see and fix on the spot.
VERIFIED = "Verified"
VERIFIED_PROFILE_EXPIRED = "VerifiedProfileExpired"
VERIFIED_REVISION_UNAVAILABLE = "VerifiedRevisionUnavailable"
PLAN_MISSING = "PlanMissing"
IMAGE_MISMATCH = "ImageMismatch"
RESOURCES_MISMATCH = "ResourcesMismatch"
UNPLANNED_DEVICE_ACCESS = "UnplannedDeviceAccess"
RUNTIME_CLASS_MISMATCH = "RuntimeClassMismatch"
NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
# A DRA plan's claim: not allocated as the plan says, or allocated a device not the binding's.
CLAIM_UNALLOCATED = "ClaimUnallocated"
DEVICE_MISMATCH = "DeviceMismatch"
PLAN_MISMATCH = "PlanMismatch"
PROFILE_REVISION_UNKNOWN = "ProfileRevisionUnknown"
PROFILE_REFUSED = "ProfileRefused"
PROFILE_EXPIRED = "ProfileExpired"
# The controller's reasons for a check it cannot make: the ConfigMaps it needs are unreadable.
PROFILES_UNREADABLE = "ProfilesUnreadable"
RECIPE_CATALOG_UNAVAILABLE = "RecipeCatalogUnavailable"
SCHEDULING_TIMEOUT = "SchedulingTimeout"
ENGINE_LABEL_REMOVED = "EngineLabelRemoved"
REASONS = (
    VERIFIED,
    VERIFIED_PROFILE_EXPIRED,
    VERIFIED_REVISION_UNAVAILABLE,
    PLAN_MISSING,
    IMAGE_MISMATCH,
    RESOURCES_MISMATCH,
    UNPLANNED_DEVICE_ACCESS,
    RUNTIME_CLASS_MISMATCH,
    NODE_SELECTOR_MISMATCH,
    CLAIM_UNALLOCATED,
    DEVICE_MISMATCH,
    PLAN_MISMATCH,
    PROFILE_REVISION_UNKNOWN,
    PROFILE_REFUSED,
    PROFILE_EXPIRED,
    PROFILES_UNREADABLE,
    RECIPE_CATALOG_UNAVAILABLE,
    SCHEDULING_TIMEOUT,
    ENGINE_LABEL_REMOVED,
)
