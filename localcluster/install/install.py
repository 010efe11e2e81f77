"""Install the shipped chart on the local control plane, as the tenant and the owner would.

The e2e stack must prove the install users get, so it renders charts/tmi with the test's values
(``helm template``), applies the tenant part server-side as the namespace's installer identity
(seed 001: the built-in ``admin`` role in the namespace plus the delegation Role) and the owner
part as a cluster administrator, and runs each server under the ServiceAccount the chart
creates, with a token from the TokenRequest API. There is no kubelet, so two things are played
by the harness and nothing else:

* a Deployment's Pods are local processes. The Deployments themselves are not applied (their
  Pods would land on the tests' fake nodes); each process gets the container's arguments, the
  environment of its ``envFrom`` ConfigMap and ``fieldRef`` variables, and the harness's own
  address, certificate and kubeconfig;
* the webhook and the extender are reached by URL on 127.0.0.1, which the chart supports as
  values (``owner.webhook.url``/``caBundle``, and the scheduler configuration rendered for the
  extender's URL), so the MutatingWebhookConfiguration is applied exactly as rendered.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chart_tools.render import OWNER, TENANT, find, part_values, render
from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME, DEFAULT_SCHEDULER_NAMESPACE
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import JSON
from localcluster.plane.process import python_module, wait_until

FIELD_MANAGER = "helm"
INSTALLER = "tmi-installer"
DELEGATION_ROLE = "kamiwaza-installer-delegation"
# What the tenant part grants its own ServiceAccounts beyond `admin`, which RBAC lets only a
# holder grant; manifests/installer/kamiwaza-installer.yaml ships the same Role.
DELEGATION_RULES = [
    {
        "apiGroups": [""],
        "resources": ["endpoints"],
        "verbs": ["create", "delete", "patch", "update"],
    },
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
]
# The kinds a kubelet-less plane applies; Deployments are played by local processes.
NOT_APPLIED = frozenset({"Deployment"})
RBAC_TIMEOUT = 30.0


def chart_values(
    *,
    owner_public_keys: Sequence[str],
    cluster_binding_id: str,
    bundle_configmap: str,
    scheduler_name: str,
    tenant_namespace: str,
    enabled: bool = True,
    gpu_registry_credentials_secret: str | None = None,
    cpu_registry_credentials_secret: str | None = None,
    scheduling_timeout_seconds: float = 300,
    log_level: str = "INFO",
    webhook_url: str | None = None,
    ca_bundle: str | None = None,
    scheduler_config: str | None = None,
    follow_revisions: bool = False,
    admission_policies: bool = True,
    tenants: Sequence[Mapping[str, Any]] = (),
    engine_image_map: Mapping[str, str] | None = None,
    dra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The values file a test installs with: the seed's names, plus the local addresses
    (``admission_policies`` False: the fallback for clusters without admission policies)."""
    resources: dict[str, Any] = {
        "enabled": enabled,
        "bundleConfigMap": bundle_configmap,
        "followRevisions": follow_revisions,
        "ownerPublicKey": ",".join(owner_public_keys),
        "clusterBindingId": cluster_binding_id,
        "schedulerName": scheduler_name,
    }
    if engine_image_map:
        resources["engineImageMap"] = dict(engine_image_map)
    if gpu_registry_credentials_secret:
        resources["gpuRegistryCredentialsSecret"] = gpu_registry_credentials_secret
    if cpu_registry_credentials_secret:
        resources["cpuRegistryCredentialsSecret"] = cpu_registry_credentials_secret
    owner: dict[str, Any] = {
        "tenantNamespace": tenant_namespace,
        "extender": {"certManager": False, "logLevel": log_level},
        "controller": {
            "logLevel": log_level,
            "schedulingTimeoutSeconds": max(1, round(scheduling_timeout_seconds)),
        },
        # None: no scheduler; "": the chart renders its configuration; else the one given.
        "scheduler": {"enabled": scheduler_config is not None, "config": scheduler_config or ""},
        "webhook": {"url": webhook_url or "", "caBundle": ca_bundle or ""},
        "admissionPolicies": {"enabled": admission_policies},
        # KWOK plays the kubelet for the fake nodes under its own identity, so it writes Pod
        # status as a kubelet would (the status policy lets the cluster's components by).
        "statusWriters": ["kwok"],
        # Further tenant namespaces of the same owner release (owner.tenants).
        "tenants": [dict(t) for t in tenants],
        # The DRA objects of each tenant's profile, as `tmi render-dra` writes them.
        "dra": dict(dra or {}),
    }
    return {
        "core": {"inferenceResources": resources},
        # No cert-manager here: the harness issues serving certificates from the plane's CA.
        "tenant": {"certManager": False, "webhook": {"logLevel": log_level}},
        "owner": owner,
    }


