"""Every stable code the core gives, in one place: a refusal's, a node verdict's and an
AllocationVerified reason.

A refusal's `detail`, a verdict's `reason` and a condition's `message` are written for people:
they carry model names, binding ids, labels and sizes, so nothing may branch on them (metrics
would grow without bound, and a reworded sentence would silently move an outcome into another
class). Each outcome therefore also carries one of these codes; metrics label by it, the servers
log it, the dashboard groups by it, and the runbook (docs/operations.md) has a section for each
(a test holds the lists and the runbook together). The three families:

* `RefusalCode`: why a request, a review or a Pod was refused (the planner, the admission
  webhook's own checks, the owner's quota). Every refusal body carries it as `code` beside the
  seed's `detail`, except where the contract fixed another word first: `"code": "NoFit"`
  (`WIRE_NO_FIT`) for a request with its own block that no binding holds.
* `NodeVerdictCode`: why a node was passed or refused for a Pod, by placement and the extender
  (its `tmi_extender_node_verdicts_total{code}` metric), carried by the `Verdict` a node check
  returns.
* The reasons of the `kamiwaza.ai/AllocationVerified` condition, each a stable CamelCase
  string: the condition's reason, the Event the controller records with it and the `reason`
  label of `tmi_allocation_verdicts_total` carry one of them (`ALLOCATION_REASONS`, in the order
  a Pod with several problems reports them).

Part of the base: it imports nothing of the core, and every part may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# == Refusals ====================================================================================


class RefusalCode(StrEnum):
    """Why a request, a review or a Pod was refused, as a short label."""

    # -- the planner ---------------------------------------------------------------------------
    REQUEST_INVALID = "request-invalid"
    TENANT_MODE_OFF = "tenant-mode-off"
    ENGINE_NOT_QUALIFIED = "engine-not-qualified"
    MODEL_FORMAT = "model-format"
    ENGINE_CAPABILITY = "engine-capability"
    CONFIG_MISSING = "config-missing"
    CONFIG_UNSUPPORTED = "config-unsupported"
    DEVICE_COUNT = "device-count"
    CPU_REQUEST = "cpu-request"
    NO_FIT = "no-fit"
    EXTERNAL = "external"
    PROFILE_REFUSED = "profile-refused"
    CATALOG_UNAVAILABLE = "catalog-unavailable"
    IMAGE_MAP = "image-map"
    # -- the admission webhook's own checks ----------------------------------------------------
    FORGERY = "forgery"
    PLAN_ANNOTATION = "plan-annotation"
    REQUEST_MISSING = "request-missing"
    ENGINE_CONTAINER = "engine-container"
    MALFORMED_REVIEW = "malformed-review"
    MALFORMED_POD = "malformed-pod"
    TOO_LARGE = "too-large"
    INTERNAL_ERROR = "internal-error"
    # -- the owner's quota (`inference_policy.placing.quota`)
    # ------------------------------------------
    QUOTA_EXCEEDED = "quota-exceeded"


REFUSAL_DESCRIPTIONS: dict[RefusalCode, str] = {
    RefusalCode.REQUEST_INVALID: "the deployment request is not valid JSON or breaks its schema",
    RefusalCode.TENANT_MODE_OFF: "tenant mode is off and the deployment needs a GPU",
    RefusalCode.ENGINE_NOT_QUALIFIED: "the engine is not qualified in this release or bundle",
    RefusalCode.MODEL_FORMAT: "the model's format is not one the engine serves",
    RefusalCode.ENGINE_CAPABILITY: "the engine cannot serve what the request asks of it",
    RefusalCode.CONFIG_MISSING: "a setting the plan needs is missing (context length, pooling)",
    RefusalCode.CONFIG_UNSUPPORTED: "a model configuration key is not supported in tenant mode",
    RefusalCode.DEVICE_COUNT: "the device count is malformed or contradicts itself",
    RefusalCode.CPU_REQUEST: "the request's own CPU requests are below the engine's floor",
    RefusalCode.NO_FIT: "no binding of the signed profile can hold the deployment",
    RefusalCode.EXTERNAL: "an external endpoint asked for local resources",
    RefusalCode.PROFILE_REFUSED: "the signed profile is missing, refused or outside its window",
    RefusalCode.CATALOG_UNAVAILABLE: "a configured recipe catalog is missing or unusable",
    RefusalCode.IMAGE_MAP: "the engine image map belongs to another release",
    RefusalCode.FORGERY: "a Pod reaches for an accelerator outside a plan",
    RefusalCode.PLAN_ANNOTATION: "the plan annotation or the planned image was changed",
    RefusalCode.REQUEST_MISSING: "an engine Pod carries no deployment request",
    RefusalCode.ENGINE_CONTAINER: "the engine container the Pod names does not exist",
    RefusalCode.MALFORMED_REVIEW: "the AdmissionReview is not one this webhook answers",
    RefusalCode.MALFORMED_POD: "the Pod in the review cannot be read",
    RefusalCode.TOO_LARGE: "the body is larger than the configured limit",
    RefusalCode.INTERNAL_ERROR: "the server failed to check the request (fails closed; a bug)",
    RefusalCode.QUOTA_EXCEEDED: "the deployment would take its namespace past the owner's quota",
}

# The one code the contract puts on the wire, for requests with their own block that no binding
# holds (section 3 of the contract).
WIRE_NO_FIT = "NoFit"


# == Node verdicts ===============================================================================


class NodeVerdictCode(StrEnum):
    """Why a node was passed or refused for a Pod, as a short label."""

    FITS = "fits"
    # -- the node is not the hardware the binding vouches for (unresolvable) --------------------
    ARCH = "arch"
    RESOURCE_ABSENT = "resource-absent"
    GFD_MISSING = "gfd-missing"
    COMPUTE_CAPABILITY = "compute-capability"
    CUDA_DRIVER = "cuda-driver"
    MIG_STRATEGY = "mig-strategy"
    MIG_PRODUCT = "mig-product"
    SHARED_DEVICE = "shared-device"
    MEMORY = "memory"
    CAPACITY = "capacity"
    # -- the node is right but full now (resolvable) --------------------------------------------
    VRAM_BUCKET = "vram-bucket"
    INSUFFICIENT = "insufficient"
    OTHER_TENANT = "other-tenant"
    # -- every candidate at once: the Pod or the extender's view, not the node -----------------
    UNKNOWN_NODE = "unknown-node"
    PLAN_INVALID = "plan-invalid"
    PROFILE_REFUSED = "profile-refused"
    GRANT_MISMATCH = "grant-mismatch"
    UNPLANNED_DEVICE = "unplanned-device"
    OWNER_RIGHTS = "owner-rights"
    QUOTA = "quota"


VERDICT_DESCRIPTIONS: dict[NodeVerdictCode, str] = {
    NodeVerdictCode.FITS: "the node can hold the Pod's signed binding now",
    NodeVerdictCode.ARCH: "the node's architecture is not the binding's",
    NodeVerdictCode.RESOURCE_ABSENT: "the node advertises none of the binding's resource",
    NodeVerdictCode.GFD_MISSING: "no GPU Feature Discovery labels confirm the card",
    NodeVerdictCode.COMPUTE_CAPABILITY: "the card's compute capability is below the attested one",
    NodeVerdictCode.CUDA_DRIVER: "the driver's CUDA major is below the attested one",
    NodeVerdictCode.MIG_STRATEGY: "the MIG strategy does not advertise the binding's devices",
    NodeVerdictCode.MIG_PRODUCT: "the node's MIG slices are not the binding's profile",
    NodeVerdictCode.SHARED_DEVICE: "the node time-slices devices the binding guarantees whole",
    NodeVerdictCode.MEMORY: "the card has less memory than the binding attests usable",
    NodeVerdictCode.CAPACITY: "the Pod asks more than the node's whole allocatable",
    NodeVerdictCode.VRAM_BUCKET: "the accounted VRAM bucket has too little free now",
    NodeVerdictCode.INSUFFICIENT: "too little of the binding's resource is free now",
    NodeVerdictCode.OTHER_TENANT: "another tenant holds an accounted share on the GPU now",
    NodeVerdictCode.UNKNOWN_NODE: "the scheduler named a node the extender has not listed",
    NodeVerdictCode.PLAN_INVALID: "the Pod's plan cannot be read or disagrees with the Pod",
    NodeVerdictCode.PROFILE_REFUSED: "the extender holds no verified profile for the plan",
    NodeVerdictCode.GRANT_MISMATCH: "the Pod is not what its verified revision plans for it",
    NodeVerdictCode.UNPLANNED_DEVICE: "the Pod asks for an accelerator without a plan",
    NodeVerdictCode.OWNER_RIGHTS: "the allocation controller's rights in the namespace are "
    "missing or unconfirmed",
    NodeVerdictCode.QUOTA: "the Pod would take its namespace past the owner's quota",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer; `code` is its stable class (`NodeVerdictCode`), for metrics and logs.
    An unresolvable verdict is one no change of load can help (the scheduler skips preemption
    for that node); a resolvable one is too little free capacity now."""

    fits: bool
    reason: str | None = None
    unresolvable: bool = False
    code: NodeVerdictCode = NodeVerdictCode.FITS


