"""The owner's admission policies on the local control plane, as the chart renders them.

The shield (MutatingAdmissionPolicy) and the guard (ValidatingAdmissionPolicy) run inside
kube-apiserver, so nothing of tmi's serves them; what the harness must do is apply exactly the
chart's objects (rendered for a tenant namespace and the owner's scheduler), wait until the API
server enforces them (it loads policies asynchronously, like webhook configurations), and take
them away again so that later test modules meet the cluster as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME, DEFAULT_SCHEDULER_NAMESPACE
from localcluster.install.install import Rendered, render_owner_admission, wait_allowed
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import JSON, ApiError, Kube
from localcluster.plane.process import wait_until
from localcluster.servers.controller_process import CONTROLLER_DEPLOYMENT

POLICY_LABEL = ("app.kubernetes.io/name", "tmi-admission")
# The parameters' CustomResourceDefinition: installed with the policies, never removed (the
# chart keeps it too), since deleting it deletes every tenant's parameters.
DEFINITION_LABEL = ("app.kubernetes.io/name", "tmi-admission-parameters")
_PROBE_IMAGE = "placeholder.invalid/tmi-policy-probe:1"
# What a tenant adds to the policies bound once for every tenant: its parameters (and their
# definitions, shared, never removed).
PARAMETER_KINDS = ("CustomResourceDefinition", "TenantAdmission", "TenantPolicy")
# The policies are bound once for every tenant namespace; these two are probed for.
GUARD = "kamiwaza-tmi-guard"
STATUS = "kamiwaza-tmi-status"


def _labelled(doc: Mapping[str, Any], label: tuple[str, str]) -> bool:
    labels = (doc.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(label[0]) == label[1])


def is_policy_object(doc: Mapping[str, Any]) -> bool:
    return _labelled(doc, POLICY_LABEL) or _labelled(doc, DEFINITION_LABEL)


def _acting(docs: Sequence[Mapping[str, Any]]) -> bool:
    """Do the objects include a policy (not only the parameters, as the owner part renders them
    with the policies off)?"""
    return any(d["kind"].endswith("AdmissionPolicy") for d in docs)


def policy_docs(owner: Rendered) -> list[JSON]:
    """The owner part's admission-policy objects: the parameters' definition first, then the
    parameters, the policies and their bindings."""
    docs = [doc for doc in owner.docs if is_policy_object(doc)]
    return sorted(docs, key=_apply_order)


def _apply_order(doc: Mapping[str, Any]) -> int:
    """Definitions, then parameters, then policies and bindings: a binding met before the
    parameters it reads refuses what it matches."""
    if _labelled(doc, DEFINITION_LABEL):
        return 0
    return 1 if doc["kind"] in PARAMETER_KINDS else 2


def render_policies(
    tenant_namespace: str,
    scheduler_name: str | None = None,
    owner_namespace: str = DEFAULT_SCHEDULER_NAMESPACE,
) -> list[JSON]:
    """The chart's policy objects, with the parameters for one tenant namespace."""
    rendered = render_owner_admission(
        tenant_namespace=tenant_namespace,
        scheduler_name=scheduler_name or DEFAULT_SCHEDULER_NAME,
        owner_namespace=owner_namespace,
    )
    return policy_docs(rendered)


def guard_name(docs: Sequence[Mapping[str, Any]]) -> str:
    (name,) = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == GUARD
    ]
    return str(name)


def denied_by_guard(message: str, docs: Sequence[Mapping[str, Any]]) -> bool:
    return f"ValidatingAdmissionPolicy '{guard_name(docs)}'" in message


def _probe(namespace: str, **container: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "tmi-policy-probe-", "namespace": namespace},
        "spec": {"containers": [{"name": "probe", "image": _PROBE_IMAGE, **container}]},
    }


def enforced(plane: ControlPlane, namespace: str, docs: Sequence[Mapping[str, Any]]) -> bool:
    """Do both policies act in ``namespace`` now: a plain Pod comes back shielded, and one that
    asks for a GPU is refused by the guard? (Server-side dry runs: nothing is stored.) A plain
    Pod refused is not yet: the owner's ResourceQuota refuses every Pod until the quota
    controller has counted it once."""
    kube = plane.kube("admin")
    try:
        stored = kube.create(_probe(namespace), dry_run=True)
    except ApiError:
        return False
    env = stored["spec"]["containers"][0].get("env") or []
    if {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} not in env:
        return False
    try:
        kube.create(_probe(namespace, resources={"limits": {"nvidia.com/gpu": "1"}}), dry_run=True)
    except ApiError as exc:
        return denied_by_guard(exc.message, docs)
    return False


