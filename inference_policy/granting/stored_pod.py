"""Reading a Pod as the API server stored it, for the AllocationVerified verdict.

The controller judges whatever the API holds: a Pod any writer may have changed after admission,
with fields of any shape. Each reader here answers from what is readable and treats the rest as
absent, so a malformed Pod gets a verdict saying what is wrong rather than an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from inference_policy.base.wire import ALLOCATION_VERIFIED, ENGINE_LABEL, PLAN_ANNOTATION
from inference_policy.planning.plan import Plan, PlanError, parse_plan

CONDITION_TYPE = ALLOCATION_VERIFIED


def metadata_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("metadata")
    return value if isinstance(value, Mapping) else {}


def spec_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("spec")
    return value if isinstance(value, Mapping) else {}


def mapping_of(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def strings_of(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return strings_of(metadata_of(pod).get("annotations"))


def is_engine_pod(pod: Mapping[str, Any]) -> bool:
    return ENGINE_LABEL in strings_of(metadata_of(pod).get("labels"))


def node_name(pod: Mapping[str, Any]) -> str | None:
    value = spec_of(pod).get("nodeName")
    return value if isinstance(value, str) and value else None


def condition(pod: Mapping[str, Any], condition_type: str) -> Mapping[str, Any] | None:
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return None
    for entry in conditions:
        if isinstance(entry, Mapping) and entry.get("type") == condition_type:
            return entry
    return None


def verified_before(pod: Mapping[str, Any]) -> bool:
    """The Pod's condition already reads True: the grant was vouched for at some point."""
    current = condition(pod, CONDITION_TYPE)
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
    return parse_time(metadata_of(pod).get("creationTimestamp"))


def read_plan(pod: Mapping[str, Any]) -> Plan | str:
    """The Pod's plan, read by the one plan parser, or a sentence saying why there is none."""
    text = pod_annotations(pod).get(PLAN_ANNOTATION)
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
