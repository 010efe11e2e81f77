"""`tmi doctor`'s judgments: the seed's install checks and the GPU-node checks, each a verdict
with what was found and the fix, from what the command read of the cluster.

Seed 001 lists checks an administrator runs by hand before an install: the namespace and its
labels, an installer identity that is namespace-scoped, the pod security guard present and
denying, cert-manager, the `nvidia` RuntimeClass, GPU allocatable on each GPU node with no
NoSchedule taint and GPU Feature Discovery's labels; once the owner part is installed, that its
allocation controller still holds its rights in the namespace. Each is judged here from plain
documents (the Namespace, access reviews' answers, the dry run's refusal, Nodes), so the rules
are tested without a cluster and the command only reads. A check that cannot be made with the
identity at hand (an installer cannot list Nodes) is `skip`, saying why. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inference_policy.base.pod_view import ObjectView, mapping_at
from inference_policy.base.wire import OPT_IN_LABEL
from inference_policy.granting.owner_rights import (
    CONTROLLER_RIGHTS,
    Right,
    describe,
    judge,
    restore_hint,
)

Status = Literal["pass", "fail", "skip"]
POD_SECURITY = {
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
POD_GUARD = "kamiwaza-tenant-pod-guard"
EXEC_GUARD = "kamiwaza-tenant-exec-guard"
GFD_LABELS = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/cuda.driver-version.major",
)
# What the installer must and must not be allowed (the seed's `kubectl auth can-i` list).
INSTALLER_RIGHTS: tuple[tuple[str, str, str, bool], ...] = (
    ("create", "apps", "deployments", True),
    ("create", "rbac.authorization.k8s.io", "clusterroles", False),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", False),
    ("list", "", "nodes", False),
)


def privileged_probe(namespace: str, name: str = "kamiwaza-pod-guard-probe") -> dict[str, Any]:
    """The seed's probe the guard must refuse: hostPID and a privileged container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"sidecar.istio.io/inject": "false"},
        },
        "spec": {
            "hostPID": True,
            "containers": [
                {"name": "probe", "image": "busybox:1.37", "securityContext": {"privileged": True}}
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str = ""

    def wire(self) -> dict[str, str]:
        body = {"check": self.name, "status": self.status, "found": self.found}
        if self.fix:
            body["fix"] = self.fix
        return body


def _selects(hook: Mapping[str, Any], namespace: str) -> bool:
    """Does the entry name ``namespace`` itself: a Service there, or (a webhook reached by URL)
    a namespaceSelector on the namespace's name, as the chart's entries carry."""
    if ((hook.get("clientConfig") or {}).get("service") or {}).get("namespace") == namespace:
        return True
    selector = hook.get("namespaceSelector") or {}
    return any(
        term.get("key") == "kubernetes.io/metadata.name"
        and term.get("operator") == "In"
        and namespace in (term.get("values") or [])
        for term in selector.get("matchExpressions") or []
    )


def serves(configurations: Sequence[Mapping[str, Any]] | None, namespace: str) -> bool | None:
    """Is the owner part that serves ``namespace`` installed: does a MutatingWebhookConfiguration
    call a webhook Service in it, or select it by name? None when they could not be read."""
    if configurations is None:
        return None
    return any(
        _selects(hook, namespace)
        for configuration in configurations
        for hook in configuration.get("webhooks") or []
    )


def namespace_checks(
    namespace: str, document: Mapping[str, Any] | None, served: bool | None = None
) -> list[Check]:
    """The namespace, its Pod Security labels, and its opt-in: required once the owner part
    serves it (``served``), and not before, since opting in earlier guards a namespace whose
    webhook is not there yet, so a preflight before the install does not fail on it."""
    if document is None:
        return [
            Check(
                "namespace",
                "fail",
                f"namespace {namespace} does not exist",
                f"kubectl create namespace {namespace}",
            )
        ]
    labels = ObjectView(document).labels
    checks = [Check("namespace", "pass", f"namespace {namespace} exists")]
    missing = [f"{k}={v}" for k, v in POD_SECURITY.items() if labels.get(k) != v]
    checks.append(
        Check(
            "namespace-pod-security",
            "fail" if missing else "pass",
            f"missing {', '.join(missing)}" if missing else "warn and audit restricted",
            f"kubectl label namespace {namespace} {' '.join(missing)}" if missing else "",
        )
    )
    opted = labels.get(OPT_IN_LABEL) == "enabled"
    found = f"{OPT_IN_LABEL}={labels.get(OPT_IN_LABEL, '(absent)')}"
    if not opted and not served:
        found += (
            "; no webhook configuration serves it yet"
            if served is False
            else "; the webhook configurations could not be read"
        )
    checks.append(
        Check(
            "namespace-opt-in",
            "pass" if opted else "fail" if served else "skip",
            found,
            ""
            if opted
            else f"once both chart parts are installed: kubectl label namespace {namespace} "
            f"{OPT_IN_LABEL}=enabled",
        )
    )
    return checks


def installer_check(installer: str, answers: Sequence[tuple[str, str, str, bool, bool]]) -> Check:
    """`answers`: (verb, group, resource, expected, allowed) per INSTALLER_RIGHTS entry."""
    wrong = [
        f"{'cannot' if expected else 'can'} {verb} {resource}"
        for verb, _, resource, expected, allowed in answers
        if allowed != expected
    ]
    if wrong:
        return Check(
            "installer-namespace-scoped",
            "fail",
            f"{installer} {'; '.join(wrong)}",
            "bind the admin ClusterRole with a RoleBinding in the namespace only, and no "
            "ClusterRoleBinding (seed 001, Installer identity)",
        )
    return Check(
        "installer-namespace-scoped",
        "pass",
        f"{installer} may create deployments here and no cluster-scoped objects or Node reads",
    )


def controller_rights_check(
    namespace: str,
    identity: str | None,
    answers: Mapping[Right, bool | None] | None,
    why: str = "",
) -> Check:
    """Does the allocation controller hold its rights in the namespace (the rule the extender
    places by, `inference_policy.granting.owner_rights`)? `identity`: the TenantAdmission's
    `allocationController`, None when no owner part with a controller serves the namespace (or
    this identity may not tell); `answers`: the SubjectAccessReviews', None when they could not
    be asked (`why`)."""
    name = "controller-rights"
    if identity is None:
        return Check(
            name,
            "skip",
            why or f"no allocation controller of an owner part serves namespace {namespace}",
        )
    if answers is None:
        return Check(name, "skip", f"its rights could not be reviewed: {why}")
    verdict = judge(namespace, answers, CONTROLLER_RIGHTS, why)
    if verdict.present:
        return Check(name, "pass", describe(verdict, identity))
    if verdict.missing:
        return Check(
            name,
            "fail",
            f"{describe(verdict, identity)}: no engine Pod is placed there",
            restore_hint(namespace),
        )
    return Check(name, "skip", describe(verdict, identity))


def guard_checks(
    present: Mapping[str, bool | None], refusal: str | None, admitted: bool
) -> list[Check]:
    """`present`: each guard object's name -> whether it exists (None: this identity may not
    read it, as an installer may not); `refusal`: the message the privileged probe's dry run
    was refused with (None: it was admitted, or not tried)."""
    absent = sorted(name for name, exists in present.items() if exists is False)
    unread = sorted(name for name, exists in present.items() if exists is None)
    if absent:
        presence = Check(
            "pod-guard-present",
            "fail",
            f"missing {', '.join(absent)}",
            "kubectl apply -f manifests/guard/ as the administrator",
        )
    elif unread:
        presence = Check(
            "pod-guard-present",
            "skip",
            f"{', '.join(unread)} may not be read with this identity (pod-guard-denies shows "
            "whether the guard acts)",
        )
    else:
        presence = Check("pod-guard-present", "pass", "the guard's policies and bindings exist")
    checks = [presence]
    if refusal is not None and POD_GUARD in refusal:
        checks.append(Check("pod-guard-denies", "pass", "a privileged Pod is refused by the guard"))
    else:
        found = "a privileged Pod was admitted" if admitted else f"refused otherwise: {refusal}"
        checks.append(
            Check(
                "pod-guard-denies",
                "fail",
                found,
                "the guard's bindings must name this namespace with validationActions [Deny]",
            )
        )
    return checks


def crd_check(name: str, present: bool | None, what: str, fix: str) -> Check:
    if present is None:
        return Check(name, "skip", f"{what} may not be read with this identity")
    return Check(
        name,
        "pass" if present else "fail",
        f"{what} {'present' if present else 'absent'}",
        "" if present else fix,
    )


def runtime_class_check(document: Mapping[str, Any] | None, readable: bool = True) -> Check:
    if not readable:
        return Check("runtimeclass-nvidia", "skip", "RuntimeClasses may not be read here")
    if document is None:
        return Check(
            "runtimeclass-nvidia",
            "fail",
            "no RuntimeClass nvidia",
            "install the NVIDIA container runtime (GPU Operator) and its RuntimeClass nvidia",
        )
    handler = document.get("handler")
    return Check(
        "runtimeclass-nvidia",
        "pass" if handler == "nvidia" else "fail",
        f"RuntimeClass nvidia has handler {handler}",
        "" if handler == "nvidia" else "its handler must be nvidia (the NVIDIA runtime)",
    )


def _gpu_count(node: Mapping[str, Any]) -> int:
    allocatable = mapping_at(ObjectView(node).status, "allocatable")
    total = 0
    for resource, value in allocatable.items():
        if resource == "nvidia.com/gpu" or resource.startswith("nvidia.com/mig-"):
            try:
                total += int(str(value))
            except ValueError:
                continue
    return total


def _name(node: Mapping[str, Any]) -> str:
    return str(ObjectView(node).name)


def gpu_node_checks(nodes: Sequence[Mapping[str, Any]] | None) -> list[Check]:
    if nodes is None:
        return [
            Check(name, "skip", "Nodes may not be listed with this identity (the owner's checks)")
            for name in ("gpu-nodes-allocatable", "gpu-nodes-untainted", "gpu-nodes-gfd")
        ]
    labelled = [n for n in nodes if "nvidia.com/gpu.product" in ObjectView(n).labels]
    gpu = [n for n in nodes if _gpu_count(n) > 0]
    if not labelled and not gpu:
        return [
            Check(
                "gpu-nodes-allocatable",
                "fail",
                "no node advertises nvidia.com/gpu or a MIG resource",
                "prepare the GPU nodes (driver, container runtime, GPU Operator), as seed 001 says",
            )
        ]
    checks: list[Check] = []
    empty = sorted(_name(n) for n in labelled if _gpu_count(n) == 0)
    counts = ", ".join(f"{_name(n)}={_gpu_count(n)}" for n in gpu)
    checks.append(
        Check(
            "gpu-nodes-allocatable",
            "fail" if empty else "pass",
            f"no GPU allocatable on {', '.join(empty)}" if empty else counts,
            "check the device plugin on those nodes (GPU Operator)" if empty else "",
        )
    )
    tainted = sorted(
        f"{_name(n)} ({t.get('key')}:{t.get('effect')})"
        for n in gpu
        for t in ObjectView(n).spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
    checks.append(
        Check(
            "gpu-nodes-untainted",
            "fail" if tainted else "pass",
            f"tainted: {', '.join(tainted)}" if tainted else "no NoSchedule or NoExecute taint",
            "remove the taint from the GPU nodes (engine Pods carry no toleration)"
            if tainted
            else "",
        )
    )
    unlabelled = []
    for node in gpu:
        labels = ObjectView(node).labels
        lacking = [label for label in GFD_LABELS if label not in labels]
        if lacking:
            unlabelled.append(f"{_name(node)} lacks {', '.join(lacking)}")
    unlabelled.sort()
    checks.append(
        Check(
            "gpu-nodes-gfd",
            "fail" if unlabelled else "pass",
            "; ".join(unlabelled)
            if unlabelled
            else "GPU Feature Discovery's labels on every GPU node",
            "enable GPU Feature Discovery (GPU Operator): the extender places by its labels"
            if unlabelled
            else "",
        )
    )
    return checks


__all__ = [
    "EXEC_GUARD",
    "INSTALLER_RIGHTS",
    "POD_GUARD",
    "Check",
    "controller_rights_check",
    "crd_check",
    "gpu_node_checks",
    "guard_checks",
    "installer_check",
    "namespace_checks",
    "privileged_probe",
    "runtime_class_check",
    "serves",
]
