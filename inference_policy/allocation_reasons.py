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
# The Pod's accounted share sits on a GPU where another tenant's share sits too, and its binding
# does not let it be shared across tenants (`grant_tenants`): False for a Pod not verified yet,
# True with its own reason for one verified before the other share came (or before the rule).
VERIFIED_SHARED_WITH_ANOTHER_TENANT = "VerifiedSharedWithAnotherTenant"
PLAN_MISSING = "PlanMissing"
# Larger than the controller keeps of a Pod (`kept_pod`), so it was not checked.
POD_TOO_LARGE = "PodTooLarge"
IMAGE_MISMATCH = "ImageMismatch"
RESOURCES_MISMATCH = "ResourcesMismatch"
UNPLANNED_DEVICE_ACCESS = "UnplannedDeviceAccess"
RUNTIME_CLASS_MISMATCH = "RuntimeClassMismatch"
NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
SHARED_WITH_ANOTHER_TENANT = "SharedWithAnotherTenant"
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
    VERIFIED_SHARED_WITH_ANOTHER_TENANT,
    PLAN_MISSING,
    POD_TOO_LARGE,
    IMAGE_MISMATCH,
    RESOURCES_MISMATCH,
    UNPLANNED_DEVICE_ACCESS,
    RUNTIME_CLASS_MISMATCH,
    NODE_SELECTOR_MISMATCH,
    SHARED_WITH_ANOTHER_TENANT,
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
