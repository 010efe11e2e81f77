"""Stable codes for every refusal, beside the seed's exact text.

A refusal's `detail` is written for people and carries model names, binding ids and sizes, so
nothing may branch on it: metrics would grow without bound and a reworded sentence would
silently move a refusal into another class. Each refusal the core (and the admission webhook's
own checks) can give therefore carries one of these codes. Metrics label by code, the servers
log it, the runbook is keyed by it, and every refusal body carries it as `code` beside the
seed's `detail`, except where the contract fixed another word first: `"code": "NoFit"` for a
request with its own block that no binding holds.
"""

from __future__ import annotations

from enum import StrEnum


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
    # -- the owner's quota (`inference_policy.quota`) ------------------------------------------
    QUOTA_EXCEEDED = "quota-exceeded"


DESCRIPTIONS: dict[RefusalCode, str] = {
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


__all__ = ["DESCRIPTIONS", "WIRE_NO_FIT", "RefusalCode"]
