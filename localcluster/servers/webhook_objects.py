"""The Kubernetes objects around the local webhook: its settings, RBAC, configuration, the profile
it reads, the RuntimeClasses and opt-in label engine Pods need, and a probe Pod to prove it plans.

All of it is rendered from the shipped chart (charts/tmi) where the chart has it, so the e2e
tests exercise what users install.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from inference_policy.base.wire import (
    ENGINE_LABEL,
    OPT_IN_LABEL,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
)
from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME
from localcluster.install.install import (
    chart_values,
    render_owner_admission,
    render_tenant,
    wait_allowed,
)
from localcluster.plane.controlplane import HOST, ControlPlane
from localcluster.plane.kube import JSON
from localcluster.plane.pki import KeyPair
from localcluster.plane.process import (
    python_module,
)

ROOT = Path(__file__).resolve().parents[2]
PROBE_REQUEST = ROOT / "examples" / "request-qwen7b-gguf.json"

IDENTITY = "tmi-webhook"
WEBHOOK_ROLE = "tmi-webhook-read-profiles"
CONFIGURATION_NAME = "kamiwaza-tenant-inference"
# The name rbac.yaml's resourceNames grants; any other name is unreadable under the shipped Role.
DEFAULT_BUNDLE_CONFIGMAP = "kamiwaza-inference-profiles-r1"
# Own field manager: a later `create_namespace` (manager tmi-localcluster) must not take the
# opt-in label away, and removing it must not take anyone else's labels.
FIELD_MANAGER = "tmi-localcluster-webhook"
USER_BINDING_SUFFIX = "-local-user"


@dataclass(frozen=True)
class WebhookSettings:
    """The webhook's command-line settings (see ``python -m webhook --help``)."""

    owner_public_keys: tuple[str, ...]
    cluster_binding_id: str
    namespace: str = "kamiwaza"
    bundle_configmap: str = DEFAULT_BUNDLE_CONFIGMAP
    scheduler_name: str | None = None
    gpu_registry_credentials_secret: str | None = None
    cpu_registry_credentials_secret: str | None = None
    enabled: bool = True
    # Short, so a rotated certificate is picked up within a test's patience.
    cert_reload_seconds: float = 0.5
    # Stopping is the harness's teardown, not a rolling update: no one needs the drain.
    drain_seconds: float = 0.0
    shutdown_timeout: float = 2.0
    extra_args: tuple[str, ...] = ()
    # Installed from the chart: the Deployment container's arguments (without address and
    # certificate) and its environment (tmi-settings, POD_NAMESPACE). The settings above then
    # come from that environment alone, as in a Pod, and are not passed as flags.
    shipped_args: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()

    def argv(self, cert: KeyPair, port: int, kubeconfig: Path) -> list[str]:
        local = [
            f"--cert={cert.cert_file}",
            f"--key={cert.key_file}",
            f"--host={HOST}",
            f"--port={port}",
            f"--kubeconfig={kubeconfig}",
        ]
        timings = [
            f"--cert-reload-seconds={self.cert_reload_seconds}",
            f"--drain-seconds={self.drain_seconds}",
            f"--shutdown-timeout={self.shutdown_timeout}",
        ]
        if self.environment:
            return [
                *python_module("webhook"),
                *self.shipped_args,
                *local,
                *timings,
                *self.extra_args,
            ]
        args = [
            *python_module("webhook"),
            *local,
            f"--namespace={self.namespace}",
            "--enabled" if self.enabled else "--no-enabled",
            f"--bundle-configmap={self.bundle_configmap}",
            f"--owner-public-key={','.join(self.owner_public_keys)}",
            f"--cluster-binding-id={self.cluster_binding_id}",
            f"--cert-reload-seconds={self.cert_reload_seconds}",
            f"--drain-seconds={self.drain_seconds}",
            f"--shutdown-timeout={self.shutdown_timeout}",
        ]
        for flag, value in (
            ("--scheduler-name", self.scheduler_name),
            ("--gpu-registry-credentials-secret", self.gpu_registry_credentials_secret),
            ("--cpu-registry-credentials-secret", self.cpu_registry_credentials_secret),
        ):
            if value:
                args.append(f"{flag}={value}")
        args.extend(self.extra_args)
        return args


def serial_of(pem_or_der: bytes) -> int:
    """The serial number of a certificate, PEM or DER."""
    if pem_or_der.lstrip().startswith(b"-----"):
        return x509.load_pem_x509_certificate(pem_or_der).serial_number
    return x509.load_der_x509_certificate(pem_or_der).serial_number


def publish_profile(plane: ControlPlane, configmap: Mapping[str, Any]) -> JSON:
    """Publish a signed profile ConfigMap, replacing one of the same name.

    Signed profiles are immutable ConfigMaps, so a different revision under the same name
    can only be a delete and a create (the webhook sees DELETED, then ADDED).
    """
    kube = plane.kube("admin")
    meta = configmap["metadata"]
    kube.delete("v1", "ConfigMap", meta["name"], meta["namespace"])
    return kube.create(configmap)


