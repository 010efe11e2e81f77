"""Deploy the tmi admission webhook on the local control plane, wired as an owner would wire it.

The e2e tests, the Pod-create benchmark and `make demo` need the webhook behind the real API
server, configured by the chart the project ships (charts/tmi) rather than by hand-written
stand-ins. There is no kubelet or Service here, so two things are adapted and nothing else:

* the webhook runs as a local process (``python -m webhook``) under the chart's ServiceAccount
  ``tmi-webhook``, with a token from the TokenRequest API, held to the chart's Role, rendered
  for the test's namespace and profile name;
* the chart's MutatingWebhookConfiguration is rendered with the values for a webhook outside
  the cluster (``owner.webhook.url`` pointing at that process, ``owner.webhook.caBundle`` the
  plane's CA, what cert-manager's cainjector would fill in); every rule, selector, match
  condition and policy stays as rendered.

Every step that the API server completes asynchronously (RBAC from its informer cache, a new
webhook configuration, a deleted one) is waited for by polling what it changes, so a
returned ``deploy_webhook`` is a webhook that is already planning Pods.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509

from inference_policy.schedconfig import DEFAULT_SCHEDULER_NAME, DEFAULT_SCHEDULER_NAMESPACE
from inference_policy.wire import (
    ENGINE_LABEL,
    OPT_IN_LABEL,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
)
from localcluster.controlplane import HOST, ControlPlane
from localcluster.install import chart_values, render_owner, render_tenant, wait_allowed
from localcluster.kube import JSON, ApiError
from localcluster.pki import KeyPair
from localcluster.process import (
    ComponentError,
    ManagedProcess,
    free_port,
    python_module,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
PROBE_REQUEST = ROOT / "examples" / "request-qwen7b-gguf.json"

IDENTITY = "tmi-webhook"
WEBHOOK_ROLE = "tmi-webhook-read-profiles"
CONFIGURATION_NAME = "kamiwaza-tenant-inference"
# The configuration does not depend on the trust values, but the chart requires well-formed ones.
_WELL_FORMED_KEY = "A" * 43 + "="
# The name rbac.yaml's resourceNames grants; any other name is unreadable under the shipped Role.
DEFAULT_BUNDLE_CONFIGMAP = "kamiwaza-inference-profiles-r1"
# Own field manager: a later `create_namespace` (manager tmi-localcluster) must not take the
# opt-in label away, and removing it must not take anyone else's labels.
FIELD_MANAGER = "tmi-localcluster-webhook"
USER_BINDING_SUFFIX = "-local-user"
START_TIMEOUT = 60.0
_PORT_RETRIES = 3


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


def _without_tmi_variables() -> dict[str, str]:
    # Every setting not given as a flag falls back to its TMI_* variable, and the server reads
    # an empty one as unset: blank whatever the calling shell exports, so only the settings
    # above are in force.
    return {name: "" for name in os.environ if name.startswith("TMI_")}


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
    ``settings``, and wait until the authorizer lets that ServiceAccount read the profile."""
    tenant = render_tenant(chart_values_for(settings), settings.namespace)
    docs = [
        tenant.get("ServiceAccount", IDENTITY),
        tenant.get("Role", WEBHOOK_ROLE),
        tenant.get("RoleBinding", WEBHOOK_ROLE),
    ]
    applied = plane.apply_manifest(docs)
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


def webhook_configuration(url: str, ca_bundle: str) -> JSON:
    """The chart's MutatingWebhookConfiguration with every entry calling ``url`` and trusting
    ``ca_bundle`` (the owner.webhook.url and caBundle values)."""
    values = chart_values(
        owner_public_keys=(_WELL_FORMED_KEY,),
        cluster_binding_id="any",
        bundle_configmap=DEFAULT_BUNDLE_CONFIGMAP,
        scheduler_name=DEFAULT_SCHEDULER_NAME,
        tenant_namespace="kamiwaza",
        webhook_url=url,
        ca_bundle=ca_bundle,
    )
    return render_owner(values, DEFAULT_SCHEDULER_NAMESPACE).get(
        "MutatingWebhookConfiguration", CONFIGURATION_NAME
    )


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


