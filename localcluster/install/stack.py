"""The whole tenant-mode stack on a local control plane: webhook, extender, scheduler, controller.

The placement, verification and rollout e2e tests and `make demo` need every tmi server behind
the real API server and a real second kube-scheduler, installed the way users install them, so
that what is proven is the shipped chart rather than a test double. ``deploy_stack`` renders
charts/tmi with the test's values (``localcluster.install.install``), applies the tenant part as the
namespace's installer identity and the owner part as cluster admin, and runs each server as a
local process under the ServiceAccount the chart creates (a TokenRequest token), with the
arguments and settings of its Deployment:

* the webhook (``python -m webhook``), reached at the URL the chart's owner.webhook.url value
  names, trusted through owner.webhook.caBundle (the plane's CA);
* the extender (``python -m extender``) over HTTPS with a certificate from the plane's CA;
* the owner's second scheduler ``kamiwaza-inference-scheduler``, started by
  ``plane.start_scheduler`` with the configuration the chart installed: the one
  ``inference_policy.placing.schedconfig`` renders from the verified profile (the renderer behind
  ``tmi render-scheduler-config``) for the local extender, passed as owner.scheduler.config;
* the allocation controller (``python -m allocation_controller``), two replicas electing a leader
  through their Lease.

Every step the API server completes asynchronously (RBAC from its informer cache, a process's
caches, leadership) is waited for by polling what it changes, so a returned stack is one that
plans, places and verifies engine Pods. Each component can be stopped and started again on its
own, on the same address, which is how the e2e tests prove that a restart loses nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

import yaml

from inference_policy.placing.schedconfig import render_scheduler_config
from inference_policy.trust.dra_claims import claimed_bindings, owner_objects
from inference_policy.trust.signing import VerifiedProfile
from localcluster.install.install import (
    INSTALLER,
    Rendered,
    apply_recorded,
    grant_installer,
    remove_recorded,
    render_owner,
    render_tenant,
    wait_allowed,
)
from localcluster.install.stack_settings import StackSettings
from localcluster.plane.controlplane import HOST, ControlPlane
from localcluster.plane.kube import JSON
from localcluster.plane.metrics import Sample, metric, parse_metrics
from localcluster.plane.process import (
    free_port,
    wait_until,
)
from localcluster.servers.admission_policies import is_policy_object, policy_docs
from localcluster.servers.controller_process import (
    CONTROLLER_DEPLOYMENT,
    CONTROLLER_LEASE,
    ControllerReplica,
    LocalController,
)
from localcluster.servers.engine_pods import (
    CONDITION,
    condition,
    engine_pod,
    granted,
    step7_row,
    table,
)
from localcluster.servers.extender_process import (
    EXTENDER_DEPLOYMENT,
    LOCAL_FLAGS,
    LocalExtender,
)
from localcluster.servers.webhook import (
    CONFIGURATION_NAME,
    LocalWebhook,
    apply_runtime_class,
    publish_profile,
    set_opt_in,
)

SCHEDULER_IDENTITY = "scheduler"
FIELD_MANAGER = "tmi-localcluster-stack"
RBAC_TIMEOUT = 30.0
WEBHOOK_DEPLOYMENT = "tmi-webhook"
# Installed by their own step: the webhook configuration once the webhook answers (and removed
# first at teardown); the namespaces, which outlive a stack.
_OWNED_ELSEWHERE = ("MutatingWebhookConfiguration", "Namespace")


def _owner_applied(owner: Rendered) -> list[JSON]:
    """The owner part applied as is: the webhook configuration, the namespace and the admission
    policies are the LocalWebhook's to install and remove (localcluster.servers.webhook)."""
    return [
        d for d in owner.applied() if d["kind"] not in _OWNED_ELSEWHERE and not is_policy_object(d)
    ]


# -- the whole stack ------------------------------------------------------------------------------


