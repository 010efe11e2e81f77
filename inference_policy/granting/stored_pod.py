"""Reading a Pod as the API server stored it, for the AllocationVerified verdict.

The controller judges whatever the API holds: a Pod any writer may have changed after admission,
with fields of any shape. The fields themselves are read through the one Pod view
(`inference_policy.base.pod_view`), which treats what is unreadable as absent; what is here is
what the verdict makes of them (whether it held before, when the Pod was made, its plan), so a
malformed Pod gets a verdict saying what is wrong rather than an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ALLOCATION_VERIFIED, PLAN_ANNOTATION
from inference_policy.planning.plan import Plan, PlanError, parse_plan

CONDITION_TYPE = ALLOCATION_VERIFIED


def verified_before(pod: Mapping[str, Any]) -> bool:
    """The Pod's condition already reads True: the grant was vouched for at some point."""
    current = PodView(pod).condition(CONDITION_TYPE)
    return current is not None and current.get("status") == "True"


def parse_time(value: Any) -> datetime | None:
    """A Kubernetes Time or MicroTime (`...Z`, with or without a fraction); None if unreadable."""
    if not isinstance(value, str) or not value.endswith("Z"):
        return None
    try:
        return datetime.fromisoformat(value[:-1]).replace(tzinfo=UTC)
    except ValueError:
        return None


def created_at(pod: Mapping[str, Any]) -> datetime | None:
    return parse_time(PodView(pod).creation_timestamp)


def read_plan(pod: Mapping[str, Any]) -> Plan | str:
    """The Pod's plan, read by the one plan parser, or a sentence saying why there is none."""
    text = PodView(pod).annotation(PLAN_ANNOTATION)
    if text is None:
        return (
            f"the Pod carries no {PLAN_ANNOTATION} annotation: the admission webhook did not "
            "plan it"
        )
    try:
        return parse_plan(text)
    except PlanError as exc:
        return str(exc)


def plan_revision(pod: Mapping[str, Any]) -> str | None:
    """The bundle sha256 of the profile revision the Pod's plan was made under, if any."""
    plan = read_plan(pod)
    return None if isinstance(plan, str) else plan.bundle_sha256
