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
``system:masters``.
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client as k8s

from localcluster.binaries import bin_dir as find_bin_dir
from localcluster.kube import JSON, ApiError, Kube, Manifest, load_documents
from localcluster.pki import CertificateAuthority, KeyPair, write_service_account_key
from localcluster.process import ComponentError, ManagedProcess, free_port, wait_until

HOST = "127.0.0.1"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
DEFAULT_SCHEDULER = "default-scheduler"

# identity -> (Kubernetes user name, groups). The tmi-* users have no rights until the
# project's own RBAC manifests (or a test) bind them.
IDENTITIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("admin", ("system:masters",)),
    "scheduler": ("system:kube-scheduler", ()),
    "kwok": ("kwok", ()),
    "controller-manager": ("system:kube-controller-manager", ()),
    "tmi-webhook": ("tmi-webhook", ()),
    "tmi-extender": ("tmi-extender", ()),
    "tmi-controller": ("tmi-controller", ()),
    "tmi-installer": ("tmi-installer", ()),
}

START_TIMEOUT = 90.0
_PORT_RETRIES = 3


def default_scheduler_config() -> dict[str, Any]:
    """A KubeSchedulerConfiguration with only the stock ``default-scheduler`` profile."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": DEFAULT_SCHEDULER}],
    }


def _data_text(name: str) -> str:
    return resources.files("localcluster").joinpath("data", name).read_text()


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 - fixed local URL
        return bool(resp.status == 200)


def _insecure_context() -> ssl.SSLContext:
    # kube-scheduler serves /readyz with a self-signed in-memory certificate.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _address_in_use(proc: ManagedProcess) -> bool:
    return "address already in use" in proc.log_tail(80).lower()


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels AND matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


@dataclass
class Scheduler:
    """One running kube-scheduler."""

    name: str
    config: dict[str, Any]
    config_file: Path
    port: int
    identity: str
    verbosity: int
    process: ManagedProcess

    @property
    def log_file(self) -> Path:
        return self.process.log_file

    @property
    def scheduler_names(self) -> list[str]:
        return [p.get("schedulerName", DEFAULT_SCHEDULER) for p in self.config.get("profiles", [])]


@dataclass
class ControlPlane:
    """Handle on a running local control plane; use ``ControlPlane.start``."""

    workdir: Path
    bin_dir: Path
    ca: CertificateAuthority
    server: str
    etcd_url: str
    logs_dir: Path
    _owns_workdir: bool = False
    # etcd fsyncs its log by default; the tests skip that (--unsafe-no-fsync) for speed, and the
    # Pod-create benchmark turns it back on to measure what a real cluster's user meets.
    etcd_fsync: bool = False
    _processes: dict[str, ManagedProcess] = field(default_factory=dict)
    schedulers: dict[str, Scheduler] = field(default_factory=dict)
    _identities: dict[str, tuple[str, tuple[str, ...]]] = field(
        default_factory=lambda: dict(IDENTITIES)
    )
    _kubeconfigs: dict[str, Path] = field(default_factory=dict)
    _client_certs: dict[str, KeyPair] = field(default_factory=dict)
    _tokens: dict[str, str] = field(default_factory=dict)
    _api_clients: list[k8s.ApiClient] = field(default_factory=list)
    _kubes: dict[str, Kube] = field(default_factory=dict)
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
    ) -> ControlPlane:
        """Bring up etcd, kube-apiserver, (optionally) KWOK and a scheduler.

        ``workdir`` defaults to a fresh temporary directory that ``stop`` removes;
        a given ``workdir`` is kept. ``bin_dir`` defaults to ``localcluster.bin_dir()``.
        ``scheduler_config`` is a KubeSchedulerConfiguration (dict or YAML); None means
        the stock default-scheduler profile.
        """
        bins = Path(bin_dir) if bin_dir is not None else find_bin_dir()
        owns = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="tmi-k8s-")) if workdir is None else Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        logs = wd / "logs"
        logs.mkdir(exist_ok=True)
        plane = cls(
            workdir=wd,
            bin_dir=bins,
            ca=CertificateAuthority(wd / "pki"),
            server="",
            etcd_url="",
            logs_dir=logs,
            _owns_workdir=owns,
            etcd_fsync=etcd_fsync,
        )
        try:
            plane._start_etcd()
            plane._start_apiserver(apiserver_args)
            plane._bootstrap()
            if start_controller_manager:
                plane._start_controller_manager()
            if start_kwok:
                plane._start_kwok()
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
        for name in ("kwok", "kube-apiserver", "etcd"):
            proc = self._processes.pop(name, None)
            if proc is not None:
                proc.stop()
        for api in self._api_clients:
            api.close()
        self._api_clients.clear()
        remove = self._owns_workdir if remove_workdir is None else remove_workdir
        if remove and self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- components ------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.logs_dir / f"{name}.log", cwd=self.workdir, env=env)
        self._processes[name] = proc
        return proc

    def _start_on_free_port(
        self,
        name: str,
        argv: Callable[[int], Sequence[str]],
        ready_url: Callable[[int], str],
        *,
        what: str,
        context: ssl.SSLContext | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[ManagedProcess, int]:
        """Start a component on a free port and wait until it answers at ``ready_url``.

        A port found free can be taken by someone else before the component binds it, so a
        start that fails with "address already in use" is retried on another port.
        """
        for attempt in range(_PORT_RETRIES):
            port = free_port()
            proc = self._spawn(name, argv(port), env=env)
            try:
                wait_until(
                    partial(_http_ok, ready_url(port), context),
                    timeout=START_TIMEOUT,
                    what=what,
                    proc=proc,
                )
            except ComponentError:
                if attempt + 1 < _PORT_RETRIES and _address_in_use(proc):
                    proc.stop()
                    continue
                raise
            return proc, port
        raise AssertionError("unreachable")

    def _start_etcd(self) -> None:
        data_dir = self.workdir / "etcd"

        def argv(client_port: int) -> list[str]:
            client_url = f"http://{HOST}:{client_port}"
            peer_url = f"http://{HOST}:{free_port()}"
            shutil.rmtree(data_dir, ignore_errors=True)
            return [
                str(self.bin_dir / "etcd"),
                "--name=tmi",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=tmi={peer_url}",
                *(() if self.etcd_fsync else ("--unsafe-no-fsync",)),
                "--log-level=warn",
            ]

        _, port = self._start_on_free_port(
            "etcd", argv, lambda p: f"http://{HOST}:{p}/health", what="etcd /health"
        )
        self.etcd_url = f"http://{HOST}:{port}"

    def _start_apiserver(self, extra_args: Sequence[str]) -> None:
        pki = self.ca.directory
        serving = self.ca.issue_serving("apiserver", (HOST, "localhost"))
        sa = write_service_account_key(pki / "sa.key", pki / "sa.pub")
        ca_context = ssl.create_default_context(cafile=str(self.ca.cert_file))
        audit_policy = self.workdir / "audit-policy.yaml"
        audit_policy.write_text(_data_text("audit-policy.yaml"))

        def argv(port: int) -> list[str]:
            return [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={serving.cert_file}",
                f"--tls-private-key-file={serving.key_file}",
                f"--client-ca-file={self.ca.cert_file}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa.cert_file}",
                f"--service-account-signing-key-file={sa.key_file}",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--authorization-mode=RBAC",
                # No kube-controller-manager: nobody would create the default
                # ServiceAccount or remove the not-ready taint from new nodes.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                # Privileged pods must reach admission so the pod guard (not pod
                # validation) is what refuses them.
                "--allow-privileged=true",
                # A loopback advertise address is invalid in the kubernetes
                # Service's EndpointSlice; skip the reconciler and its log noise.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                # What ServiceAccounts do, so a test can hold each server to its Role.
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                *extra_args,
            ]

        _, port = self._start_on_free_port(
            "kube-apiserver",
            argv,
            lambda p: f"https://{HOST}:{p}/readyz",
            what="kube-apiserver /readyz",
            context=ca_context,
        )
        self.server = f"https://{HOST}:{port}"

    def _bootstrap(self) -> None:
        kube = self.kube("admin")
        proc = self._processes["kube-apiserver"]
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
        self.apply_manifest(_data_text("kwok-rbac.yaml"))
        self.aggregate_cluster_roles()

    def _start_controller_manager(self) -> None:
        pki = self.ca.directory
        cert_dir = self.workdir / "kube-controller-manager"
        cert_dir.mkdir(exist_ok=True)
        kubeconfig = self.kubeconfig("controller-manager")

        def argv(port: int) -> list[str]:
            return [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={HOST}",
                f"--secure-port={port}",
                f"--cert-dir={cert_dir}",
                "--leader-elect=false",
                # Each controller under its own kube-system ServiceAccount, as kubeadm runs it,
                # so the bootstrap roles (system:controller:*) are what authorise them.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca.cert_file}",
                # No Node IPAM (there is no cluster CIDR) and no node lifecycle: KWOK owns its
                # nodes' conditions, and a test deleting a node must not trigger evictions.
                "--controllers=*,-nodeipam,-nodelifecycle,-service-lb-controller",
                # Deployments roll within a test's patience.
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--profiling=false",
            ]

        self._start_on_free_port(
            "kube-controller-manager",
            argv,
            lambda p: f"https://{HOST}:{p}/healthz",
            what="kube-controller-manager /healthz",
            context=_insecure_context(),
        )

    def _start_kwok(self) -> None:
        config_file = self.workdir / "kwok.yaml"
        # Only Stage documents: a KwokConfiguration given in --config is not defaulted
        # by kwok 0.8.0 (it then refuses to start: "playStageParallelism must be
        # greater than 0"), so the options are passed as flags instead.
        text = ""
        for stage in (
            "stage-node-initialize.yaml",
            "stage-pod-ready.yaml",
            "stage-pod-delete.yaml",
        ):
            text += "---\n" + _data_text(stage)
        config_file.write_text(text)
        home = self.workdir / "kwok-home"
        home.mkdir(exist_ok=True)

        def argv(port: int) -> list[str]:
            return [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={self.kubeconfig('kwok')}",
                f"--config={config_file}",
                f"--manage-nodes-with-annotation-selector="
                f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
                f"--server-address={HOST}:{port}",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.240.0.1",
            ]

        self._start_on_free_port(
            "kwok",
            argv,
            lambda p: f"http://{HOST}:{p}/healthz",
            what="kwok /healthz",
            # KWOK reads and writes ~/.kwok; keep it inside the work directory.
            env={"HOME": str(home)},
        )

    def respawn(self, name: str, *, kill: bool = False, delay: float = 0.0) -> ManagedProcess:
        """Stop a core component (``etcd``, ``kube-apiserver``) and start it again with the same
        command line: the same ports, data directory and certificates, so every client finds it
        where it was. ``kill`` ends it with SIGKILL (a crash) rather than SIGTERM; ``delay`` is
        how long it stays down. Returns the new process at once; waiting for it to be ready is
        the caller's (see ``localcluster.faults``).
        """
        old = self._processes[name]
        if kill:
            old.kill()
        else:
            old.stop()
        time.sleep(delay)
        return self._spawn(name, old.argv)

    # -- schedulers ------------------------------------------------------------

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
        if config is None:
            cfg = default_scheduler_config()
        elif isinstance(config, str):
            loaded = yaml.safe_load(config)
            if not isinstance(loaded, dict):
                raise ValueError("scheduler config YAML must be a mapping")
            cfg = loaded
        else:
            cfg = copy.deepcopy(dict(config))
        cfg.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        cfg.setdefault("kind", "KubeSchedulerConfiguration")
        client_conn = dict(cfg.get("clientConnection") or {})
        client_conn["kubeconfig"] = str(self.kubeconfig(identity))
        cfg["clientConnection"] = client_conn
        cfg.setdefault("leaderElection", {"leaderElect": False})
        config_file = self.workdir / f"scheduler-{name}.yaml"
        config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
        key = f"scheduler-{name}"
        try:
            proc, port = self._start_on_free_port(
                key,
                lambda p: [
                    str(self.bin_dir / "kube-scheduler"),
                    f"--config={config_file}",
                    f"--bind-address={HOST}",
                    f"--secure-port={p}",
                    f"--v={verbosity}",
                    *extra_args,
                ],
                lambda p: f"https://{HOST}:{p}/readyz",
                what=f"kube-scheduler {name} /readyz",
                context=_insecure_context(),
            )
        except ComponentError:
            failed = self._processes.pop(key, None)
            if failed is not None:
                failed.stop()
            raise
        # Schedulers are tracked in self.schedulers, not with the core processes.
        self._processes.pop(key, None)
        sched = Scheduler(name, cfg, config_file, port, identity, verbosity, proc)
        self.schedulers[name] = sched
        return sched

    def stop_scheduler(self, name: str = DEFAULT_SCHEDULER) -> None:
        """Stop a scheduler started with ``start_scheduler``; unknown names are ignored."""
        sched = self.schedulers.pop(name, None)
        if sched is not None:
            sched.process.stop()

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
        return self.workdir / "audit.log"

    def audit_events(self, user: str | None = None) -> list[JSON]:
        """The requests recorded so far, once each, for ``user`` if given. A watch is recorded
        when its response starts; it completes only when the watch ends."""
        if not self.audit_log.is_file():
            return []
        events: dict[str, JSON] = {}
        for line in self.audit_log.read_text().splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("stage") not in ("ResponseStarted", "ResponseComplete"):
                continue
            if user is None or event.get("user", {}).get("username") == user:
                events.setdefault(event["auditID"], event)
        return list(events.values())

    # -- identities and clients ------------------------------------------------

    def add_identity(
        self, identity: str, user: str | None = None, groups: Sequence[str] = ()
    ) -> Path:
        """Register (or replace) an identity and return its kubeconfig path."""
        self._identities[identity] = (user or identity, tuple(groups))
        self._kubeconfigs.pop(identity, None)
        self._kubes.pop(identity, None)
        return self.kubeconfig(identity)

    def service_account_identity(
        self, namespace: str, name: str, *, expiration_seconds: int = 6 * 3600
    ) -> str:
        """Register an identity that authenticates as a ServiceAccount, with a bound token from
        the TokenRequest API (what a Pod's projected token is), and return the identity's name.

        The servers under test run as the ServiceAccounts the chart creates, so the RBAC they
        are held to is exactly what the chart binds to them. Asking again renews the token.
        """
        identity = f"sa:{namespace}:{name}"
        answer = self.kube("admin").request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        self._tokens[identity] = str(answer["status"]["token"])
        self._identities[identity] = (
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        )
        self._kubeconfigs.pop(identity, None)
        self._kubes.pop(identity, None)
        return identity

    def user(self, identity: str) -> str:
        """The Kubernetes user name an identity authenticates as."""
        return self._identities[identity][0]

    def client_cert(self, identity: str) -> KeyPair:
        """The identity's client certificate and key, issued on first use."""
        self.kubeconfig(identity)
        return self._client_certs[identity]

    def kubeconfig(self, identity: str = "admin") -> Path:
        """Path of a kubeconfig file that authenticates as ``identity``."""
        cached = self._kubeconfigs.get(identity)
        if cached is not None:
            return cached
        if identity not in self._identities:
            raise KeyError(f"unknown identity {identity!r}; add it with add_identity()")
        user, groups = self._identities[identity]
        token = self._tokens.get(identity)
        credentials: dict[str, str]
        if token is not None:
            credentials = {"token": token}
        else:
            pair = self.ca.issue_client(f"client-{identity.replace(':', '_')}", user, groups)
            self._client_certs[identity] = pair
            credentials = {
                "client-certificate": str(pair.cert_file),
                "client-key": str(pair.key_file),
            }
        path = self.workdir / "kubeconfig" / f"{identity.replace(':', '_')}.yaml"
        path.parent.mkdir(exist_ok=True)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tmi-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.ca.cert_file),
                    },
                }
            ],
            "users": [{"name": identity, "user": credentials}],
            "contexts": [{"name": identity, "context": {"cluster": "tmi-local", "user": identity}}],
            "current-context": identity,
        }
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        self._kubeconfigs[identity] = path
        return path

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

    def api_client(self, identity: str = "admin") -> k8s.ApiClient:
        """A ``kubernetes.client.ApiClient`` authenticated as ``identity``."""
        if not self.server:
            raise RuntimeError("the API server is not running")
        token = self._tokens.get(identity)
        if token is not None:
            conf = k8s.Configuration(
                host=self.server,
                ssl_ca_cert=str(self.ca.cert_file),
                api_key={"authorization": token},
                api_key_prefix={"authorization": "Bearer"},
            )
        else:
            pair = self.client_cert(identity)
            conf = k8s.Configuration(
                host=self.server,
                ssl_ca_cert=str(self.ca.cert_file),
                cert_file=str(pair.cert_file),
                key_file=str(pair.key_file),
            )
        api = k8s.ApiClient(conf)
        self._api_clients.append(api)
        return api

    def kube(self, identity: str = "admin") -> Kube:
        """A raw-JSON client (requests, discovery, apply) for ``identity``."""
        kube = self._kubes.get(identity)
        if kube is None:
            kube = Kube(self.api_client(identity))
            self._kubes[identity] = kube
        return kube

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
        user = self.user(identity)
        kube = self.kube("admin")
        binding = kube.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{identity}-{cluster_role}", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": cluster_role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            }
        )
        if wait:
            role = kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", cluster_role)
            rule = next(
                (r for r in role.get("rules") or [] if r.get("resources") and r.get("verbs")),
                None,
            )
            if rule is not None:
                attrs = {
                    "namespace": namespace,
                    "group": (rule.get("apiGroups") or [""])[0].replace("*", ""),
                    "resource": rule["resources"][0].replace("*", "pods"),
                    "verb": rule["verbs"][0].replace("*", "get"),
                }
                review = {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "spec": {"user": user, "resourceAttributes": attrs},
                }
                wait_until(
                    lambda: kube.request(
                        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review
                    )["status"].get("allowed"),
                    timeout=30,
                    what=f"RBAC to grant {user} {cluster_role} in {namespace}",
                )
        return binding

    def aggregate_cluster_roles(self) -> list[str]:
        """Fill in aggregated ClusterRoles (admin, edit, view, ...) once, as KCM would.

        The bootstrap ``admin``/``edit``/``view`` roles carry only an aggregationRule;
        their rules are written by kube-controller-manager's clusterrole-aggregation
        controller, which does not run here. Without this a RoleBinding to ``admin``
        grants nothing. Call again after applying ClusterRoles labelled
        ``rbac.authorization.k8s.io/aggregate-to-*``. Returns the roles it changed.
        """
        kube = self.kube("admin")
        path = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
        changed: list[str] = []
        # Aggregated roles can select other aggregated roles (admin <- edit <- view);
        # repeat until nothing changes.
        for _ in range(5):
            roles = {r["metadata"]["name"]: r for r in kube.request("GET", path)["items"]}
            updated = False
            for name, role in sorted(roles.items()):
                selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
                if not selectors:
                    continue
                rules: list[Any] = []
                for other_name, other in sorted(roles.items()):
                    if other_name == name:
                        continue
                    labels = other["metadata"].get("labels") or {}
                    if any(_selector_matches(sel, labels) for sel in selectors):
                        for rule in other.get("rules") or []:
                            if rule not in rules:
                                rules.append(rule)
                if rules != (role.get("rules") or []):
                    kube.request(
                        "PATCH",
                        f"{path}/{name}",
                        body={"rules": rules},
                        content_type="application/merge-patch+json",
                    )
                    changed.append(name)
                    updated = True
            if not updated:
                break
        return changed

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
        yield from self._processes.values()
        for sched in self.schedulers.values():
            yield sched.process

    def pids(self) -> dict[str, int]:
        """Each process's pid by its name (a scheduler's is `scheduler-<name>`, while it starts
        and after), from copies of the registries, so another thread may call it while a
        scheduler is being started."""
        running = [
            *list(self._processes.values()),
            *(s.process for s in list(self.schedulers.values())),
        ]
        return {proc.name: proc.pid for proc in running}

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
    "IDENTITIES",
    "KWOK_NODE_ANNOTATION",
    "ApiError",
    "ControlPlane",
    "Scheduler",
    "default_scheduler_config",
]