@dataclass
class TenantStack:
    """A running stack; build it with ``deploy_stack`` and stop it with ``stop``."""

    plane: ControlPlane
    settings: StackSettings
    profile: JSON
    verified: VerifiedProfile
    webhook: LocalWebhook | None = None
    extender: LocalExtender | None = None
    controller: LocalController | None = None
    scheduler_config: JSON | None = None
    # The chart as installed: the tenant's part and the owner's, rendered for this stack.
    tenant: Rendered | None = None
    owner: Rendered | None = None
    scheduler_identity: str = SCHEDULER_IDENTITY
    applied: list[JSON] = field(default_factory=list)
    # Further tenant namespaces the owner part serves (owner.tenants; localcluster.install.tenants).
    further_tenants: list[JSON] = field(default_factory=list)
    _stopped: bool = False

    # -- the scheduler ----------------------------------------------------------------------------

    def render_scheduler_config(self) -> JSON:
        """The owner's KubeSchedulerConfiguration, as ``tmi render-scheduler-config`` prints it
        for this profile, the local extender's URL and the CA that signed its certificate."""
        assert self.extender is not None
        return render_scheduler_config(
            extender_url=self.extender.url,
            ca_pem=self.plane.ca.cert_pem(),
            scheduler_name=self.settings.scheduler_name,
            scheduler_namespace=self.settings.scheduler_namespace,
        )

    def start_scheduler(self) -> None:
        """Start the owner's scheduler with the configuration the chart installed (its
        ConfigMap's config.yaml) under the chart's ServiceAccount."""
        if self.owner is not None:
            installed = self.owner.get("ConfigMap", f"{self.settings.scheduler_name}-config")
            self.scheduler_config = yaml.safe_load(installed["data"]["config.yaml"])
        if self.scheduler_config is None:
            self.scheduler_config = self.render_scheduler_config()
        self.plane.start_scheduler(
            self.scheduler_config, self.settings.scheduler_name, identity=self.scheduler_identity
        )
        self.wait_scheduler_leader()

    def stop_scheduler(self) -> None:
        self.plane.stop_scheduler(self.settings.scheduler_name)

    def restart_scheduler(self) -> None:
        self.stop_scheduler()
        self.start_scheduler()

    def wait_scheduler_leader(self, timeout: float = 45.0) -> str:
        """Until the scheduler holds its Lease: before that it places nothing."""
        kube = self.plane.kube("admin")
        sched = self.plane.schedulers[self.settings.scheduler_name]
        log = sched.log_file

        def holder() -> str | None:
            lease = kube.get(
                "coordination.k8s.io/v1",
                "Lease",
                self.settings.scheduler_name,
                self.settings.scheduler_namespace,
            )
            name = lease.get("spec", {}).get("holderIdentity") or None
            # A restarted scheduler is a new identity that only its own log names; the log file
            # is shared across restarts, so only what follows the last start marker counts.
            text = log.read_text(errors="replace").rpartition("\n==== ")[2]
            return name if name and "successfully acquired lease" in text.lower() else None

        return wait_until(
            holder,
            timeout=timeout,
            what=f"scheduler {self.settings.scheduler_name} to hold its Lease",
            proc=sched.process,
        )

    # -- upgrades ----------------------------------------------------------------------------

    def values(self, settings: StackSettings | None = None) -> dict[str, Any]:
        """The values this stack's chart is installed with (for ``settings``, if given)."""
        assert self.webhook is not None and self.scheduler_config is not None
        return (settings or self.settings).chart_values(
            webhook_url=f"{self.webhook.url}/mutate",
            ca_bundle=self.plane.ca_bundle,
            scheduler_config=yaml.safe_dump(self.scheduler_config, sort_keys=False),
            tenants=self.further_tenants,
            dra=dra_values(self.verified, self.settings.namespace),
        )

    def upgrade(self, **changes: Any) -> list[str]:
        """``helm upgrade`` with ``changes`` to the settings; return the Deployments that rolled.

        Both parts are rendered again and applied (the tenant's by its installer), and each
        server whose Deployment's Pod template changed is restarted with its new arguments and
        settings, as that Deployment's rollout would replace its Pods: the controller one
        replica at a time, so a leader keeps verifying throughout.
        """
        assert self.tenant is not None and self.owner is not None
        assert self.webhook is not None and self.extender is not None
        assert self.controller is not None
        settings = replace(self.settings, **changes)
        values = self.values(settings)
        tenant = render_tenant(values, settings.namespace)
        owner = render_owner(values, settings.scheduler_namespace)
        _apply(self, tenant.applied(), identity=INSTALLER)
        _apply(self, _owner_applied(owner))
        # The admission policies are the webhook's to remove at teardown; an upgrade applies
        # them as rendered now, as `helm upgrade` would.
        self.webhook.policies = policy_docs(owner)
        _apply(self, self.webhook.policies)
        _wait_rbac(self.plane, settings)
        rolled = [
            name
            for name, (before, after) in {
                WEBHOOK_DEPLOYMENT: (self.tenant, tenant),
                CONTROLLER_DEPLOYMENT: (self.owner, owner),
                EXTENDER_DEPLOYMENT: (self.owner, owner),
            }.items()
            if _pod_template(before, name) != _pod_template(after, name)
        ]
        self.settings, self.tenant, self.owner = settings, tenant, owner
        if WEBHOOK_DEPLOYMENT in rolled:
            self.webhook.restart(
                replace(
                    self.webhook.settings,
                    shipped_args=tuple(tenant.args(WEBHOOK_DEPLOYMENT, replace=LOCAL_FLAGS)),
                    environment=tuple(
                        tenant.environment(WEBHOOK_DEPLOYMENT, self.webhook.directory.name).items()
                    ),
                )
            )
        if EXTENDER_DEPLOYMENT in rolled:
            self.extender.install = owner
            self.extender.restart()
        if CONTROLLER_DEPLOYMENT in rolled:
            self.controller.set_install(owner)
            for index in range(len(self.controller.replicas)):
                self.controller.restart(index)
        return rolled

    # -- teardown ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every process, then remove the configuration and RBAC the stack added.

        The webhook goes last among the processes but removes its configuration first (see
        ``LocalWebhook.stop``), so no Pod in the namespace is left failing admission.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.controller is not None:
                self.controller.stop()
            self.stop_scheduler()
            if self.extender is not None:
                self.extender.stop()
            if self.webhook is not None:
                self.webhook.stop()
        finally:
            remove_recorded(self.plane, self.applied)

    def __enter__(self) -> TenantStack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _apply(stack: TenantStack, docs: Sequence[JSON], identity: str = "admin") -> None:
    apply_recorded(stack.plane, stack.applied, docs, identity, FIELD_MANAGER)


