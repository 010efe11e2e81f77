"""The whole tenant-mode stack on a local control plane: webhook, extender, scheduler, controller.

The placement, verification and rollout e2e tests and `make demo` need every tmi server behind
the real API server and a real second kube-scheduler, installed the way users install them, so
that what is proven is the shipped chart rather than a test double. ``deploy_stack`` renders
charts/tmi with the test's values (``localcluster.install``), applies the tenant part as the
namespace's installer identity and the owner part as cluster admin, and runs each server as a
local process under the ServiceAccount the chart creates (a TokenRequest token), with the
arguments and settings of its Deployment:

* the webhook (``python -m webhook``), reached at the URL the chart's owner.webhook.url value
  names, trusted through owner.webhook.caBundle (the plane's CA);
* the extender (``python -m extender``) over HTTPS with a certificate from the plane's CA;
* the owner's second scheduler ``kamiwaza-inference-scheduler``, started by
  ``plane.start_scheduler`` with the configuration the chart installed: the one
  ``inference_policy.schedconfig`` renders from the verified profile (the renderer behind
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
import json
import os
import ssl
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from inference_policy.access import is_accelerator_resource
from inference_policy.schedconfig import (
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SCHEDULER_NAMESPACE,
    render_scheduler_config,
)
from inference_policy.signing import TrustedKeys, VerifiedProfile, VerifyPolicy, verify_configmap
from localcluster.controlplane import HOST, ControlPlane
from localcluster.install import (
    INSTALLER,
    Rendered,
    chart_values,
    grant_installer,
    render_owner,
    render_tenant,
    wait_allowed,
)
from localcluster.kube import JSON, ApiError
from localcluster.process import (
    ComponentError,
    ManagedProcess,
    free_port,
    python_module,
    wait_until,
)
from localcluster.webhook import (
    CONFIGURATION_NAME,
    DEFAULT_BUNDLE_CONFIGMAP,
    ENGINE_LABEL,
    REQUEST_ANNOTATION,
    LocalWebhook,
    WebhookSettings,
    apply_runtime_class,
    publish_profile,
    set_opt_in,
)

ROOT = Path(__file__).resolve().parent.parent
# The tenant namespace and profile ConfigMap name the shipped manifests are written for.
SHIPPED_NAMESPACE = "kamiwaza"
SHIPPED_BUNDLE_CONFIGMAP = DEFAULT_BUNDLE_CONFIGMAP
EXTENDER_IDENTITY = "tmi-extender"
CONTROLLER_IDENTITY = "tmi-controller"
SCHEDULER_IDENTITY = "scheduler"
CONTROLLER_LEASE = "tmi-allocation-controller"
CONDITION = "kamiwaza.ai/AllocationVerified"
FIELD_MANAGER = "tmi-localcluster-stack"
START_TIMEOUT = 60.0
RBAC_TIMEOUT = 30.0
_PORT_RETRIES = 3
WEBHOOK_DEPLOYMENT = "tmi-webhook"
EXTENDER_DEPLOYMENT = "tmi-extender"
CONTROLLER_DEPLOYMENT = "tmi-allocation-controller"
# What the harness sets itself in place of a Pod's: where to listen and with which certificate.
# The metrics and plan ports are dropped too: local processes share one host, and the harness
# reads each server's /metrics and /v1/plan on its serving port (tests/integration/test_serving.py
# covers the split).
_LOCAL_FLAGS = ("--cert", "--key", "--port", "--host", "--metrics-port", "--plan-port")
# Installed by their own step: the webhook configuration once the webhook answers (and removed
# first at teardown); the namespaces, which outlive a stack.
_OWNED_ELSEWHERE = ("MutatingWebhookConfiguration", "Namespace")


def _blank_tmi() -> dict[str, str]:
    # A server reads an empty TMI_* variable as unset: blank whatever the calling shell
    # exports, so only the chart's settings are in force.
    return {name: "" for name in os.environ if name.startswith("TMI_")}


@dataclass(frozen=True)
class StackSettings:
    """What the owner configures once for every server: trust, binding id, names, timings."""

    owner_public_keys: tuple[str, ...]
    cluster_binding_id: str
    namespace: str = SHIPPED_NAMESPACE
    bundle_configmap: str = SHIPPED_BUNDLE_CONFIGMAP
    # The chart's core.inferenceResources.followRevisions: follow the newest signed revision.
    follow_revisions: bool = False
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    scheduler_namespace: str = DEFAULT_SCHEDULER_NAMESPACE
    scheduling_timeout_seconds: float = 300.0
    controller_replicas: int = 2
    # The shipped defaults (15/10/2 s, 4 s per API call): a clean shutdown releases the Lease,
    # so a stopped leader is replaced within one retry period anyway.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    runtime_classes: tuple[str, ...] = ("nvidia",)
    log_level: str = "INFO"

    def chart_values(self, **extra: Any) -> dict[str, Any]:
        """The values file an owner and a tenant would install the chart with."""
        return chart_values(
            owner_public_keys=self.owner_public_keys,
            cluster_binding_id=self.cluster_binding_id,
            bundle_configmap=self.bundle_configmap,
            scheduler_name=self.scheduler_name,
            tenant_namespace=self.namespace,
            scheduling_timeout_seconds=self.scheduling_timeout_seconds,
            log_level=self.log_level,
            follow_revisions=self.follow_revisions,
            **extra,
        )

    def webhook_settings(self) -> WebhookSettings:
        return WebhookSettings(
            owner_public_keys=self.owner_public_keys,
            cluster_binding_id=self.cluster_binding_id,
            namespace=self.namespace,
            bundle_configmap=self.bundle_configmap,
            scheduler_name=self.scheduler_name,
        )

    def verify(self, configmap: Mapping[str, Any], now: datetime | None = None) -> VerifiedProfile:
        """The profile as every server will verify it (raises ProfileRefused otherwise)."""
        policy = VerifyPolicy(
            trusted=TrustedKeys.from_base64(self.owner_public_keys),
            cluster_binding_id=self.cluster_binding_id,
            namespace=self.namespace,
            configmap_name=self.bundle_configmap,
        )
        return verify_configmap(dict(configmap), policy, now or datetime.now(UTC))


# -- metrics --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Prometheus text exposition as samples (label values without escapes, as ours are)."""
    samples: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: dict[str, str] = {}
        for pair in rest.rstrip("}").split('",') if rest else ():
            key, _, raw = pair.partition("=")
            labels[key.strip()] = raw.strip().strip('"')
        samples.append(Sample(name, labels, float(value)))
    return samples


