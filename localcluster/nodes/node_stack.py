"""The chart installed as a user installs it, its Deployments running as Pods on the real node.

``localcluster.install.stack`` plays the chart's Deployments with local processes, which a test can
kill or pause at a precise moment. Here nothing is played: the tenant part (the webhook's
Deployment, Service, ServiceAccount, Role) is applied by the namespace's installer, the owner
part (extender, allocation controller, the second kube-scheduler, the admission policies and
the MutatingWebhookConfiguration) by a cluster administrator, and the kubelet runs every
Deployment from the images the node imported (``localcluster.nodes.node_images``), with the chart's
probes, security context and certificates. The API server calls the webhook through its Service
(at the Service's endpoints, ``--enable-aggregator-routing``), and the scheduler Pod calls the
extender through the extender Service's ClusterIP, which kube-proxy routes: there is no cluster
DNS, so the scheduler's configuration names the address and checks the extender's certificate
against the Service's name (``tmi render-scheduler-config --extender-server-name``).

The owner installs twice, as an owner without cluster DNS would: once without the scheduler, to
learn the extender Service's address, then with the configuration rendered for it.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import yaml

from inference_policy.trust.signing import VerifiedProfile
from localcluster.install.install import (
    INSTALLER,
    Rendered,
    apply_recorded,
    grant_installer,
    remove_recorded,
    render_owner,
    render_tenant,
)
from localcluster.install.stack_settings import StackSettings
from localcluster.nodes.node_images import SCHEDULER_REPOSITORY, TMI_REPOSITORY, NodeImage
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import JSON, ApiError
from localcluster.plane.process import wait_until
from localcluster.servers.admission_policies import (
    install_policies,
    is_policy_object,
    policy_docs,
    remove_policies,
)
from localcluster.servers.webhook_objects import (
    apply_runtime_class,
    engine_probe_pod,
    is_planned,
    publish_profile,
    set_opt_in,
)

WEBHOOK = "tmi-webhook"
EXTENDER = "tmi-extender"
CONTROLLER = "tmi-allocation-controller"
AVAILABLE_TIMEOUT = 180.0


def _tls_secret(name: str, namespace: str, cert: bytes, key: bytes, ca: bytes) -> JSON:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(cert), "tls.key": b64(key), "ca.crt": b64(ca)},
    }


@dataclass
class ChartStack:
    """The chart installed on the real node; build it with ``deploy_chart``."""

    plane: ControlPlane
    settings: StackSettings
    verified: VerifiedProfile
    tenant: Rendered | None = None
    owner: Rendered | None = None
    scheduler_config: JSON | None = None
    # The values both parts were installed with (what a scrape of its PodMonitors renders from).
    values: JSON | None = None
    applied: list[JSON] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    def deployments(self) -> list[tuple[str, str]]:
        """(namespace, name) of every Deployment the chart runs."""
        return [
            (d["metadata"].get("namespace") or part.namespace, d["metadata"]["name"])
            for part in (self.tenant, self.owner)
            if part is not None
            for d in part.docs
            if d["kind"] == "Deployment"
        ]

    def pods(self, namespace: str, deployment: str) -> list[JSON]:
        """The Deployment's Pods, by its selector."""
        dep = self.plane.kube("admin").get("apps/v1", "Deployment", deployment, namespace)
        labels = dep["spec"]["selector"]["matchLabels"]
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        listed = self.plane.kube("admin").request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
        )
        return list(listed.get("items") or [])

    def wait_available(self, timeout: float = AVAILABLE_TIMEOUT) -> None:
        """Until every Deployment has all its replicas updated and available."""
        kube = self.plane.kube("admin")

        def available(namespace: str, name: str) -> bool:
            dep = kube.get("apps/v1", "Deployment", name, namespace)
            status, wanted = dep.get("status") or {}, dep["spec"].get("replicas", 1)
            return (
                status.get("observedGeneration", 0) >= dep["metadata"]["generation"]
                and status.get("updatedReplicas") == wanted
                and status.get("availableReplicas") == wanted
                and not status.get("unavailableReplicas")
            )

        for namespace, name in self.deployments():
            wait_until(
                lambda n=namespace, d=name: available(n, d),  # type: ignore[misc]
                timeout=timeout,
                what=f"Deployment {namespace}/{name} available on the real node",
            )

    def wait_planning(self, timeout: float = 60.0) -> None:
        """Until the API server plans an engine Pod through the webhook's Service."""

        def planned() -> bool:
            try:
                pod = engine_probe_pod(self.namespace)
                return is_planned(self.plane.kube("admin").create(pod, dry_run=True))
            except ApiError:
                return False

        wait_until(planned, timeout=timeout, what="engine Pods planned by the webhook's Pods")

    def stop(self) -> None:
        """Withdraw the opt-in, then delete what was applied (the configuration first)."""
        set_opt_in(self.plane, self.namespace, False)
        if self.owner is not None:
            remove_policies(self.plane, policy_docs(self.owner))
        remove_recorded(self.plane, self.applied)

    def __enter__(self) -> ChartStack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _values(stack: ChartStack, tmi: NodeImage, scheduler: NodeImage, config: str | None) -> JSON:
    values = stack.settings.chart_values(ca_bundle=stack.plane.ca_bundle, scheduler_config=config)
    values["image"] = {
        "repository": TMI_REPOSITORY,
        "digest": tmi.digest,
        "pullPolicy": "IfNotPresent",
    }
    values["owner"]["scheduler"]["image"] = f"{SCHEDULER_REPOSITORY}@{scheduler.digest}"
    return values