def _pod_template(part: Rendered, deployment: str) -> JSON:
    return dict(part.get("Deployment", deployment)["spec"]["template"])


def _user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def deploy_stack(
    plane: ControlPlane,
    settings: StackSettings,
    profile: Mapping[str, Any],
    *,
    webhook_name: str = "tmi-webhook",
) -> TenantStack:
    """Install the chart for ``settings.namespace`` and bring every server up; return it working.

    ``profile`` is the signed ConfigMap, published under ``settings.bundle_configmap``. The
    profile is verified here first, exactly as the servers will, because the scheduler's
    configuration is rendered from it (``tmi render-scheduler-config``) and installed through
    the chart's owner.scheduler.config value. The tenant part is applied by ``tmi-installer``,
    the namespace's installer identity; the owner part by the cluster admin. Use as a context
    manager, or call ``stop()``.
    """
    configmap = copy.deepcopy(dict(profile))
    configmap["metadata"]["name"] = settings.bundle_configmap
    verified = settings.verify(configmap)
    stack = TenantStack(plane, settings, configmap, verified)
    ns, owner_ns = settings.namespace, settings.scheduler_namespace
    try:
        plane.create_namespace(ns)
        plane.create_namespace(owner_ns)
        grant_installer(plane, ns)
        # The owner part names the webhook's and the extender's addresses: choose them first.
        stack.extender = LocalExtender(plane, port=free_port())
        webhook_port = free_port()
        stack.scheduler_config = stack.render_scheduler_config()
        values = settings.chart_values(
            webhook_url=f"https://{HOST}:{webhook_port}/mutate",
            ca_bundle=plane.ca_bundle,
            scheduler_config=yaml.safe_dump(stack.scheduler_config, sort_keys=False),
            dra=dra_values(verified, ns),
        )
        stack.tenant = render_tenant(values, ns)
        stack.owner = render_owner(values, owner_ns)
        _apply(stack, stack.tenant.applied(), identity=INSTALLER)
        _apply(stack, _owner_applied(stack.owner))
        # The owner publishes the signed profile (seed step 5) and the RuntimeClasses.
        publish_profile(plane, configmap)
        for runtime_class in settings.runtime_classes:
            apply_runtime_class(plane, runtime_class)

        webhook_sa = plane.service_account_identity(ns, WEBHOOK_DEPLOYMENT)
        stack.extender.identity = plane.service_account_identity(owner_ns, EXTENDER_DEPLOYMENT)
        stack.extender.install = stack.owner
        # The allocation controller is the owner's, in the owner's namespace with its Lease.
        stack.controller = LocalController(
            plane,
            settings.namespace,
            settings.controller_replicas,
            install=stack.owner,
            identity=plane.service_account_identity(owner_ns, CONTROLLER_DEPLOYMENT),
            lease_namespace=owner_ns,
        )
        stack.scheduler_identity = plane.service_account_identity(owner_ns, settings.scheduler_name)
        _wait_rbac(plane, settings)

        webhook_settings = replace(
            settings.webhook_settings(),
            shipped_args=tuple(stack.tenant.args(WEBHOOK_DEPLOYMENT, replace=LOCAL_FLAGS)),
            environment=tuple(stack.tenant.environment(WEBHOOK_DEPLOYMENT, webhook_name).items()),
        )
        directory = plane.workdir / webhook_name
        directory.mkdir(parents=True, exist_ok=True)
        stack.webhook = LocalWebhook(
            plane, webhook_settings, directory, port=webhook_port, identity=webhook_sa
        )
        stack.webhook.start()
        set_opt_in(plane, ns, True)
        stack.webhook.opted_in = True
        stack.webhook.install_configuration(
            stack.owner.get("MutatingWebhookConfiguration", CONFIGURATION_NAME),
            policies=policy_docs(stack.owner),
        )
        # The Python servers start in parallel (their imports dominate on a small machine); the
        # scheduler waits for the extender, since its first calls would fail otherwise.
        stack.extender.spawn()
        stack.controller.spawn()
        stack.extender.wait_ready()
        stack.start_scheduler()
        stack.controller.wait_ready()
        stack.controller.wait_leader()
    except BaseException:
        stack.stop()
        raise
    return stack


