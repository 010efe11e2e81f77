"""The owner's DRA guard as CEL: the claims a tenant namespace may hold, and its admin access.

A claim is a device request kube-scheduler satisfies on its own, so what a tenant namespace may
claim is decided in the API server, by the owner's ValidatingAdmissionPolicies, not by any
server of ours (whose outage must not open it):

* the claims policy (ResourceClaims and ResourceClaimTemplates in the tenant namespace): a claim
  is exactly one the owner published for a DRA binding (`inference_policy.trust.dra_claims`), which
  the policy's parameter, the tenant's TenantAdmission, lists: one request, `firstAvailable`
  over the owner's DeviceClasses in the owner's order, `ExactCount` of the template's count, no
  selectors, tolerations, constraints, config or admin access of its own. Anything else (a claim
  on the driver's own class `gpu.nvidia.com`, a class of another tenant, a selector, `All`
  devices) is refused with the first thing wrong;
* the engine Pod's side (`ENGINE_CLAIMS_FROM_OWNER`, a rule of the guard policy in
  `access_cel`): its claims come from those templates, never from a claim by name;
* the namespace policy: no one labels the tenant namespace
  `resource.kubernetes.io/admin-access`, the label that lets a claim there ask for admin access
  (every device on a node, in use or not).
"""

from __future__ import annotations

from typing import Any

from inference_policy.base.cel_text import cel_string
from inference_policy.trust.dra_claims import CLAIM_NAME

CLAIM_RESOURCES = ("resourceclaims", "resourceclaimtemplates")
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
_PREFIX = "'tenant-mode inference: ' + request.kind.kind + ' ' + object.metadata.name + ' "

ENGINE_CLAIMS_FROM_OWNER = (
    "!variables.engine || !has(object.spec.resourceClaims) ||\n"
    "  object.spec.resourceClaims.all(c, has(c.resourceClaimTemplateName) &&\n"
    "    !has(c.resourceClaimName) && has(params.spec.claimTemplates) &&\n"
    "    params.spec.claimTemplates.exists(t, t.name == c.resourceClaimTemplateName))"
)
ENGINE_CLAIMS_MESSAGE = (
    "'tenant-mode inference: an engine Pod\\'s resource claims come from the claim templates "
    "the owner published for its profile (' + (has(params.spec.claimTemplates) ? "
    "params.spec.claimTemplates.map(t, t.name).join(', ') : 'none') + '), through its plan'"
)


def claim_variables() -> list[dict[str, str]]:
    return [
        {
            "name": "spec",
            "expression": "request.resource.resource == 'resourceclaimtemplates' ? "
            "object.spec.spec : object.spec",
        },
        {
            "name": "requests",
            "expression": "has(variables.spec.devices) && has(variables.spec.devices.requests) ? "
            "variables.spec.devices.requests : []",
        },
        {
            "name": "classes",
            "expression": "has(params.spec.deviceClasses) ? params.spec.deviceClasses : []",
        },
        {
            "name": "templates",
            "expression": "has(params.spec.claimTemplates) ? params.spec.claimTemplates : []",
        },
        {
            "name": "subrequests",
            "expression": "variables.requests.filter(r, has(r.firstAvailable)).map(r, "
            "r.firstAvailable)",
        },
    ]


def _subrequests_all(test: str) -> str:
    return f"variables.subrequests.all(l, l.all(x, {test}))"


def claim_validations() -> list[dict[str, str]]:
    """Each widening refused with its own message, in the order a reader would fix them."""
    rules = [
        (
            "variables.requests.all(r, !has(r.exactly) ||\n"
            "  !has(r.exactly.adminAccess) || !r.exactly.adminAccess)",
            "asks for admin access to devices; no claim in a tenant namespace may'",
        ),
        (
            "variables.requests.all(r, !has(r.exactly) || r.exactly.deviceClassName in "
            "variables.classes) &&\n" + _subrequests_all("x.deviceClassName in variables.classes"),
            "names a DeviceClass the owner did not publish for this namespace; the owner\\'s "
            "classes here are ' + (size(variables.classes) > 0 ? variables.classes.join(', ') "
            ": 'none') + ', pinned to the signed profile'",
        ),
        (
            "variables.requests.all(r, !has(r.exactly) || (!has(r.exactly.selectors) &&\n"
            "  (!has(r.exactly.allocationMode) || r.exactly.allocationMode == 'ExactCount'))) "
            "&&\n"
            + _subrequests_all(
                "!has(x.selectors) && !has(x.tolerations) &&\n"
                "  (!has(x.allocationMode) || x.allocationMode == 'ExactCount')"
            )
            + " &&\n  (!has(variables.spec.devices) || (!has(variables.spec.devices.constraints) "
            "&&\n    !has(variables.spec.devices.config)))",
            "adds selectors, tolerations, constraints, configuration or allocationMode All "
            "to the owner\\'s classes; the owner\\'s template says exactly which devices'",
        ),
        (
            "size(variables.requests) == 1 && variables.requests.all(r, r.name == "
            f"{cel_string(CLAIM_NAME)} &&\n"
            "  !has(r.exactly) && has(r.firstAvailable)) &&\n"
            "  variables.templates.exists(t,\n"
            "    (request.resource.resource != 'resourceclaimtemplates' || "
            "t.name == object.metadata.name) &&\n"
            "    variables.requests.all(r, r.firstAvailable.map(x, x.deviceClassName) == "
            "t.deviceClasses &&\n"
            "      r.firstAvailable.all(x, (has(x.count) ? x.count : 1) == t.count)))",
            "is not a claim template the owner published for this namespace (' + "
            "(size(variables.templates) > 0 ? variables.templates.map(t, t.name).join(', ') : "
            "'none') + '); engine Pods get their devices from those, through the tenant "
            "webhook\\'s plan'",
        ),
    ]
    return [
        {"expression": rule, "messageExpression": _PREFIX + text, "reason": "Forbidden"}
        for rule, text in rules
    ]


def admin_access_validations() -> list[dict[str, str]]:
    label = cel_string(ADMIN_ACCESS_LABEL)
    return [
        {
            "expression": f"!has(object.metadata.labels) || !({label} in object.metadata.labels)",
            "messageExpression": (
                "'tenant-mode inference: namespace ' + object.metadata.name + ' serves a tenant; "
                f"the {ADMIN_ACCESS_LABEL} label would let its claims take admin access to "
                "devices, which the owner\\'s profile does not grant'"
            ),
            "reason": "Forbidden",
        }
    ]


def claim_policy_parts() -> dict[str, Any]:
    return {
        "resources": list(CLAIM_RESOURCES),
        "variables": claim_variables(),
        "validations": claim_validations(),
        "adminAccess": {"validations": admin_access_validations()},
    }


__all__ = [
    "ADMIN_ACCESS_LABEL",
    "CLAIM_RESOURCES",
    "ENGINE_CLAIMS_FROM_OWNER",
    "ENGINE_CLAIMS_MESSAGE",
    "admin_access_validations",
    "claim_policy_parts",
    "claim_validations",
    "claim_variables",
]
