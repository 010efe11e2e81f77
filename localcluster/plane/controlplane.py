"""A real Kubernetes control plane on 127.0.0.1 for e2e tests and demos.

Starts etcd, kube-apiserver (TLS, RBAC, client-certificate identities),
kube-controller-manager, kube-scheduler(s) and KWOK from the self-built binaries, each on
free ports under one work directory, waits for each by polling its health endpoint, and
tears everything down again. kube-controller-manager makes a tenant's Deployments into
ReplicaSets and Pods, fills the aggregated ``admin``/``edit``/``view`` roles, creates
ServiceAccounts and finishes namespace deletion, as on a real cluster. There is no kubelet:
KWOK plays it for fake nodes, and the API server's ServiceAccount and TaintNodesByCondition
admission plugins stay off because no kubelet would mount tokens or lift the not-ready taint.

Every component and every tmi server under test authenticates as its own user, so the
RBAC rules the project ships are really exercised; only ``admin`` is in
``system:masters``. ``ControlPlane`` composes the parts: the processes
(``localcluster.plane.components``), the identities (``localcluster.plane.identities``), RBAC
(``localcluster.plane.rbac``) and the audit log (``localcluster.plane.audit``).
"""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client as k8s

from localcluster.nodes.podnet import PodNetwork
from localcluster.plane import audit, rbac
from localcluster.plane.binaries import bin_dir as find_bin_dir
from localcluster.plane.components import (
    DEFAULT_SCHEDULER,
    HOST,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    START_TIMEOUT,
    Components,
    Scheduler,
    data_text,
    default_scheduler_config,
)
from localcluster.plane.identities import IDENTITIES, Identities
from localcluster.plane.kube import JSON, ApiError, Kube, Manifest, load_documents
from localcluster.plane.pki import CertificateAuthority, KeyPair
from localcluster.plane.process import ComponentError, ManagedProcess, wait_until