def _apply(stack: ChartStack, docs: Sequence[JSON], identity: str = "admin") -> None:
    apply_recorded(stack.plane, stack.applied, docs, identity)


def _owner_docs(owner: Rendered) -> list[JSON]:
    return [d for d in owner.installed() if d["kind"] != "Namespace" and not is_policy_object(d)]


def deploy_chart(
    plane: ControlPlane,
    settings: StackSettings,
    profile: Mapping[str, Any],
    *,
    tmi: NodeImage,
    scheduler: NodeImage,
) -> ChartStack:
    """Install both parts of the chart for ``settings.namespace`` and wait until every
    Deployment is available (on the real node, the plane's only one that runs containers) and
    engine Pods are planned. Use as a context manager."""
    configmap = copy.deepcopy(dict(profile))
    configmap["metadata"]["name"] = settings.bundle_configmap
    stack = ChartStack(plane, settings, settings.verify(configmap))
    ns, owner_ns = settings.namespace, settings.scheduler_namespace
    try:
        plane.create_namespace(ns)
        plane.create_namespace(owner_ns)
        grant_installer(plane, ns)
        ca = plane.ca.cert_pem()
        # Without cert-manager the tenant makes the webhook's Secret, the owner the extender's.
        for name, namespace, identity in ((WEBHOOK, ns, INSTALLER), (EXTENDER, owner_ns, "admin")):
            hosts = (f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local", name)
            pair = plane.ca.issue_serving(f"{name}-{namespace}", hosts)
            secret = _tls_secret(
                f"{name}-tls",
                namespace,
                pair.cert_file.read_bytes(),
                pair.key_file.read_bytes(),
                ca,
            )
            _apply(stack, [secret], identity)

        # The owner's first install: everything but the scheduler, whose configuration needs
        # the extender Service's address (there is no cluster DNS here). The second install
        # names it, and the chart renders the configuration itself, trusting the ca.crt of the
        # extender's Secret as the scheduler's container mounts it.
        stack.owner = render_owner(_values(stack, tmi, scheduler, None), owner_ns)
        install_policies(plane, policy_docs(stack.owner), ns, wait=False)
        _apply(stack, _owner_docs(stack.owner))
        service = plane.kube("admin").get("v1", "Service", EXTENDER, owner_ns)
        values = _values(stack, tmi, scheduler, "")
        values["owner"]["scheduler"].update(
            {
                "extenderURL": f"https://{service['spec']['clusterIP']}:443",
                "extenderServerName": f"{EXTENDER}.{owner_ns}.svc",
            }
        )
        stack.owner = render_owner(values, owner_ns)
        stack.values = values
        installed = stack.owner.get("ConfigMap", f"{settings.scheduler_name}-config")
        stack.scheduler_config = yaml.safe_load(installed["data"]["config.yaml"])
        _apply(stack, _owner_docs(stack.owner))

        stack.tenant = render_tenant(values, ns)
        _apply(stack, stack.tenant.installed(), INSTALLER)
        publish_profile(plane, configmap)
        for runtime_class in settings.runtime_classes:
            apply_runtime_class(plane, runtime_class)
        set_opt_in(plane, ns, True)
        stack.wait_available()
        stack.wait_planning()
    except BaseException:
        stack.stop()
        raise
    return stack


__all__ = ["CONTROLLER", "EXTENDER", "WEBHOOK", "ChartStack", "deploy_chart"]
