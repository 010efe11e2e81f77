"""The control plane's own processes: etcd, kube-apiserver, kube-controller-manager, KWOK and
kube-schedulers.

Each one runs from the self-built binaries on a free port under the plane's work directory and
counts as started only once its health endpoint answers. Kept apart from ``ControlPlane`` so the
handling of processes (ports, command lines, restarts) reads on its own, without the identities,
RBAC and audit concerns the plane also carries.
"""

from __future__ import annotations

import copy
import shutil
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from localcluster.nodes.podnet import PodNetwork
from localcluster.plane.binaries import minor_of, release_of
from localcluster.plane.pki import CertificateAuthority, write_service_account_key
from localcluster.plane.process import (
    ComponentError,
    ManagedProcess,
    free_port,
    http_ok,
    wait_until,
)

HOST = "127.0.0.1"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
DEFAULT_SCHEDULER = "default-scheduler"

START_TIMEOUT = 90.0
_PORT_RETRIES = 3


def default_scheduler_config() -> dict[str, Any]:
    """A KubeSchedulerConfiguration with only the stock ``default-scheduler`` profile."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": DEFAULT_SCHEDULER}],
    }


def data_text(name: str) -> str:
    """One of the files shipped in localcluster/data (manifests, KWOK stages, audit policy)."""
    return resources.files("localcluster").joinpath("data", name).read_text()


def _scheduler_ready_path(binary: Path) -> str:
    """What says a kube-scheduler is ready, as the chart's probe asks it: /readyz from 1.31,
    /healthz before (the release range's older schedulers, `make test-versions`)."""
    minor = minor_of(release_of(binary))
    return "/healthz" if minor is not None and minor < 31 else "/readyz"


def _insecure_context() -> ssl.SSLContext:
    # kube-scheduler serves /readyz with a self-signed in-memory certificate.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _address_in_use(proc: ManagedProcess) -> bool:
    return "address already in use" in proc.log_tail(80).lower()


def _scheduler_config(config: Mapping[str, Any] | str | None, kubeconfig: Path) -> dict[str, Any]:
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
    client_conn["kubeconfig"] = str(kubeconfig)
    cfg["clientConnection"] = client_conn
    cfg.setdefault("leaderElection", {"leaderElect": False})
    return cfg


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
class Components:
    """The plane's processes: the core ones by name, the schedulers by their own name."""

    workdir: Path
    bin_dir: Path
    logs_dir: Path
    ca: CertificateAuthority
    # etcd fsyncs its log by default; the tests skip that (--unsafe-no-fsync) for speed, and the
    # Pod-create benchmark turns it back on to measure what a real cluster's user meets.
    etcd_fsync: bool = False
    etcd_url: str = ""
    server: str = ""
    # Set when a real node joins: the API server then serves Pods as a real cluster's does.
    pod_network: PodNetwork | None = None
    core: dict[str, ManagedProcess] = field(default_factory=dict)
    schedulers: dict[str, Scheduler] = field(default_factory=dict)

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.logs_dir / f"{name}.log", cwd=self.workdir, env=env)
        self.core[name] = proc
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
                    partial(http_ok, ready_url(port), context),
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

    # -- the core components -------------------------------------------------------------------

    def start_etcd(self) -> None:
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

    def start_apiserver(self, audit_args: Sequence[str], extra_args: Sequence[str]) -> None:
        """kube-apiserver on etcd, recording requests as ``audit_args`` say."""
        pki = self.ca.directory
        net = self.pod_network
        hosts = (HOST, "localhost", *(net.apiserver_hosts() if net else ()))
        serving = self.ca.issue_serving("apiserver", hosts)
        node_args = self._real_node_args(net) if net else self._fake_node_args()
        sa = write_service_account_key(pki / "sa.key", pki / "sa.pub")
        ca_context = ssl.create_default_context(cafile=str(self.ca.cert_file))

        def argv(port: int) -> list[str]:
            return [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={serving.cert_file}",
                f"--tls-private-key-file={serving.key_file}",
                f"--client-ca-file={self.ca.cert_file}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa.cert_file}",
                f"--service-account-signing-key-file={sa.key_file}",
                f"--service-cluster-ip-range={(net or PodNetwork()).service_cidr}",
                # Privileged pods must reach admission so the pod guard (not pod
                # validation) is what refuses them.
                "--allow-privileged=true",
                "--profiling=false",
                *node_args,
                *audit_args,
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

    @staticmethod
    def _fake_node_args() -> list[str]:
        return [
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            "--authorization-mode=RBAC",
            # No kubelet mounts tokens or lifts the not-ready taint from KWOK's nodes.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            # A loopback advertise address is invalid in the kubernetes
            # Service's EndpointSlice; skip the reconciler and its log noise.
            "--endpoint-reconciler-type=none",
        ]

    def _real_node_args(self, net: PodNetwork) -> list[str]:
        """A real kubelet's cluster: Pods reach the API server at the bridge's gateway (behind
        the ``kubernetes`` Service), the API server reaches Pods (webhooks by endpoint, logs
        through the kubelet) and the kubelet is held to its own node."""
        client = self.ca.issue_client(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        return [
            "--bind-address=0.0.0.0",
            f"--advertise-address={net.gateway}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            # The node lifecycle controller, which would lift the not-ready taint, is off.
            "--disable-admission-plugins=TaintNodesByCondition",
            # Webhook Services are called at their endpoints: there is no kube-proxy on the
            # API server's side of the bridge, and no cluster DNS.
            "--enable-aggregator-routing=true",
            f"--kubelet-client-certificate={client.cert_file}",
            f"--kubelet-client-key={client.key_file}",
            f"--kubelet-certificate-authority={self.ca.cert_file}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def start_controller_manager(self, kubeconfig: Path) -> None:
        pki = self.ca.directory
        cert_dir = self.workdir / "kube-controller-manager"
        cert_dir.mkdir(exist_ok=True)

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
                # Each controller's client is limited to 20 requests a second by default; the
                # resource-claim controller spends two per DRA Pod (the claim, the Pod's claim
                # status), which capped DRA scheduling at 10 Pods/s whatever the scheduler did.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--profiling=false",
            ]

        self._start_on_free_port(
            "kube-controller-manager",
            argv,
            lambda p: f"https://{HOST}:{p}/healthz",
            what="kube-controller-manager /healthz",
            context=_insecure_context(),
        )

    def start_kwok(self, kubeconfig: Path) -> None:
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
            text += "---\n" + data_text(stage)
        config_file.write_text(text)
        home = self.workdir / "kwok-home"
        home.mkdir(exist_ok=True)

        def argv(port: int) -> list[str]:
            return [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={kubeconfig}",
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
        """Stop a core component and start it again with the same command line (see
        ``ControlPlane.respawn``)."""
        old = self.core[name]
        if kill:
            old.kill()
        else:
            old.stop()
        time.sleep(delay)
        return self._spawn(name, old.argv)

    def stop_core(self) -> None:
        """Stop KWOK, the API server and etcd, in that order."""
        for name in ("kwok", "kube-apiserver", "etcd"):
            proc = self.core.pop(name, None)
            if proc is not None:
                proc.stop()

    # -- schedulers ----------------------------------------------------------------------------

    def start_scheduler(
        self,
        config: Mapping[str, Any] | str | None,
        name: str,
        *,
        kubeconfig: Path,
        identity: str,
        verbosity: int,
        extra_args: Sequence[str],
    ) -> Scheduler:
        """A kube-scheduler for ``config`` (see ``ControlPlane.start_scheduler``)."""
        if name in self.schedulers:
            raise ValueError(f"a scheduler named {name!r} is already running")
        cfg = _scheduler_config(config, kubeconfig)
        config_file = self.workdir / f"scheduler-{name}.yaml"
        config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
        key = f"scheduler-{name}"
        ready = _scheduler_ready_path(self.bin_dir / "kube-scheduler")
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
                lambda p: f"https://{HOST}:{p}{ready}",
                what=f"kube-scheduler {name} {ready}",
                context=_insecure_context(),
            )
        except ComponentError:
            failed = self.core.pop(key, None)
            if failed is not None:
                failed.stop()
            raise
        # Schedulers are tracked in self.schedulers, not with the core processes.
        self.core.pop(key, None)
        sched = Scheduler(name, cfg, config_file, port, identity, verbosity, proc)
        self.schedulers[name] = sched
        return sched

    def stop_scheduler(self, name: str) -> None:
        sched = self.schedulers.pop(name, None)
        if sched is not None:
            sched.process.stop()

    # -- every process -------------------------------------------------------------------------

    def processes(self) -> Iterator[ManagedProcess]:
        yield from self.core.values()
        for sched in self.schedulers.values():
            yield sched.process

    def pids(self) -> dict[str, int]:
        """Each process's pid by its name, from copies of the registries (another thread may
        call it while a scheduler is being started)."""
        running = [
            *list(self.core.values()),
            *(s.process for s in list(self.schedulers.values())),
        ]
        return {proc.name: proc.pid for proc in running}