def metric(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _get(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 - fixed local URL
        return str(resp.read().decode())


def _ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 - fixed local URL
        return bool(resp.status == 200)


# -- the extender ---------------------------------------------------------------------------------


@dataclass
class LocalExtender:
    """The extender process; it keeps its port across restarts, since the scheduler's
    configuration names it."""

    plane: ControlPlane
    settings: StackSettings
    name: str = "tmi-extender"
    port: int = 0
    process: ManagedProcess | None = None
    # The owner's rendered part and the ServiceAccount identity: with them the process runs
    # with the Deployment's arguments and settings; without, from ``settings`` as flags.
    install: Rendered | None = None
    identity: str = EXTENDER_IDENTITY
    _cert: Path | None = None
    _key: Path | None = None

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.plane.logs_dir / f"{self.name}.log"

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.plane.ca_file))

    def argv(self) -> list[str]:
        if self._cert is None or self._key is None:
            pair = self.plane.issue_serving_cert(self.name, (HOST,))
            self._cert, self._key = pair.cert_file, pair.key_file
        s = self.settings
        local = [
            f"--cert={self._cert}",
            f"--key={self._key}",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--kubeconfig={self.plane.kubeconfig(self.identity)}",
            # Teardown, not a rolling update: nobody needs the drain.
            "--drain-seconds=0",
            "--shutdown-timeout=2",
        ]
        if self.install is not None:
            shipped = self.install.args(EXTENDER_DEPLOYMENT, replace=_LOCAL_FLAGS)
            return [*python_module("extender"), *shipped, *local]
        return [
            *python_module("extender"),
            *local[:5],
            f"--namespace={s.namespace}",
            f"--pod-namespaces={s.namespace}",
            f"--bundle-configmap={s.bundle_configmap}",
            f"--owner-public-key={','.join(s.owner_public_keys)}",
            f"--cluster-binding-id={s.cluster_binding_id}",
            # Teardown, not a rolling update: nobody needs the drain.
            "--drain-seconds=0",
            "--shutdown-timeout=2",
            f"--log-level={s.log_level}",
        ]

    def spawn(self) -> None:
        if self.process is not None and self.process.running():
            raise ComponentError(f"{self.name} is already running")
        if self.port == 0:
            self.port = free_port()
        self.process = ManagedProcess(
            self.name, self.argv(), self.log_file, cwd=ROOT, env=self._environment()
        )

    def _environment(self) -> dict[str, str]:
        if self.install is None:
            return {}
        return {**_blank_tmi(), **self.install.environment(EXTENDER_DEPLOYMENT, self.name)}

    def ready(self) -> bool:
        return _ok(f"{self.url}/readyz", self._context())

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until /readyz answers: nodes, engine Pods and the profile have all been read."""
        wait_until(self.ready, timeout=timeout, what=f"{self.url}/readyz", proc=self.process)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        fixed = self.port != 0
        for attempt in range(_PORT_RETRIES):
            self.spawn()
            try:
                self.wait_ready(timeout)
            except ComponentError:
                assert self.process is not None
                self.process.stop()
                in_use = "address already in use" in self.process.log_tail(80).lower()
                if attempt + 1 < _PORT_RETRIES and in_use and not fixed:
                    self.port = 0
                    continue
                raise
            return

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def metrics_text(self) -> str:
        return _get(f"{self.url}/metrics", self._context())

    def metrics(self) -> list[Sample]:
        return parse_metrics(self.metrics_text())

    def wait_nodes(self, names: Iterable[str], timeout: float = 30.0) -> None:
        """Until the extender's node cache holds every node the API lists and ``names`` exist.

        Its cache follows a watch; a Pod filtered against a node the cache has not seen yet is
        only retried later, so tests that have just created nodes wait here first.
        """
        wanted = set(names)
        kube = self.plane.kube("admin")

        def synced() -> bool:
            listed = {n["metadata"]["name"] for n in kube.request("GET", "/api/v1/nodes")["items"]}
            if not wanted <= listed:
                return False
            return metric(self.metrics(), "tmi_extender_nodes") == len(listed)

        wait_until(synced, timeout=timeout, what=f"the extender to see nodes {sorted(wanted)}")


# -- the controller -------------------------------------------------------------------------------


@dataclass
class ControllerReplica:
    """One controller process; like a Deployment's Pod, it keeps its identity across restarts."""

    identity: str
    port: int = 0
    process: ManagedProcess | None = None
    # Extra environment for its next start (the fault tests' injection points).
    env: dict[str, str] = field(default_factory=dict)

    def running(self) -> bool:
        return self.process is not None and self.process.running()