@dataclass(frozen=True)
class Rendered:
    """One part of the chart, rendered for one namespace."""

    namespace: str
    docs: list[JSON]

    def get(self, kind: str, name: str) -> JSON:
        return find(self.docs, kind, name)

    def installed(self) -> list[JSON]:
        """What an install applies on a cluster that runs containers: all but Helm hooks (they
        run only on their event)."""
        return [
            d
            for d in self.docs
            if "helm.sh/hook" not in ((d.get("metadata") or {}).get("annotations") or {})
        ]

    def tests(self) -> list[JSON]:
        """The Pods `helm test` runs (hook `test`), in the order they render."""
        return [
            d
            for d in self.docs
            if ((d.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook") == "test"
        ]

    def applied(self) -> list[JSON]:
        """What an install applies here, on nodes that run nothing: not the Deployments either
        (the harness runs their servers)."""
        return [d for d in self.installed() if d["kind"] not in NOT_APPLIED]

    def container(self, deployment: str) -> JSON:
        (container,) = self.get("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
        return dict(container)

    def environment(self, deployment: str, pod_name: str) -> dict[str, str]:
        """The container's environment as a kubelet would build it: its envFrom ConfigMaps
        (from the rendered part), then its own variables (``fieldRef``s resolved)."""
        container = self.container(deployment)
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            ref, prefix = source["configMapRef"]["name"], source.get("prefix", "")
            data = self.get("ConfigMap", ref).get("data") or {}
            env.update({prefix + k: str(v) for k, v in data.items()})
        fields = {"metadata.namespace": self.namespace, "metadata.name": pod_name}
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = str(var["value"])
            else:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    def args(self, deployment: str, *, replace: Iterable[str] = ()) -> list[str]:
        """The container's arguments without the flags named in ``replace`` (the harness sets
        those: address, certificate, port)."""
        dropped = tuple(f"{flag}=" for flag in replace)
        return [
            a for a in self.container(deployment).get("args") or [] if not a.startswith(dropped)
        ]


def render_part(part: str, values: Mapping[str, Any], namespace: str) -> Rendered:
    return Rendered(namespace, render(part_values(part, values), namespace=namespace))


def render_tenant(values: Mapping[str, Any], namespace: str) -> Rendered:
    return render_part(TENANT, values, namespace)


def render_owner(values: Mapping[str, Any], namespace: str) -> Rendered:
    return render_part(OWNER, values, namespace)


# The owner's admission objects do not depend on the trust values, but the chart requires
# well-formed ones.
_WELL_FORMED_KEY = "A" * 43 + "="


def render_owner_admission(
    *,
    tenant_namespace: str = "kamiwaza",
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    webhook_url: str = "",
    ca_bundle: str = "",
    admission_policies: bool = True,
    owner_namespace: str = DEFAULT_SCHEDULER_NAMESPACE,
) -> Rendered:
    """The owner part rendered for its admission objects (the webhook configuration, the
    admission policies and their parameters) for one tenant namespace."""
    values = chart_values(
        owner_public_keys=(_WELL_FORMED_KEY,),
        cluster_binding_id="any",
        bundle_configmap="kamiwaza-inference-profiles-r1",
        scheduler_name=scheduler_name,
        tenant_namespace=tenant_namespace,
        webhook_url=webhook_url,
        ca_bundle=ca_bundle,
        admission_policies=admission_policies,
    )
    return render_owner(values, owner_namespace)


def grant_installer(plane: ControlPlane, namespace: str) -> None:
    """Make ``tmi-installer`` the namespace's installer identity as seed 001 sets it up: the
    built-in ``admin`` ClusterRole bound in the namespace, and the delegation Role (what the
    chart grants its own ServiceAccounts beyond ``admin``: pods/status patch)."""
    kube = plane.kube("admin")
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": DELEGATION_ROLE, "namespace": namespace},
            "rules": DELEGATION_RULES,
        }
    )
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": DELEGATION_ROLE, "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": DELEGATION_ROLE,
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": plane.user(INSTALLER),
                }
            ],
        }
    )
    plane.grant_namespace_admin(INSTALLER, namespace)
    wait_allowed(
        plane,
        plane.user(INSTALLER),
        [{"resource": "pods", "subresource": "status", "verb": "patch", "namespace": namespace}],
    )