def status_enforced(plane: ControlPlane, namespace: str, docs: Sequence[Mapping[str, Any]]) -> bool:
    """Does the status allow-list act in ``namespace`` now: a dry-run status write of a probe
    Pod's phase, by the cluster admin (no writer the policy lets by), refused by it? The API
    server loads each policy on its own, so the guard acting says nothing of this one."""
    names = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == STATUS
    ]
    if not names:
        return True
    kube = plane.kube("admin")
    probe = kube.create(_probe(namespace))
    name = probe["metadata"]["name"]
    try:
        kube.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            body={"status": {"phase": "Succeeded"}},
            query=[("dryRun", "All")],
            content_type="application/merge-patch+json",
        )
    except ApiError as exc:
        return exc.status == 403 and f"ValidatingAdmissionPolicy '{names[0]}'" in exc.message
    finally:
        kube.delete("v1", "Pod", name, namespace, grace_period_seconds=0)
    return False


def withdrawn(plane: ControlPlane, namespace: str) -> bool:
    """Has the API server stopped shielding plain Pods in ``namespace``?"""
    stored = plane.kube("admin").create(_probe(namespace), dry_run=True)
    return not stored["spec"]["containers"][0].get("env")


def _apply(kube: Kube, doc: JSON) -> JSON:
    """Apply one object; a parameter again while the API server answers its path 404: a change
    to a definition (another test's install labelled it otherwise, say) has the API server
    rebuild the definitions' handlers, and for a moment it serves no path of their group."""
    if doc["kind"] not in PARAMETER_KINDS or doc["kind"] == "CustomResourceDefinition":
        return kube.apply(doc)
    applied: JSON = wait_until(
        lambda: kube.apply(doc),
        timeout=30,
        what=f"{doc['kind']} {doc['metadata']['name']} applied, its definition served",
    )
    return applied


def install_policies(
    plane: ControlPlane,
    docs: Sequence[JSON],
    namespace: str,
    *,
    wait: bool = True,
    timeout: float = 60.0,
) -> list[JSON]:
    """Apply the policy objects; with ``wait``, until they act in the opted-in ``namespace``.
    (Applying a parameter waits for its kind to be served, so the definition comes first.)"""
    kube = plane.kube("admin")
    applied = [_apply(kube, doc) for doc in docs]
    if wait and _acting(docs):
        wait_until(
            lambda: enforced(plane, namespace, docs) and status_enforced(plane, namespace, docs),
            timeout=timeout,
            what=f"the owner's admission policies to act in {namespace}",
        )
    return applied


def remove_policies(
    plane: ControlPlane,
    docs: Sequence[Mapping[str, Any]],
    namespace: str | None = None,
    *,
    timeout: float = 60.0,
) -> None:
    """Delete the policy objects (the parameters' definition stays); with ``namespace`` (still
    opted in), wait until they stop acting there."""
    kube = plane.kube("admin")
    for doc in reversed(docs):
        if _labelled(doc, DEFINITION_LABEL):
            continue
        metadata = doc["metadata"]
        kube.delete(doc["apiVersion"], doc["kind"], metadata["name"], metadata.get("namespace"))
    if namespace is not None and _acting(docs):
        wait_until(
            lambda: withdrawn(plane, namespace),
            timeout=timeout,
            what=f"the owner's admission policies to stop acting in {namespace}",
        )


def verdict_writer(
    plane: ControlPlane, namespace: str, owner_namespace: str = DEFAULT_SCHEDULER_NAMESPACE
) -> Kube:
    """A client authenticated as the owner's allocation controller (its ServiceAccount in the
    owner's namespace, the one identity the verdict policy lets change the AllocationVerified
    condition) and allowed to patch Pod status in ``namespace``: for a test that writes the
    verdict without running the controller."""
    admin = plane.kube("admin")
    plane.create_namespace(owner_namespace)
    name = CONTROLLER_DEPLOYMENT
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": owner_namespace},
        }
    )
    rule = {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}
    role = {"name": f"{name}-verdict-writer", "namespace": namespace}
    admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": role,
            "rules": [rule],
        }
    )
    admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": role,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": role["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner_namespace}],
        }
    )
    identity = plane.service_account_identity(owner_namespace, name)
    wait_allowed(
        plane,
        f"system:serviceaccount:{owner_namespace}:{name}",
        [{"resource": "pods", "subresource": "status", "verb": "patch", "namespace": namespace}],
    )
    return plane.kube(identity)


__all__ = [
    "DEFINITION_LABEL",
    "PARAMETER_KINDS",
    "POLICY_LABEL",
    "denied_by_guard",
    "enforced",
    "guard_name",
    "install_policies",
    "is_policy_object",
    "policy_docs",
    "remove_policies",
    "render_policies",
    "status_enforced",
    "verdict_writer",
    "withdrawn",
]