def delete_profile(plane: ControlPlane, namespace: str, name: str) -> None:
    plane.kube("admin").delete("v1", "ConfigMap", name, namespace)


def apply_runtime_class(plane: ControlPlane, name: str, handler: str | None = None) -> JSON:
    """A RuntimeClass; the API server's RuntimeClass plugin refuses Pods naming a missing one."""
    return plane.kube("admin").apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name},
            "handler": handler or name,
        }
    )


def set_opt_in(plane: ControlPlane, namespace: str, enabled: bool) -> None:
    """Add or remove the namespace's opt-in label (the label only, through our own manager)."""
    meta: dict[str, Any] = {"name": namespace}
    if enabled:
        meta["labels"] = {OPT_IN_LABEL: "enabled"}
    plane.kube("admin").apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}, field_manager=FIELD_MANAGER
    )


def chart_values_for(settings: WebhookSettings, **extra: Any) -> dict[str, Any]:
    """The chart's values for these settings (what an owner would write in a values file)."""
    return chart_values(
        owner_public_keys=settings.owner_public_keys,
        cluster_binding_id=settings.cluster_binding_id,
        bundle_configmap=settings.bundle_configmap,
        scheduler_name=settings.scheduler_name or DEFAULT_SCHEDULER_NAME,
        tenant_namespace=settings.namespace,
        enabled=settings.enabled,
        gpu_registry_credentials_secret=settings.gpu_registry_credentials_secret,
        cpu_registry_credentials_secret=settings.cpu_registry_credentials_secret,
        **extra,
    )


def apply_webhook_rbac(
    plane: ControlPlane, settings: WebhookSettings, timeout: float = 30.0
) -> list[JSON]:
    """Apply the chart's ServiceAccount, Role and RoleBinding for the webhook, rendered for
    ``settings``, and wait until the authorizer lets that ServiceAccount read the profile. The
    identity's token is issued again: one issued for a ServiceAccount that was deleted (an
    uninstall) stops authenticating once the API server's token cache forgets it."""
    tenant = render_tenant(chart_values_for(settings), settings.namespace)
    docs = [
        tenant.get("ServiceAccount", IDENTITY),
        tenant.get("Role", WEBHOOK_ROLE),
        tenant.get("RoleBinding", WEBHOOK_ROLE),
    ]
    applied = plane.apply_manifest(docs)
    plane.service_account_identity(settings.namespace, IDENTITY)
    user = f"system:serviceaccount:{settings.namespace}:{IDENTITY}"
    wait_allowed(
        plane,
        user,
        [
            {
                "namespace": settings.namespace,
                "resource": "configmaps",
                "verb": verb,
                "name": settings.bundle_configmap,
            }
            for verb in ("list", "watch")
        ],
        timeout,
    )
    return applied


def webhook_configuration(
    url: str,
    ca_bundle: str,
    *,
    admission_policies: bool = True,
    namespace: str = "kamiwaza",
) -> JSON:
    """The chart's MutatingWebhookConfiguration for tenant ``namespace`` with every entry calling
    ``url`` and trusting ``ca_bundle`` (the owner.webhook.url and caBundle values);
    ``admission_policies`` False renders the fallback with the guard entry, for clusters
    without admission policies."""
    rendered = render_owner_admission(
        tenant_namespace=namespace,
        webhook_url=url,
        ca_bundle=ca_bundle,
        admission_policies=admission_policies,
    )
    return rendered.get("MutatingWebhookConfiguration", CONFIGURATION_NAME)


def engine_probe_pod(
    namespace: str, request: Mapping[str, Any] | None = None, name: str | None = None
) -> JSON:
    """An engine Pod as the platform creates it, before the webhook has planned it."""
    body = request if request is not None else json.loads(PROBE_REQUEST.read_text())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"tmi-webhook-probe-{uuid.uuid4().hex[:8]}",
            "namespace": namespace,
            "labels": {ENGINE_LABEL: "tmi-webhook-probe"},
            "annotations": {REQUEST_ANNOTATION: json.dumps(body)},
        },
        "spec": {"containers": [{"name": "engine", "image": "placeholder.invalid/engine:1"}]},
    }


def is_planned(pod: Mapping[str, Any]) -> bool:
    return PLAN_ANNOTATION in (pod.get("metadata", {}).get("annotations") or {})


__all__ = [
    "CONFIGURATION_NAME",
    "DEFAULT_BUNDLE_CONFIGMAP",
    "ENGINE_LABEL",
    "IDENTITY",
    "OPT_IN_LABEL",
    "PLAN_ANNOTATION",
    "REQUEST_ANNOTATION",
    "WebhookSettings",
    "apply_runtime_class",
    "apply_webhook_rbac",
    "chart_values_for",
    "delete_profile",
    "engine_probe_pod",
    "is_planned",
    "publish_profile",
    "serial_of",
    "set_opt_in",
    "webhook_configuration",
]
