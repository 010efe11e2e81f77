"""RBAC on the local control plane: namespace grants and the aggregated ClusterRoles.

Tests bind users to the stock roles the way a cluster admin would and must know the grant is in
force before they act (the authorizer reads bindings from an informer cache); and the bootstrap
``admin``/``edit``/``view`` roles carry only an aggregation rule until something fills them in.
Both are done here, through the admin's client, for ``ControlPlane`` to offer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localcluster.plane.kube import JSON, Kube
from localcluster.plane.process import wait_until

_CLUSTER_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels AND matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def grant_namespace_role(
    kube: Kube, identity: str, user: str, namespace: str, cluster_role: str, *, wait: bool
) -> JSON:
    """Bind ``user`` (the identity's user name) to a ClusterRole inside one namespace; with
    ``wait``, return once the authorizer grants the role's first rule."""
    binding = kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{identity}-{cluster_role}", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": cluster_role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    if wait:
        role = kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", cluster_role)
        rule = next(
            (r for r in role.get("rules") or [] if r.get("resources") and r.get("verbs")),
            None,
        )
        if rule is not None:
            attrs = {
                "namespace": namespace,
                "group": (rule.get("apiGroups") or [""])[0].replace("*", ""),
                "resource": rule["resources"][0].replace("*", "pods"),
                "verb": rule["verbs"][0].replace("*", "get"),
            }
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": attrs},
            }
            wait_until(
                lambda: kube.request(
                    "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review
                )["status"].get("allowed"),
                timeout=30,
                what=f"RBAC to grant {user} {cluster_role} in {namespace}",
            )
    return binding


def aggregate_cluster_roles(kube: Kube) -> list[str]:
    """Fill in every aggregated ClusterRole from the roles its selectors match, as
    kube-controller-manager's clusterrole-aggregation controller would; the roles changed."""
    changed: list[str] = []
    # Aggregated roles can select other aggregated roles (admin <- edit <- view);
    # repeat until nothing changes.
    for _ in range(5):
        roles = {r["metadata"]["name"]: r for r in kube.request("GET", _CLUSTER_ROLES)["items"]}
        updated = False
        for name, role in sorted(roles.items()):
            selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
            if not selectors:
                continue
            rules: list[Any] = []
            for other_name, other in sorted(roles.items()):
                if other_name == name:
                    continue
                labels = other["metadata"].get("labels") or {}
                if any(selector_matches(sel, labels) for sel in selectors):
                    for rule in other.get("rules") or []:
                        if rule not in rules:
                            rules.append(rule)
            if rules != (role.get("rules") or []):
                kube.request(
                    "PATCH",
                    f"{_CLUSTER_ROLES}/{name}",
                    body={"rules": rules},
                    content_type="application/merge-patch+json",
                )
                changed.append(name)
                updated = True
        if not updated:
            break
    return changed
