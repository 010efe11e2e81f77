"""Who may write what of a Pod's status in an opted-in namespace: the status policy's CEL.

The tenant's namespace admin holds `pods/status` patch (the seed's installer), and every owner
part reads Pod status: the scheduler and the extender stop accounting a Pod whose `phase` says
`Succeeded` (its GPU is given again), the controller stops checking it, and a forged
`nominatedNodeName`, container status or claim status is read as the truth by someone. So the
rule is an allow-list, decided here once:

* the identities whose status writes are the cluster's own pass untouched: a kubelet
  (`system:node:*` in `system:nodes`), the default scheduler, kube-controller-manager and the
  controllers it runs under their own ServiceAccounts in `kube-system`, and the identities the
  owner lists for the tenant (the policy parameter `statusWriters`: the owner's scheduler, the
  allocation controller, a node simulator), none of which a namespace admin can act as;
* anyone else may change only Pod conditions whose type is qualified by a domain other than the
  owner's (`example.com/Ready`, the readiness gates a tenant's own controller answers). Every
  other status field, and every unqualified condition type (the system's: `PodScheduled`,
  `Ready`, `DisruptionTarget`, ...) or the owner's (`kamiwaza.ai/...`), is refused, with a
  message naming the field.

PodStatus is a typed object in CEL, so its fields are named one by one (`STATUS_FIELDS`); an
end-to-end test holds that list to the fields the API server serves, so a field a later release
adds fails the test instead of slipping past the policy.
"""

from __future__ import annotations

from typing import Any

from inference_policy.base.cel_text import cel_string
from inference_policy.base.wire import ALLOCATION_VERIFIED

WRITERS_PARAM = "statusWriters"
# Every field of core/v1 PodStatus as Kubernetes 1.36 serves it, but `conditions`.
STATUS_FIELDS = (
    "observedGeneration",
    "phase",
    "message",
    "reason",
    "nominatedNodeName",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "qosClass",
    "ephemeralContainerStatuses",
    "resize",
    "resourceClaimStatuses",
    "extendedResourceClaimStatus",
    "allocatedResources",
    "resources",
    "nodeAllocatableResourceClaimStatuses",
)
# The condition-type domain that belongs to the owner, with every subdomain of it (`tmi.`, any
# the owner adds later): conditions there are the owner's verdicts.
OWNER_DOMAIN = ALLOCATION_VERIFIED.split("/", 1)[0]
OWNER_DOMAINS = (OWNER_DOMAIN,)
STATUS_REFUSAL = "tenant-mode inference: only the cluster's own components may change "


def tenant_condition_type(kind: str) -> bool:
    """A condition type anyone with `pods/status` may write: qualified by a domain that is not
    the owner's. The Python twin of the CEL below, for the tests and the fuzzer's oracle."""
    domain, slash, _ = kind.partition("/")
    owned = domain == OWNER_DOMAIN or domain.endswith("." + OWNER_DOMAIN)
    return bool(slash) and not owned


def _tenant_type(var: str) -> str:
    # RE2: the domain before the first '/', the owner's or a subdomain of it.
    owner = "^([^/]*\\.)?" + OWNER_DOMAIN.replace(".", "\\.") + "/"
    return f"({var}.contains('/') && !{var}.matches({cel_string(owner)}))"


def _field_changed(field: str) -> str:
    new, old = f"object.status.{field}", f"oldObject.status.{field}"
    return f"(has({new}) != has({old}) || (has({new}) && {new} != {old}))"


def status_variables() -> list[dict[str, str]]:
    writers = f"params.spec.{WRITERS_PARAM}"
    user = "request.userInfo.username"
    trusted = " ||\n".join(
        [
            f"({user}.startsWith('system:node:') && has(request.userInfo.groups) &&\n"
            "  'system:nodes' in request.userInfo.groups)",
            f"{user} == 'system:kube-scheduler'",
            f"{user} == 'system:kube-controller-manager'",
            f"{user}.startsWith('system:serviceaccount:kube-system:')",
            f"{user} == params.spec.allocationController",
            f"(has({writers}) && {user} in {writers})",
        ]
    )
    fields = " +\n".join(
        f"({_field_changed(f)} ? [{cel_string('status.' + f)}] : [])" for f in STATUS_FIELDS
    )
    conditions = (
        "has(object.status) && has(object.status.conditions) ? object.status.conditions : []"
    )
    old_conditions = (
        "has(oldObject.status) && has(oldObject.status.conditions) ? "
        "oldObject.status.conditions : []"
    )
    locked = (
        f"variables.after.filter(c, !{_tenant_type('c.type')} &&\n"
        "  !variables.before.exists(o, o == c)).map(c, c.type) +\n"
        f"variables.before.filter(o, !{_tenant_type('o.type')} &&\n"
        "  !variables.after.exists(c, c == o)).map(o, o.type)"
    )
    both = "has(object.status) && has(oldObject.status)"
    return [
        {"name": "trusted", "expression": trusted},
        {
            "name": "fields",
            "expression": f"!({both}) ? (has(object.status) != has(oldObject.status) ? "
            f"['status'] : []) :\n{fields}",
        },
        {"name": "after", "expression": conditions},
        {"name": "before", "expression": old_conditions},
        {"name": "conditions", "expression": locked},
    ]


def status_validations() -> list[dict[str, str]]:
    rule = "variables.trusted || (size(variables.fields) == 0 && size(variables.conditions) == 0)"
    message = (
        f"{cel_string(STATUS_REFUSAL)} + (size(variables.fields) > 0 ? "
        "variables.fields.join(', ') : 'the condition(s) ' + variables.conditions.join(', ')) + "
        "'; ' + request.userInfo.username + ' may change only Pod conditions whose type is "
        "qualified by its own domain (example.com/Ready)'"
    )
    return [{"expression": rule, "messageExpression": message, "reason": "Forbidden"}]


def status_parts() -> dict[str, Any]:
    """What the chart's status policy takes from the core."""
    return {"variables": status_variables(), "validations": status_validations()}


__all__ = [
    "OWNER_DOMAIN",
    "OWNER_DOMAINS",
    "STATUS_FIELDS",
    "STATUS_REFUSAL",
    "WRITERS_PARAM",
    "status_parts",
    "tenant_condition_type",
]
