"""What the allocation controller must be allowed in a tenant namespace for its verdicts there to
mean anything, and how access reviews' answers become that judgment.

The owner release binds the controller's Role in each tenant namespace, and the tenant's
namespace admin (the built-in `admin` role) may delete or edit RoleBindings and Roles there. A
controller that may no longer list or watch the namespace's Pods does not see a Pod change, and
one that may no longer patch `pods/status` cannot say False: either way the last verdict stands,
and `kamiwaza.ai/AllocationVerified=True` outlives what it vouched for (an image changed after
the binding was deleted, say). So that loss fails closed where the owner still decides: the
extender places no engine Pod in a namespace until the API server confirms the controller's
rights there (`CONTROLLER_RIGHTS`, asked with SubjectAccessReviews), and the controller reports
its own (SelfSubjectAccessReviews) as a metric, a log line and an Event in the owner's namespace.

Pure: the reviews are built and read here, sent by the servers. An answer that is not known (not
asked yet, the review failed, or too old to trust) is neither allowed nor denied, and a verdict
holding one is not `present` either: the rights must be confirmed, not merely not denied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inference_policy.base.pod_view import ObjectView

REVIEW_API_VERSION = "authorization.k8s.io/v1"
# The owner release's Role and RoleBinding in each tenant namespace (charts/tmi, owner/controller).
CONTROLLER_BINDING = "tmi-allocation-controller"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True, slots=True)
class Right:
    """One verb on one resource (and subresource) of the core API group, in a namespace."""

    verb: str
    resource: str
    subresource: str = ""
    why: str = ""

    @property
    def resource_path(self) -> str:
        """`pods` or `pods/status`, as RBAC rules and the metrics' `resource` label name it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        return f"{self.verb} {self.resource_path}"


CONTROLLER_RIGHTS: tuple[Right, ...] = (
    Right("list", "pods", why="to find the engine Pods whose grant it checks"),
    Right("watch", "pods", why="to see an engine Pod change after its verdict"),
    Right("get", "pods", why="to read a Pod afresh before deciding again"),
    Right("patch", "pods", "status", why="to write the AllocationVerified condition"),
)


def review_attributes(right: Right, namespace: str) -> dict[str, str]:
    """The `resourceAttributes` of a review asking for `right` in `namespace`."""
    attributes = {
        "namespace": namespace,
        "verb": right.verb,
        "group": "",
        "resource": right.resource,
    }
    if right.subresource:
        attributes["subresource"] = right.subresource
    return attributes


def service_account_groups(user: str) -> list[str]:
    """The groups the API server gives a user name when it authenticates it: a ServiceAccount's
    are its namespace's and every ServiceAccount's, so a binding to either group counts."""
    if user.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = user.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":", 1)[0]
        return [
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ]
    return ["system:authenticated"]


def subject_access_review(user: str, right: Right, namespace: str) -> dict[str, Any]:
    """A SubjectAccessReview asking whether `user` holds `right` in `namespace`."""
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": service_account_groups(user),
            "resourceAttributes": review_attributes(right, namespace),
        },
    }


def self_access_review(right: Right, namespace: str) -> dict[str, Any]:
    """A SelfSubjectAccessReview: does the identity asking hold `right` in `namespace`?"""
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": review_attributes(right, namespace)},
    }


def review_allowed(document: object) -> bool | None:
    """A review's answer: True allowed, False not allowed; None when it is not an answer."""
    allowed = ObjectView(document).status.get("allowed")
    return allowed if isinstance(allowed, bool) else None


@dataclass(frozen=True, slots=True)
class RightsVerdict:
    """What the answers say of one identity's rights in one namespace."""

    namespace: str
    missing: tuple[Right, ...] = ()
    unknown: tuple[Right, ...] = ()
    # Why some answers are unknown (the review's failure), when known.
    why: str = ""

    @property
    def present(self) -> bool:
        """Every right confirmed: nothing denied, nothing unknown."""
        return not self.missing and not self.unknown


def judge(
    namespace: str,
    answers: Mapping[Right, bool | None],
    rights: Iterable[Right] = CONTROLLER_RIGHTS,
    why: str = "",
) -> RightsVerdict:
    """The verdict of `answers` (a right absent from them is unknown) on `rights`."""
    wanted = tuple(rights)
    return RightsVerdict(
        namespace,
        missing=tuple(r for r in wanted if answers.get(r) is False),
        unknown=tuple(r for r in wanted if answers.get(r) is None),
        why=why,
    )


def _listed(rights: Iterable[Right]) -> str:
    return ", ".join(str(right) for right in rights)


def describe(verdict: RightsVerdict, identity: str) -> str:
    """The verdict in a sentence for an Event or a log line: what is missing or unconfirmed."""
    where = f"in namespace {verdict.namespace!r}"
    if verdict.missing:
        return f"{identity} may not {_listed(verdict.missing)} {where}"
    if verdict.unknown:
        because = f" ({verdict.why})" if verdict.why else ""
        return f"{identity}'s rights {where} ({_listed(verdict.unknown)}) are unconfirmed{because}"
    return f"{identity} may {_listed(CONTROLLER_RIGHTS)} {where}"


def restore_hint(namespace: str) -> str:
    """What the owner does about missing rights: the Role and RoleBinding to put back."""
    return (
        f"restore Role and RoleBinding {CONTROLLER_BINDING} in namespace {namespace!r} "
        "(an upgrade of the owner release applies them again)"
    )


def placement_refusal(verdict: RightsVerdict, identity: str) -> str:
    """Why no engine Pod of the namespace is placed while `verdict` is not `present`."""
    consequence = (
        "so no AllocationVerified verdict can be checked there and no engine Pod is placed"
    )
    if verdict.missing:
        return (
            f"the allocation controller {describe(verdict, identity)}, {consequence}; "
            f"{restore_hint(verdict.namespace)}"
        )
    return f"the allocation controller {describe(verdict, identity)}, {consequence} until they are"


# The reviews' rate an owner server keeps to, whatever the number of tenants: a round asks every
# right in every tenant namespace, so with many tenants the rounds space out (one every 20 s at
# 100 tenants) rather than the API server answering hundreds of reviews a second.
MAX_REVIEWS_PER_SECOND = 20.0


def review_interval(interval: float, namespaces: int) -> float:
    """How often a server asks each right in each of `namespaces` tenant namespaces: every
    `interval` seconds, or less often when that would pass `MAX_REVIEWS_PER_SECOND`."""
    return max(interval, namespaces * len(CONTROLLER_RIGHTS) / MAX_REVIEWS_PER_SECOND)


__all__ = [
    "CONTROLLER_BINDING",
    "CONTROLLER_RIGHTS",
    "MAX_REVIEWS_PER_SECOND",
    "REVIEW_API_VERSION",
    "Right",
    "RightsVerdict",
    "describe",
    "judge",
    "placement_refusal",
    "restore_hint",
    "review_allowed",
    "review_interval",
    "self_access_review",
    "service_account_groups",
    "subject_access_review",
]
