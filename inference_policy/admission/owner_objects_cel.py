"""The owner's objects in a tenant namespace are the owner's: the owner-objects policy's CEL.

The owner release places Roles, RoleBindings (the allocation controller's and the extender's
rights there), ResourceQuotas and claim templates in each tenant namespace, and the tenant's
namespace admin may write anything in its namespace: after it deleted the controller's
RoleBinding, a verified Pod whose image it then changed kept `AllocationVerified=True`. Each
such object carries the label `OWNER_LABEL`, and this policy refuses creating, changing or
deleting an object that carries it (before or after), or any TenantPolicy (the admission
policies' parameters), to every identity but the owner's.

Who is the owner is not a list of names: it is whoever may update the tenant's cluster-scoped
TenantAdmission, asked of the API server's own authorizer at the time of the request (a cluster
admin, the owner's Helm). A namespace admin may not, and cannot grant itself that right. Deleting
the namespace itself is the one exception: the namespace controller removes what is left in a
terminating namespace.
"""

from __future__ import annotations

from typing import Any

from inference_policy.base.cel_text import cel_string
from inference_policy.trust.rollback import GROUP, PLURAL

# The admission policies' parameters in each tenant namespace (TenantPolicy): the owner's
# whether or not they carry the label, since a policy bound once for every tenant reads whatever
# object of the name it finds in the namespace of the request.
PARAMS_PLURAL = "tenantpolicies"

OWNER_LABEL = "tmi.kamiwaza.ai/owner-part"
# What the owner release writes in a tenant namespace (group, resources).
OWNER_RESOURCES = (
    ("", ("resourcequotas",)),
    ("rbac.authorization.k8s.io", ("roles", "rolebindings")),
    ("resource.k8s.io", ("resourceclaimtemplates",)),
    (GROUP, (PARAMS_PLURAL,)),
)
OWNER_REFUSAL = "tenant-mode inference: "


def _labelled(obj: str) -> str:
    label = cel_string(OWNER_LABEL)
    return f"({obj} != null && has({obj}.metadata.labels) && {label} in {obj}.metadata.labels)"


def owner_objects_parts() -> dict[str, Any]:
    """What the chart's owner-objects policy takes from the core."""
    owner = (
        f"authorizer.group({cel_string(GROUP)}).resource({cel_string(PLURAL)})"
        ".name(request.namespace).check('update').allowed()"
    )
    terminating = (
        "request.operation == 'DELETE' && namespaceObject != null &&\n"
        "  has(namespaceObject.metadata.deletionTimestamp)"
    )
    variables = [
        {
            "name": "owned",
            "expression": f"{_labelled('oldObject')} || {_labelled('object')} ||\n"
            f"  request.resource.resource == {cel_string(PARAMS_PLURAL)}",
        },
    ]
    message = (
        f"{cel_string(OWNER_REFUSAL)} + request.kind.kind + ' ' + request.name + ' is the "
        f"cluster owner\\'s (it carries {OWNER_LABEL}, or holds the admission policies\\' "
        "parameters); only an identity that may update TenantAdmission ' + request.namespace + "
        "' may ' + request.operation.lowerAscii() + ' it'"
    )
    validations = [
        {
            "expression": f"!variables.owned || ({terminating}) ||\n  {owner}",
            "messageExpression": message,
            "reason": "Forbidden",
        }
    ]
    rules = [
        {
            "apiGroups": [group_name],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": list(resources),
        }
        for group_name, resources in OWNER_RESOURCES
    ]
    return {"resourceRules": rules, "variables": variables, "validations": validations}


__all__ = [
    "OWNER_LABEL",
    "OWNER_REFUSAL",
    "OWNER_RESOURCES",
    "PARAMS_PLURAL",
    "owner_objects_parts",
]