@dataclass
class LocalWebhook:
    """A running webhook process and, once installed, its webhook configuration."""

    plane: ControlPlane
    settings: WebhookSettings
    directory: Path
    port: int = 0
    process: ManagedProcess | None = None
    configuration: JSON | None = None
    probe_request: Mapping[str, Any] | None = None
    opted_in: bool = False
    # The ServiceAccount identity (``ControlPlane.service_account_identity``) it runs as.
    identity: str = IDENTITY
    _issued: int = field(default=0, repr=False)

    # -- addresses and certificates -------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    @property
    def tls(self) -> KeyPair:
        """The files the process serves from; ``rotate_certificate`` replaces them in place."""
        return KeyPair(self.directory / "tls.crt", self.directory / "tls.key")

    @property
    def log_file(self) -> Path:
        return self.plane.logs_dir / f"{self.directory.name}.log"

    @property
    def names(self) -> list[str]:
        """The webhook entries' names, as the API server quotes them in a denial."""
        source = self.configuration or webhook_configuration(self.url, "")
        return [str(w["name"]) for w in source["webhooks"]]

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.plane.ca_file))

    def _write_certificate(self) -> int:
        self._issued += 1
        pair = self.plane.issue_serving_cert(f"{self.directory.name}-{self._issued}", (HOST,))
        # Each file is swapped atomically; between the two the pair does not match, which the
        # reloader answers by keeping the current certificate until its next look.
        for source, target in (
            (pair.key_file, self.tls.key_file),
            (pair.cert_file, self.tls.cert_file),
        ):
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_bytes(source.read_bytes())
            tmp.chmod(0o600)
            os.replace(tmp, target)
        return serial_of(pair.cert_pem())

    def rotate_certificate(self) -> int:
        """Write a new serving certificate (same CA, new key and serial); return its serial."""
        return self._write_certificate()

    def served_serial(self) -> int:
        """The serial of the certificate a fresh TLS handshake with the process gets.

        The handshake verifies the chain against the plane's CA and the address against the
        certificate's SAN, as the API server does when it opens a connection to the webhook.
        """
        with (
            socket.create_connection((HOST, self.port), timeout=5) as sock,
            self._ssl_context().wrap_socket(sock, server_hostname=HOST) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        if der is None:
            raise ComponentError("the webhook presented no certificate")
        return serial_of(der)

    def wait_serving(self, serial: int, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.served_serial() == serial,
            timeout=timeout,
            what=f"the webhook to serve certificate serial {serial:x}",
            proc=self.process,
        )

    def metrics_text(self) -> str:
        """The process's /metrics exposition."""
        with urllib.request.urlopen(  # noqa: S310 - fixed local URL
            f"{self.url}/metrics", timeout=5, context=self._ssl_context()
        ) as resp:
            return str(resp.read().decode())

    def reviews(self) -> int:
        """How many admission reviews the process has answered (its /metrics counter)."""
        with urllib.request.urlopen(  # noqa: S310 - fixed local URL
            f"{self.url}/metrics", timeout=5, context=self._ssl_context()
        ) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("tmi_webhook_decisions_total{") and 'endpoint="mutate"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    # -- the process ----------------------------------------------------------------------

    def _ready(self) -> bool:
        with urllib.request.urlopen(  # noqa: S310 - fixed local URL
            f"{self.url}/readyz", timeout=5, context=self._ssl_context()
        ) as resp:
            return bool(resp.status == 200)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the process (on the same port when it ran before) and wait for /readyz."""
        if self.process is not None and self.process.running():
            raise ComponentError(f"{self.directory.name} is already running")
        if not self.tls.cert_file.exists():
            self._write_certificate()
        kubeconfig = self.plane.kubeconfig(self.identity)
        fixed = self.port != 0
        for attempt in range(_PORT_RETRIES):
            port = self.port if fixed else free_port()
            proc = ManagedProcess(
                self.directory.name,
                self.settings.argv(self.tls, port, kubeconfig),
                self.log_file,
                cwd=ROOT,
                env={**_without_tmi_variables(), **dict(self.settings.environment)},
            )
            self.process, self.port = proc, port
            try:
                wait_until(self._ready, timeout=timeout, what=f"{self.url}/readyz", proc=proc)
            except ComponentError:
                proc.stop()
                in_use = "address already in use" in proc.log_tail(80).lower()
                if attempt + 1 < _PORT_RETRIES and in_use and not fixed:
                    continue
                raise
            return

    def stop_process(self) -> None:
        if self.process is not None:
            self.process.stop()

    def restart(self, settings: WebhookSettings | None = None, **changes: Any) -> None:
        """Stop the process and start it again, with new settings or ``changes`` to them.

        The configuration stays installed, so engine Pods fail admission (failurePolicy Fail)
        while the process is down, as they would with every replica gone.
        """
        self.stop_process()
        self.settings = replace(settings or self.settings, **changes)
        self.start()

    # -- the webhook configuration ----------------------------------------------------------

    def probe(self) -> JSON:
        """A server-side dry-run create of an engine Pod: the Pod as it would be stored."""
        pod = engine_probe_pod(self.settings.namespace, self.probe_request)
        return self.plane.kube("admin").create(pod, dry_run=True)

    def _answered_by_webhook(self, require_plan: bool) -> bool:
        try:
            return is_planned(self.probe())
        except ApiError as exc:
            if require_plan:
                return False
            return any(f'admission webhook "{name}" denied' in exc.message for name in self.names)

    def install_configuration(
        self,
        rendered: JSON | None = None,
        *,
        wait: bool = True,
        require_plan: bool = True,
        timeout: float = 60.0,
    ) -> JSON:
        """Apply the owner's configuration for this process (``rendered`` by the chart for its
        URL, or rendered here); by default wait until the API server plans engine Pods with it
        (or, without ``require_plan``, until the webhook answers, a refusal included)."""
        doc = rendered or webhook_configuration(f"{self.url}/mutate", self.plane.ca_bundle)
        self.configuration = self.plane.kube("admin").apply(doc)
        if wait:
            wait_until(
                lambda: self._answered_by_webhook(require_plan),
                timeout=timeout,
                what="the MutatingWebhookConfiguration to take effect",
                proc=self.process,
            )
        return self.configuration

    def remove_configuration(self, *, wait: bool = True, timeout: float = 60.0) -> None:
        """Delete the configuration; by default wait until engine Pods are no longer sent."""
        if self.configuration is None:
            return
        kube = self.plane.kube("admin")
        kube.delete(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            self.configuration["metadata"]["name"],
        )
        self.configuration = None
        if wait:

            def unplanned() -> bool:
                # Errors (a stopped process still configured) mean "not gone yet".
                return not is_planned(self.probe())

            wait_until(
                unplanned, timeout=timeout, what="the MutatingWebhookConfiguration to be gone"
            )

    # -- teardown ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Remove the configuration and the opt-in label it added, then stop the process.

        In that order: with the configuration still in place and the process gone, every
        engine Pod in an opted-in namespace would fail admission.
        """
        try:
            self.remove_configuration()
            if self.opted_in:
                set_opt_in(self.plane, self.settings.namespace, False)
                self.opted_in = False
        finally:
            self.stop_process()

    def __enter__(self) -> LocalWebhook:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def deploy_webhook(
    plane: ControlPlane,
    settings: WebhookSettings,
    profile: Mapping[str, Any] | None = None,
    *,
    runtime_classes: Sequence[str] = ("nvidia",),
    opt_in: bool = True,
    configure: bool = True,
    require_plan: bool = True,
    probe_request: Mapping[str, Any] | None = None,
    name: str = "tmi-webhook",
) -> LocalWebhook:
    """Deploy the webhook for ``settings.namespace`` and return it planning Pods.

    Creates the namespace, applies the shipped RBAC (plus the binding for the local user),
    publishes ``profile`` (a signed ConfigMap; None leaves whatever is published), creates the
    RuntimeClasses, starts the process with a certificate from the plane's CA, waits for
    /readyz, labels the namespace opted in (``opt_in``), and installs the configuration
    (``configure``), waiting until a dry-run engine Pod comes back planned (or, without
    ``require_plan``, answered by the webhook). ``probe_request`` is that Pod's deployment
    request (default: examples/request-qwen7b-gguf.json). ``name`` names the work directory
    and log file. Use as a context manager, or call ``stop()``.
    """
    plane.create_namespace(settings.namespace)
    apply_webhook_rbac(plane, settings)
    identity = plane.service_account_identity(settings.namespace, IDENTITY)
    if profile is not None:
        publish_profile(plane, profile)
    for runtime_class in runtime_classes:
        apply_runtime_class(plane, runtime_class)
    directory = plane.workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    hook = LocalWebhook(plane, settings, directory, probe_request=probe_request, identity=identity)
    try:
        hook.start()
        if opt_in:
            set_opt_in(plane, settings.namespace, True)
            hook.opted_in = True
        if configure:
            hook.install_configuration(require_plan=require_plan)
    except BaseException:
        hook.stop()
        raise
    return hook


__all__ = [
    "DEFAULT_BUNDLE_CONFIGMAP",
    "ENGINE_LABEL",
    "OPT_IN_LABEL",
    "PLAN_ANNOTATION",
    "REQUEST_ANNOTATION",
    "LocalWebhook",
    "WebhookSettings",
    "apply_runtime_class",
    "apply_webhook_rbac",
    "chart_values_for",
    "delete_profile",
    "deploy_webhook",
    "engine_probe_pod",
    "is_planned",
    "publish_profile",
    "serial_of",
    "set_opt_in",
    "webhook_configuration",
]