FITS = Verdict(True)


def refuse(code: NodeVerdictCode, reason: str) -> Verdict:
    return Verdict(False, reason, True, code)


def busy(code: NodeVerdictCode, reason: str) -> Verdict:
    return Verdict(False, reason, False, code)


# == AllocationVerified reasons ==================================================================

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
ALLOCATION_REASONS = (
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


__all__ = [
    "ALLOCATION_REASONS",
    "CLAIM_UNALLOCATED",
    "DEVICE_MISMATCH",
    "ENGINE_LABEL_REMOVED",
    "FITS",
    "IMAGE_MISMATCH",
    "NODE_SELECTOR_MISMATCH",
    "PLAN_MISMATCH",
    "PLAN_MISSING",
    "POD_TOO_LARGE",
    "PROFILES_UNREADABLE",
    "PROFILE_EXPIRED",
    "PROFILE_REFUSED",
    "PROFILE_REVISION_UNKNOWN",
    "RECIPE_CATALOG_UNAVAILABLE",
    "REFUSAL_DESCRIPTIONS",
    "RESOURCES_MISMATCH",
    "RUNTIME_CLASS_MISMATCH",
    "SCHEDULING_TIMEOUT",
    "SHARED_WITH_ANOTHER_TENANT",
    "UNPLANNED_DEVICE_ACCESS",
    "VERDICT_DESCRIPTIONS",
    "VERIFIED",
    "VERIFIED_PROFILE_EXPIRED",
    "VERIFIED_REVISION_UNAVAILABLE",
    "VERIFIED_SHARED_WITH_ANOTHER_TENANT",
    "WIRE_NO_FIT",
    "NodeVerdictCode",
    "RefusalCode",
    "Verdict",
    "busy",
    "refuse",
]