def dra_values(verified: VerifiedProfile, namespace: str) -> dict[str, Any]:
    """The owner's `tmi render-dra` for a profile with dra bindings (the chart's owner.dra)."""
    if not claimed_bindings(verified.envelope):
        return {}
    return {namespace: owner_objects(verified.envelope)}


def _wait_rbac(plane: ControlPlane, settings: StackSettings) -> None:
    """Until the authorizer grants each ServiceAccount what it needs first."""
    ns, owner_ns = settings.namespace, settings.scheduler_namespace
    wait_allowed(
        plane,
        _user(ns, WEBHOOK_DEPLOYMENT),
        [
            {
                "resource": "configmaps",
                "verb": "watch",
                "namespace": ns,
                "name": settings.bundle_configmap,
            }
        ],
    )
    wait_allowed(
        plane,
        _user(owner_ns, EXTENDER_DEPLOYMENT),
        [
            {"resource": "nodes", "verb": "watch"},
            {"resource": "pods", "verb": "watch", "namespace": ns},
            {
                "resource": "configmaps",
                "verb": "watch",
                "namespace": ns,
                "name": settings.bundle_configmap,
            },
        ],
    )
    wait_allowed(
        plane,
        _user(owner_ns, CONTROLLER_DEPLOYMENT),
        [
            {"resource": "pods", "verb": "watch", "namespace": ns},
            {"resource": "pods", "subresource": "status", "verb": "patch", "namespace": ns},
            {"resource": "configmaps", "verb": "watch", "namespace": ns},
            {
                "group": "coordination.k8s.io",
                "resource": "leases",
                "verb": "update",
                "namespace": owner_ns,
                "name": CONTROLLER_LEASE,
            },
        ],
    )
    wait_allowed(
        plane,
        _user(owner_ns, settings.scheduler_name),
        [
            {"resource": "pods", "subresource": "binding", "verb": "create", "namespace": ns},
            {
                "group": "coordination.k8s.io",
                "resource": "leases",
                "verb": "update",
                "namespace": owner_ns,
                "name": settings.scheduler_name,
            },
        ],
    )


__all__ = [
    "CONDITION",
    "CONTROLLER_DEPLOYMENT",
    "CONTROLLER_LEASE",
    "EXTENDER_DEPLOYMENT",
    "WEBHOOK_DEPLOYMENT",
    "ControllerReplica",
    "LocalController",
    "LocalExtender",
    "Sample",
    "StackSettings",
    "TenantStack",
    "condition",
    "deploy_stack",
    "engine_pod",
    "granted",
    "metric",
    "parse_metrics",
    "step7_row",
    "table",
]
