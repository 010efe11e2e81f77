"""The AdmissionReview v1 objects the webhook reads and writes, as typed shapes.

The API server sends `admission.k8s.io/v1` AdmissionReview objects and takes one back with the
same uid; these TypedDicts name the fields the webhook uses, so the type checker follows a
review from the edge (`parse_review`) through the answer (`Outcome`) to the envelope it returns.
They describe JSON as decoded, so they cost nothing at run time; the Pod inside a review stays a
plain mapping, checked field by field where it is read.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

API_VERSION = "admission.k8s.io/v1"


class AdmissionRequest(TypedDict):
    """The `request` of a review. `parse_review` proves the uid; every other field is as the
    sender wrote it until the review reads and checks it, so it is typed as unchecked."""

    uid: str
    kind: NotRequired[Any]
    resource: NotRequired[Any]
    name: NotRequired[Any]
    namespace: NotRequired[Any]
    operation: NotRequired[Any]
    object: NotRequired[Any]
    oldObject: NotRequired[Any]
    dryRun: NotRequired[Any]


class Status(TypedDict):
    """A metav1.Status: why a review is denied, with the HTTP code the API server reports."""

    status: Literal["Failure"]
    code: int
    reason: str
    message: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReview(TypedDict):
    """The answer's envelope: the same apiVersion and kind, and the response."""

    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: AdmissionResponse


__all__ = [
    "API_VERSION",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "Status",
]
