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
  condition and policy stays as rendered. The owner's admission policies
  (``localcluster.servers.admission_policies``) are installed and removed with it.

Every step that the API server completes asynchronously (RBAC from its informer cache, a new
webhook configuration, a deleted one) is waited for by polling what it changes, so a
returned ``deploy_webhook`` is a webhook that is already planning Pods.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from localcluster.plane.components import HOST
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import JSON, ApiError
from localcluster.plane.metrics import metric
from localcluster.plane.pki import KeyPair
from localcluster.plane.process import ComponentError, wait_until
from localcluster.servers.admission_policies import (
    install_policies,
    remove_policies,
    render_policies,
)
from localcluster.servers.server import START_TIMEOUT, LocalServer, blank_tmi
from localcluster.servers.webhook_objects import (
    CONFIGURATION_NAME,
    DEFAULT_BUNDLE_CONFIGMAP,
    ENGINE_LABEL,
    IDENTITY,
    OPT_IN_LABEL,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
    WebhookSettings,
    apply_runtime_class,
    apply_webhook_rbac,
    chart_values_for,
    delete_profile,
    engine_probe_pod,
    is_planned,
    publish_profile,
    serial_of,
    set_opt_in,
    webhook_configuration,
)


@dataclass
class LocalWebhook(LocalServer):
    """A running webhook process and, once installed, its webhook configuration."""

    settings: WebhookSettings
    directory: Path
    configuration: JSON | None = None
    # The owner's admission policy objects installed with the configuration.
    policies: list[JSON] = field(default_factory=list)
    probe_request: Mapping[str, Any] | None = None
    opted_in: bool = False
    # The ServiceAccount identity (``ControlPlane.service_account_identity``) it runs as.
    identity: str = IDENTITY
    _issued: int = field(default=0, repr=False)

    @property
    def process_name(self) -> str:
        return self.directory.name

    def argv(self) -> list[str]:
        return self.settings.argv(self.tls, self.port, self.plane.kubeconfig(self.identity))

    def environment(self) -> dict[str, str] | None:
        return {**blank_tmi(), **dict(self.settings.environment)}

    # -- addresses and certificates -------------------------------------------------------

    @property
    def tls(self) -> KeyPair:
        """The files the process serves from; ``rotate_certificate`` replaces them in place."""
        return KeyPair(self.directory / "tls.crt", self.directory / "tls.key")

    @property
    def names(self) -> list[str]:
        """The webhook entries' names, as the API server quotes them in a denial."""
        source = self.configuration or webhook_configuration(
            self.url, "", namespace=self.settings.namespace
        )
        return [str(w["name"]) for w in source["webhooks"]]

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
            ssl.create_default_context(cafile=str(self.plane.ca_file)).wrap_socket(
                sock, server_hostname=HOST
            ) as tls,
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

    def reviews(self) -> int:
        """How many admission reviews the process has answered (its /metrics counter)."""
        return int(metric(self.metrics(), "tmi_webhook_decisions_total", endpoint="mutate"))

    # -- the process ----------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the process (on the same port when it ran before) and wait for /readyz."""
        if not self.tls.cert_file.exists():
            self._write_certificate()
        super().start(timeout)

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
        policies: Sequence[JSON] | None = None,
        wait: bool = True,
        require_plan: bool = True,
        timeout: float = 60.0,
    ) -> JSON:
        """Apply the owner's admission for this process: its admission policies (``policies``
        as the chart rendered them, or rendered here for the settings' namespace and
        scheduler), then the webhook configuration (``rendered`` by the chart for its URL, or
        rendered here). By default wait until the policies act (in an opted-in namespace) and
        the API server plans engine Pods with the webhook (or, without ``require_plan``, until
        the webhook answers, a refusal included)."""
        docs = (
            list(policies)
            if policies is not None
            else render_policies(self.settings.namespace, self.settings.scheduler_name)
        )
        install_policies(
            self.plane, docs, self.settings.namespace, wait=wait and self.opted_in, timeout=timeout
        )
        self.policies = docs
        doc = rendered or webhook_configuration(
            f"{self.url}/mutate", self.plane.ca_bundle, namespace=self.settings.namespace
        )
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
        """Delete the configuration and the policies; by default wait until engine Pods are no
        longer sent and the policies no longer act."""
        # A further tenant's policy objects are its parameters only (the policies are bound
        # once for every tenant): without them its opted-in namespace refuses every Pod, the
        # probe below included, so they go after the configuration.
        if any(d["kind"].endswith("AdmissionPolicy") for d in self.policies):
            acting_in = self.settings.namespace if wait and self.opted_in else None
            remove_policies(self.plane, self.policies, acting_in, timeout=timeout)
            self.policies = []
        try:
            self._remove_webhook_configuration(wait=wait, timeout=timeout)
        finally:
            if self.policies:
                remove_policies(self.plane, self.policies)
                self.policies = []

    def _remove_webhook_configuration(self, *, wait: bool, timeout: float) -> None:
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
                # Errors (a stopped process still configured) mean "not gone yet", but for the
                # owner's guard refusing the unplanned probe after the webhook was not called:
                # where the policies, bound once, stay for the other tenants.
                try:
                    return not is_planned(self.probe())
                except ApiError as exc:
                    return "ValidatingAdmissionPolicy 'kamiwaza-tmi-guard'" in exc.message

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
    hook = LocalWebhook(
        plane,
        settings=settings,
        directory=directory,
        probe_request=probe_request,
        identity=identity,
    )
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
    "CONFIGURATION_NAME",
    "DEFAULT_BUNDLE_CONFIGMAP",
    "ENGINE_LABEL",
    "IDENTITY",
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