def apply(plane: ControlPlane, docs: Sequence[JSON], identity: str = "admin") -> list[JSON]:
    """Server-side apply, in order, as ``identity``; returns what was applied."""
    kube = plane.kube(identity)
    out: list[JSON] = []
    for doc in docs:
        kube.apply(doc, field_manager=FIELD_MANAGER)
        out.append(doc)
    return out


def apply_recorded(
    plane: ControlPlane,
    applied: list[JSON],
    docs: Sequence[JSON],
    identity: str = "admin",
    field_manager: str = FIELD_MANAGER,
) -> None:
    """Server-side apply, in order, as ``identity``, recording each object in ``applied`` first
    (so a half-applied install is still cleaned up) and once (an upgrade applies it again)."""
    kube = plane.kube(identity)
    for doc in docs:
        if not any(_same(doc, seen) for seen in applied):
            applied.append(doc)
        kube.apply(doc, field_manager=field_manager)


def remove_recorded(plane: ControlPlane, applied: Sequence[JSON]) -> None:
    """Delete what ``apply_recorded`` recorded, last first."""
    kube = plane.kube("admin")
    for doc in reversed(applied):
        meta = doc["metadata"]
        kube.delete(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))


def _same(a: JSON, b: JSON) -> bool:
    return (a["kind"], a["metadata"]["name"], a["metadata"].get("namespace")) == (
        b["kind"],
        b["metadata"]["name"],
        b["metadata"].get("namespace"),
    )


def wait_allowed(
    plane: ControlPlane,
    user: str,
    checks: Sequence[Mapping[str, str]],
    timeout: float = RBAC_TIMEOUT,
) -> None:
    """Until the authorizer (which reads bindings from an informer cache) grants every check."""
    kube = plane.kube("admin")
    for attrs in checks:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": dict(attrs)},
        }

        def allowed(body: JSON = review) -> bool:
            answer = kube.request(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body
            )
            return bool(answer["status"].get("allowed"))

        wait_until(allowed, timeout=timeout, what=f"RBAC to let {user} {dict(attrs)}")


CLEANUP_HOOK = "tmi-webhook-cleanup"


def run_uninstall_hook(plane: ControlPlane, tenant: Rendered) -> subprocess.CompletedProcess[str]:
    """What `helm uninstall` of the tenant part runs first: its pre-delete Job's command, as
    the Job's ServiceAccount (created by the installer, as the hook's first step), under the
    rights the chart grants it. The ServiceAccount stays for the caller to remove."""
    job = tenant.get("Job", CLEANUP_HOOK)
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    account = spec["serviceAccountName"]
    plane.kube(INSTALLER).apply(tenant.get("ServiceAccount", account))
    identity = plane.service_account_identity(tenant.namespace, account)
    return subprocess.run(
        [
            *python_module("tmi_cli"),
            *container["args"],
            f"--kubeconfig={plane.kubeconfig(identity)}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


__all__ = [
    "CLEANUP_HOOK",
    "FIELD_MANAGER",
    "INSTALLER",
    "NOT_APPLIED",
    "Rendered",
    "apply",
    "chart_values",
    "grant_installer",
    "render_owner",
    "render_owner_admission",
    "render_part",
    "render_tenant",
    "run_uninstall_hook",
    "wait_allowed",
]