@dataclass
class LocalController:
    """The controller's replicas and the Lease through which they elect the one that writes."""

    plane: ControlPlane
    settings: StackSettings
    replicas: list[ControllerReplica] = field(default_factory=list)
    # The tenant's rendered part and the ServiceAccount identity, as for the extender.
    install: Rendered | None = None
    identity: str = CONTROLLER_IDENTITY

    def __post_init__(self) -> None:
        if not self.replicas:
            self.replicas = [
                ControllerReplica(f"{CONTROLLER_LEASE}-{i}")
                for i in range(self.settings.controller_replicas)
            ]

    def log_file(self, replica: ControllerReplica) -> Path:
        return self.plane.logs_dir / f"{replica.identity}.log"

    def argv(self, replica: ControllerReplica) -> list[str]:
        s = self.settings
        if self.install is not None:
            shipped = self.install.args(CONTROLLER_DEPLOYMENT, replace=_LOCAL_FLAGS)
            # The replica's identity is its Pod name (POD_NAME), as in the Deployment.
            return [
                *python_module("allocation_controller"),
                *shipped,
                f"--kubeconfig={self.plane.kubeconfig(self.identity)}",
                f"--host={HOST}",
                f"--port={replica.port}",
            ]
        return [
            *python_module("allocation_controller"),
            f"--namespace={s.namespace}",
            f"--kubeconfig={self.plane.kubeconfig(self.identity)}",
            f"--owner-public-key={','.join(s.owner_public_keys)}",
            f"--cluster-binding-id={s.cluster_binding_id}",
            f"--scheduling-timeout-seconds={s.scheduling_timeout_seconds:g}",
            f"--lease-name={CONTROLLER_LEASE}",
            f"--identity={replica.identity}",
            f"--lease-duration={s.lease_duration:g}",
            f"--renew-deadline={s.renew_deadline:g}",
            f"--retry-period={s.retry_period:g}",
            f"--host={HOST}",
            f"--port={replica.port}",
            f"--log-level={s.log_level}",
        ]

    def _pick(self, index: int | None) -> list[ControllerReplica]:
        return list(self.replicas) if index is None else [self.replicas[index]]

    def spawn(self, index: int | None = None) -> None:
        for replica in self._pick(index):
            if replica.running():
                raise ComponentError(f"{replica.identity} is already running")
            if replica.port == 0:
                replica.port = free_port()
            env = (
                {}
                if self.install is None
                else {
                    **_blank_tmi(),
                    **self.install.environment(CONTROLLER_DEPLOYMENT, replica.identity),
                }
            )
            replica.process = ManagedProcess(
                replica.identity,
                self.argv(replica),
                self.log_file(replica),
                cwd=ROOT,
                # The fault tests add their injection point on top of the chart's settings.
                env={**env, **replica.env} or None,
            )

    def wait_ready(self, index: int | None = None, timeout: float = START_TIMEOUT) -> None:
        """Until each replica's caches have synced (its /readyz; leadership is separate)."""
        for replica in self._pick(index):
            wait_until(
                lambda r=replica: _ok(f"http://{HOST}:{r.port}/readyz"),  # type: ignore[misc]
                timeout=timeout,
                what=f"{replica.identity} /readyz",
                proc=replica.process,
            )

    def start(self, index: int | None = None, *, wait_leader: bool = True) -> None:
        """Start one replica (or all) and wait until it is ready and some replica leads."""
        self.spawn(index)
        self.wait_ready(index)
        if wait_leader:
            self.wait_leader()

    def stop(self, index: int | None = None) -> None:
        for replica in self._pick(index):
            if replica.process is not None:
                replica.process.stop()

    def restart(self, index: int | None = None) -> None:
        self.stop(index)
        self.start(index)

    def lease(self) -> JSON | None:
        try:
            return self.plane.kube("admin").get(
                "coordination.k8s.io/v1", "Lease", CONTROLLER_LEASE, self.settings.namespace
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def leader(self) -> str | None:
        """The identity holding the Lease, if a running replica holds it."""
        lease = self.lease()
        holder = (lease or {}).get("spec", {}).get("holderIdentity") or None
        running = {r.identity for r in self.replicas if r.running()}
        return holder if holder in running else None

    def leader_index(self) -> int:
        holder = self.wait_leader()
        return next(i for i, r in enumerate(self.replicas) if r.identity == holder)

    def metrics_text(self, index: int) -> str:
        return _get(f"http://{HOST}:{self.replicas[index].port}/metrics")

    def is_leader(self, index: int) -> bool:
        """What the replica itself reports (its tmi_allocation_is_leader gauge)."""
        replica = self.replicas[index]
        text = _get(f"http://{HOST}:{replica.port}/metrics")
        return metric(parse_metrics(text), "tmi_allocation_is_leader") == 1.0

    def wait_leader(self, timeout: float = 45.0) -> str:
        """Until a running replica both holds the Lease and says it leads; its identity."""

        def leading() -> str | None:
            holder = self.leader()
            if holder is None:
                return None
            index = next(i for i, r in enumerate(self.replicas) if r.identity == holder)
            return holder if self.is_leader(index) else None

        return wait_until(leading, timeout=timeout, what=f"a leader for Lease {CONTROLLER_LEASE}")


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
    _stopped: bool = False

    # -- the scheduler ----------------------------------------------------------------------------

    def render_scheduler_config(self) -> JSON:
        """The owner's KubeSchedulerConfiguration, as ``tmi render-scheduler-config`` prints it
        for this profile, the local extender's URL and the CA that signed its certificate."""
        assert self.extender is not None
        return render_scheduler_config(
            self.verified.envelope,
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
        _apply(self, [d for d in owner.applied() if d["kind"] not in _OWNED_ELSEWHERE])
        _wait_rbac(self.plane, settings)
        rolled = [
            name
            for name, (before, after) in {
                WEBHOOK_DEPLOYMENT: (self.tenant, tenant),
                CONTROLLER_DEPLOYMENT: (self.tenant, tenant),
                EXTENDER_DEPLOYMENT: (self.owner, owner),
            }.items()
            if _pod_template(before, name) != _pod_template(after, name)
        ]
        self.settings, self.tenant, self.owner = settings, tenant, owner
        if WEBHOOK_DEPLOYMENT in rolled:
            self.webhook.restart(
                replace(
                    self.webhook.settings,
                    shipped_args=tuple(tenant.args(WEBHOOK_DEPLOYMENT, replace=_LOCAL_FLAGS)),
                    environment=tuple(
                        tenant.environment(WEBHOOK_DEPLOYMENT, self.webhook.directory.name).items()
                    ),
                )
            )
        if EXTENDER_DEPLOYMENT in rolled:
            self.extender.settings = settings
            self.extender.install = owner
            self.extender.restart()
        if CONTROLLER_DEPLOYMENT in rolled:
            self.controller.settings = settings
            self.controller.install = tenant
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
            kube = self.plane.kube("admin")
            for doc in reversed(self.applied):
                meta = doc["metadata"]
                kube.delete(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))

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
    kube = stack.plane.kube(identity)
    for doc in docs:
        # Recorded before the request, so a half-applied stack is still cleaned up; an upgrade
        # applies the same objects again, which are removed once.
        if not any(_same(doc, seen) for seen in stack.applied):
            stack.applied.append(doc)
        kube.apply(doc, field_manager=FIELD_MANAGER)


def _same(a: JSON, b: JSON) -> bool:
    return (a["kind"], a["metadata"]["name"], a["metadata"].get("namespace")) == (
        b["kind"],
        b["metadata"]["name"],
        b["metadata"].get("namespace"),
    )


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
        stack.extender = LocalExtender(plane, settings, port=free_port())
        webhook_port = free_port()
        stack.scheduler_config = stack.render_scheduler_config()
        values = settings.chart_values(
            webhook_url=f"https://{HOST}:{webhook_port}/mutate",
            ca_bundle=plane.ca_bundle,
            scheduler_config=yaml.safe_dump(stack.scheduler_config, sort_keys=False),
        )
        stack.tenant = render_tenant(values, ns)
        stack.owner = render_owner(values, owner_ns)
        _apply(stack, stack.tenant.applied(), identity=INSTALLER)
        _apply(stack, [d for d in stack.owner.applied() if d["kind"] not in _OWNED_ELSEWHERE])
        # The owner publishes the signed profile (seed step 5) and the RuntimeClasses.
        publish_profile(plane, configmap)
        for runtime_class in settings.runtime_classes:
            apply_runtime_class(plane, runtime_class)

        webhook_sa = plane.service_account_identity(ns, WEBHOOK_DEPLOYMENT)
        stack.extender.identity = plane.service_account_identity(owner_ns, EXTENDER_DEPLOYMENT)
        stack.extender.install = stack.owner
        stack.controller = LocalController(
            plane,
            settings,
            install=stack.tenant,
            identity=plane.service_account_identity(ns, CONTROLLER_DEPLOYMENT),
        )
        stack.scheduler_identity = plane.service_account_identity(owner_ns, settings.scheduler_name)
        _wait_rbac(plane, settings)

        webhook_settings = replace(
            settings.webhook_settings(),
            shipped_args=tuple(stack.tenant.args(WEBHOOK_DEPLOYMENT, replace=_LOCAL_FLAGS)),
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
            stack.owner.get("MutatingWebhookConfiguration", CONFIGURATION_NAME)
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
        _user(ns, CONTROLLER_DEPLOYMENT),
        [
            {"resource": "pods", "verb": "watch", "namespace": ns},
            {"resource": "pods", "subresource": "status", "verb": "patch", "namespace": ns},
            {"resource": "configmaps", "verb": "watch", "namespace": ns},
            {
                "group": "coordination.k8s.io",
                "resource": "leases",
                "verb": "update",
                "namespace": ns,
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


# -- engine Pods ----------------------------------------------------------------------------------


def engine_pod(
    namespace: str,
    request: Mapping[str, Any],
    *,
    name: str | None = None,
    deployment_id: str | None = None,
    container: Mapping[str, Any] | None = None,
) -> JSON:
    """An engine Pod as the platform creates it, before the webhook has planned it."""
    deployment = deployment_id or str(uuid.uuid4())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"tmi-{uuid.uuid4().hex[:10]}",
            "namespace": namespace,
            "labels": {ENGINE_LABEL: deployment},
            "annotations": {REQUEST_ANNOTATION: json.dumps(request)},
        },
        "spec": {
            "containers": [
                dict(container)
                if container is not None
                else {"name": "engine", "image": "placeholder.invalid/engine:1"}
            ],
            # No kubelet confirms termination here; nothing is gained by waiting for one.
            "terminationGracePeriodSeconds": 0,
        },
    }


def condition(pod: Mapping[str, Any], kind: str) -> JSON | None:
    for entry in pod.get("status", {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def granted(pod: Mapping[str, Any]) -> str:
    """The accelerator resources the Pod's containers were granted (limits, else requests)."""
    parts: list[str] = []
    for c in pod.get("spec", {}).get("containers") or []:
        resources = c.get("resources") or {}
        source = resources.get("limits") or resources.get("requests") or {}
        parts.extend(f"{k}={v}" for k, v in sorted(source.items()) if is_accelerator_resource(k))
    return ",".join(parts) or "-"


def step7_row(pod: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    """The columns of the seed's Step 7 check: pod, node, RuntimeClass, grant, verified."""
    spec = pod.get("spec", {})
    verified = condition(pod, CONDITION)
    return (
        str(pod["metadata"]["name"]),
        str(spec.get("nodeName") or "-"),
        str(spec.get("runtimeClassName") or "-"),
        granted(pod),
        str(verified["status"]) if verified else "-",
    )


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


__all__ = [
    "CONDITION",
    "CONTROLLER_LEASE",
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
