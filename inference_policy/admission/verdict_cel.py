"""Who may write the verdict: the CEL of the owner's policy on the AllocationVerified condition.

The condition is the proof an administrator reads ("readiness alone is not proof of the
requested grant"), so a tenant that could write it could forge the proof. The tenant's namespace
admin holds `pods/status` patch and may act as any ServiceAccount of its namespace (the built-in
`admin` role impersonates them and requests their tokens), so no identity in the tenant namespace
can be trusted with it: the controller that writes it runs in the owner's namespace, and this
policy refuses, in opted-in namespaces, any status write that changes the condition unless it
comes from that controller's identity, a parameter of the policy (the tenant's TenantAdmission
`spec.allocationController`). Status writes that leave the condition as it was (the kubelet's,
the scheduler's) pass untouched.
"""

from __future__ import annotations

from typing import Any

from inference_policy.base.cel_text import cel_string
from inference_policy.base.wire import ALLOCATION_VERIFIED

WRITER_PARAM = "allocationController"
VERDICT_REFUSAL = "only the owner's allocation controller may write the condition "


def _conditions(root: str) -> str:
    return (
        f"has({root}.status) && has({root}.status.conditions) ? "
        f"{root}.status.conditions.filter(c, c.type == {cel_string(ALLOCATION_VERIFIED)}) : []"
    )


def verdict_variables() -> list[dict[str, str]]:
    return [
        {"name": "before", "expression": _conditions("oldObject")},
        {"name": "after", "expression": _conditions("object")},
    ]


def verdict_validations() -> list[dict[str, str]]:
    writer = f"params.spec.{WRITER_PARAM}"
    return [
        {
            "expression": (
                f"variables.before == variables.after || request.userInfo.username == {writer}"
            ),
            "messageExpression": (
                f"{cel_string(VERDICT_REFUSAL + ALLOCATION_VERIFIED + ' (')} + {writer} + "
                f"{cel_string('); ')} + request.userInfo.username + {cel_string(' may not')}"
            ),
            "reason": "Forbidden",
        }
    ]


def verdict_parts() -> dict[str, Any]:
    """What the chart's verdict policy takes from the core."""
    return {"variables": verdict_variables(), "validations": verdict_validations()}


__all__ = ["VERDICT_REFUSAL", "WRITER_PARAM", "verdict_parts"]