@dataclass
class ControlPlane:
    """Handle on a running local control plane; use ``ControlPlane.start``."""

    workdir: Path
    bin_dir: Path
    ca: CertificateAuthority
    logs_dir: Path
    components: Components
    identities: Identities
    _owns_workdir: bool = False
    _stopped: bool = False

    # -- lifecycle -------------------------------------------------------------

    @classmethod
    def start(
        cls,
        workdir: Path | str | None = None,
        bin_dir: Path | str | None = None,
        *,
        scheduler_config: Mapping[str, Any] | str | None = None,
        start_scheduler: bool = True,
        start_kwok: bool = True,
        start_controller_manager: bool = True,
        apiserver_args: Sequence[str] = (),
        scheduler_verbosity: int = 2,
        etcd_fsync: bool = False,
        pod_network: PodNetwork | None = None,
    ) -> ControlPlane:
        """Bring up etcd, kube-apiserver, (optionally) KWOK and a scheduler.

        ``workdir`` defaults to a fresh temporary directory that ``stop`` removes;
        a given ``workdir`` is kept. ``bin_dir`` defaults to ``localcluster.bin_dir()``.
        ``scheduler_config`` is a KubeSchedulerConfiguration (dict or YAML); None means
        the stock default-scheduler profile. With ``pod_network`` the API server serves a
        real node's Pods (``localcluster.nodes.realnode``): it binds every address, advertises the
        bridge's gateway and authorizes kubelets by node.
        """
        bins = Path(bin_dir) if bin_dir is not None else find_bin_dir()
        owns = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="tmi-k8s-")) if workdir is None else Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        logs = wd / "logs"
        logs.mkdir(exist_ok=True)
        ca = CertificateAuthority(wd / "pki")
        plane = cls(
            workdir=wd,
            bin_dir=bins,
            ca=ca,
            logs_dir=logs,
            components=Components(
                wd, bins, logs, ca, etcd_fsync=etcd_fsync, pod_network=pod_network
            ),
            identities=Identities(wd, ca),
            _owns_workdir=owns,
        )
        try:
            plane.components.start_etcd()
            plane.components.start_apiserver(audit.audit_args(wd), apiserver_args)
            plane.identities.server = plane.components.server
            plane._bootstrap()
            if start_controller_manager:
                plane.components.start_controller_manager(plane.kubeconfig("controller-manager"))
            if start_kwok:
                plane.components.start_kwok(plane.kubeconfig("kwok"))
            if start_scheduler:
                plane.start_scheduler(scheduler_config, verbosity=scheduler_verbosity)
        except BaseException:
            plane.stop(remove_workdir=False)
            raise
        return plane

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self, remove_workdir: bool | None = None) -> None:
        """Stop every component (schedulers first, etcd last). Safe to call twice.

        The work directory is removed only when the harness created it and
        ``remove_workdir`` is not False.
        """
        if self._stopped:
            return
        self._stopped = True
        for name in list(self.schedulers):
            self.stop_scheduler(name)
        self.components.stop_core()
        self.identities.close()
        remove = self._owns_workdir if remove_workdir is None else remove_workdir
        if remove and self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _bootstrap(self) -> None:
        kube = self.kube("admin")
        proc = self.components.core["kube-apiserver"]
        # /readyz does not cover the system namespaces; workloads need "default".
        for ns in ("default", "kube-system", "kube-node-lease"):
            wait_until(
                lambda n=ns: kube.request("GET", f"/api/v1/namespaces/{n}"),  # type: ignore[misc]
                timeout=START_TIMEOUT,
                what=f"namespace {ns}",
                proc=proc,
            )
        wait_until(
            lambda: kube.resource_for(
                "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", wait=0
            ),
            timeout=START_TIMEOUT,
            what="the admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy API",
            proc=proc,
        )
        self.apply_manifest(data_text("kwok-rbac.yaml"))
        self.aggregate_cluster_roles()

    # -- components ------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's URL (empty until it runs)."""
        return self.components.server

    @property
    def etcd_url(self) -> str:
        return self.components.etcd_url

    @property
    def etcd_fsync(self) -> bool:
        return self.components.etcd_fsync

    @property
    def schedulers(self) -> dict[str, Scheduler]:
        """The running kube-schedulers by the name they were started under."""
        return self.components.schedulers

    def respawn(self, name: str, *, kill: bool = False, delay: float = 0.0) -> ManagedProcess:
        """Stop a core component (``etcd``, ``kube-apiserver``) and start it again with the same
        command line: the same ports, data directory and certificates, so every client finds it
        where it was. ``kill`` ends it with SIGKILL (a crash) rather than SIGTERM; ``delay`` is
        how long it stays down. Returns the new process at once; waiting for it to be ready is
        the caller's (see ``localcluster.servers.faults``).
        """
        return self.components.respawn(name, kill=kill, delay=delay)

    def start_scheduler(
        self,
        config: Mapping[str, Any] | str | None = None,
        name: str = DEFAULT_SCHEDULER,
        *,
        identity: str = "scheduler",
        verbosity: int = 2,
        extra_args: Sequence[str] = (),
    ) -> Scheduler:
        """Start a kube-scheduler with a KubeSchedulerConfiguration (dict or YAML text).

        ``name`` keys the process for ``stop_scheduler``/``restart_scheduler`` and its
        log file; the profiles' ``schedulerName`` values are what pods select. The
        harness fills in ``clientConnection.kubeconfig`` and, unless the config says
        otherwise, turns leader election off so several schedulers can run at once.
        ``extra_args`` are added to its command line.
        """
        if name in self.schedulers:
            raise ValueError(f"a scheduler named {name!r} is already running")
        return self.components.start_scheduler(
            config,
            name,
            kubeconfig=self.kubeconfig(identity),
            identity=identity,
            verbosity=verbosity,
            extra_args=extra_args,
        )

    def stop_scheduler(self, name: str = DEFAULT_SCHEDULER) -> None:
        """Stop a scheduler started with ``start_scheduler``; unknown names are ignored."""
        self.components.stop_scheduler(name)

    def restart_scheduler(
        self, name: str = DEFAULT_SCHEDULER, config: Mapping[str, Any] | str | None = None
    ) -> Scheduler:
        """Stop and start a scheduler again, with its previous config unless one is given."""
        old = self.schedulers.get(name)
        if old is None:
            raise KeyError(f"no scheduler named {name!r}")
        self.stop_scheduler(name)
        return self.start_scheduler(
            config if config is not None else old.config,
            name,
            identity=old.identity,
            verbosity=old.verbosity,
        )

    # -- the audit log ----------------------------------------------------------

    @property
    def audit_log(self) -> Path:
        """Where the API server records each request a ServiceAccount outside kube-system
        makes (localcluster/data/audit-policy.yaml)."""
        return self.workdir / audit.LOG_FILE

    def audit_events(self, user: str | None = None) -> list[JSON]:
        """The requests recorded so far, once each, for ``user`` if given. A watch is recorded
        when its response starts; it completes only when the watch ends."""
        return audit.audit_events(self.audit_log, user)

    # -- identities and clients ------------------------------------------------

    def add_identity(
        self, identity: str, user: str | None = None, groups: Sequence[str] = ()
    ) -> Path:
        """Register (or replace) an identity and return its kubeconfig path."""
        return self.identities.add(identity, user, groups)

    def service_account_identity(
        self, namespace: str, name: str, *, expiration_seconds: int = 6 * 3600
    ) -> str:
        """Register an identity that authenticates as a ServiceAccount, with a bound token from
        the TokenRequest API (what a Pod's projected token is), and return the identity's name.

        The servers under test run as the ServiceAccounts the chart creates, so the RBAC they
        are held to is exactly what the chart binds to them. Asking again renews the token.
        """
        answer = self.kube("admin").request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        return self.identities.add_service_account(namespace, name, str(answer["status"]["token"]))

    def user(self, identity: str) -> str:
        """The Kubernetes user name an identity authenticates as."""
        return self.identities.user(identity)

    def client_cert(self, identity: str) -> KeyPair:
        """The identity's client certificate and key, issued on first use."""
        return self.identities.client_cert(identity)

    def kubeconfig(self, identity: str = "admin") -> Path:
        """Path of a kubeconfig file that authenticates as ``identity``."""
        return self.identities.kubeconfig(identity)

    def api_client(self, identity: str = "admin") -> k8s.ApiClient:
        """A ``kubernetes.client.ApiClient`` authenticated as ``identity``."""
        return self.identities.api_client(identity)

    def kube(self, identity: str = "admin") -> Kube:
        """A raw-JSON client (requests, discovery, apply) for ``identity``."""
        return self.identities.kube(identity)

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's (and test servers') certificates."""
        return self.ca.cert_file

    @property
    def ca_bundle(self) -> str:
        """Base64 of the CA certificate, for a webhook's or APIService's ``caBundle``."""
        return base64.b64encode(self.ca.cert_pem()).decode("ascii")

    def issue_serving_cert(self, name: str, hosts: Sequence[str] = (HOST, "localhost")) -> KeyPair:
        """A serving certificate signed by the cluster CA (webhooks, extenders)."""
        return self.ca.issue_serving(f"serving-{name}", hosts)

    # -- conveniences ----------------------------------------------------------

    def apply_manifest(
        self,
        source: Manifest,
        identity: str = "admin",
        *,
        namespace: str | None = None,
        field_manager: str = "tmi-localcluster",
    ) -> list[JSON]:
        """Server-side apply every document of a manifest (any kind), in order.

        Namespaces and CRDs are applied first so later documents can use them.
        """
        docs = load_documents(source)
        first = [d for d in docs if d.get("kind") in ("Namespace", "CustomResourceDefinition")]
        rest = [d for d in docs if d.get("kind") not in ("Namespace", "CustomResourceDefinition")]
        kube = self.kube(identity)
        return [
            kube.apply(doc, namespace=namespace, field_manager=field_manager)
            for doc in first + rest
        ]

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> JSON:
        """Create (or update) a namespace."""
        meta: dict[str, Any] = {"name": name}
        if labels:
            meta["labels"] = dict(labels)
        return self.kube("admin").apply({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})

    def grant_namespace_admin(
        self, identity: str, namespace: str, cluster_role: str = "admin", *, wait: bool = True
    ) -> JSON:
        """Bind ``identity`` to a ClusterRole inside one namespace only.

        With ``wait`` (the default) this returns once the RBAC authorizer, which reads
        bindings from an informer cache, actually grants the role's first rule.
        """
        return rbac.grant_namespace_role(
            self.kube("admin"), identity, self.user(identity), namespace, cluster_role, wait=wait
        )

    def aggregate_cluster_roles(self) -> list[str]:
        """Fill in aggregated ClusterRoles (admin, edit, view, ...) once, as KCM would.

        The bootstrap ``admin``/``edit``/``view`` roles carry only an aggregationRule;
        their rules are written by kube-controller-manager's clusterrole-aggregation
        controller, which does not run here. Without this a RoleBinding to ``admin``
        grants nothing. Call again after applying ClusterRoles labelled
        ``rbac.authorization.k8s.io/aggregate-to-*``. Returns the roles it changed.
        """
        return rbac.aggregate_cluster_roles(self.kube("admin"))

    def log_files(self) -> dict[str, Path]:
        """Every component log written so far, by file stem."""
        return {p.stem: p for p in sorted(self.logs_dir.glob("*.log"))}

    def copy_logs(self, dest: Path) -> list[Path]:
        """Copy all component logs into ``dest`` (for CI artifacts)."""
        dest.mkdir(parents=True, exist_ok=True)
        copied = []
        for path in self.log_files().values():
            target = dest / path.name
            shutil.copyfile(path, target)
            copied.append(target)
        return copied

    def processes(self) -> Iterator[ManagedProcess]:
        return self.components.processes()

    def pids(self) -> dict[str, int]:
        """Each process's pid by its name (a scheduler's is `scheduler-<name>`, while it starts
        and after), from copies of the registries, so another thread may call it while a
        scheduler is being started."""
        return self.components.pids()

    def check_alive(self) -> None:
        """Raise ComponentError naming any component that has exited."""
        for proc in self.processes():
            if not proc.running():
                raise ComponentError(
                    f"{proc.name} exited with status {proc.poll()}; log {proc.log_file}:\n"
                    f"{proc.log_tail()}"
                )


__all__ = [
    "DEFAULT_SCHEDULER",
    "HOST",
    "IDENTITIES",
    "KWOK_NODE_ANNOTATION",
    "KWOK_NODE_ANNOTATION_VALUE",
    "ApiError",
    "ControlPlane",
    "Scheduler",
    "default_scheduler_config",
]
