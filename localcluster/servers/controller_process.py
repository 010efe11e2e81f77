"""The allocation controller's replicas as local processes of the harness, and the Lease through
which they elect the one that writes.

Each replica keeps its identity across restarts, as a Deployment's Pod keeps its name through
the POD_NAME the chart passes; the fault tests give a replica extra environment for its next
start (their injection points).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from localcluster.install.install import Rendered
from localcluster.plane.components import HOST
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import JSON, ApiError
from localcluster.plane.metrics import metric
from localcluster.plane.process import python_module, wait_until
from localcluster.servers.extender_process import LOCAL_FLAGS
from localcluster.servers.server import START_TIMEOUT, LocalServer, blank_tmi

CONTROLLER_IDENTITY = "tmi-controller"
CONTROLLER_LEASE = "tmi-allocation-controller"
CONTROLLER_DEPLOYMENT = "tmi-allocation-controller"


@dataclass
class ControllerReplica(LocalServer):
    """One controller process, named by its identity (its Pod name)."""

    identity: str = ""
    install: Rendered | None = None
    # The owner part's Deployment this replica runs as (one for every tenant namespace).
    deployment: str = CONTROLLER_DEPLOYMENT
    # The ServiceAccount identity (a kubeconfig user) every replica runs as.
    account: str = CONTROLLER_IDENTITY
    # Extra environment for its next start (the fault tests' injection points).
    env: dict[str, str] = field(default_factory=dict)

    scheme: ClassVar[str] = "http"

    @property
    def process_name(self) -> str:
        return self.identity

    def argv(self) -> list[str]:
        assert self.install is not None, "the controller runs from the owner's rendered part"
        shipped = self.install.args(self.deployment, replace=LOCAL_FLAGS)
        # The replica's identity is its Pod name (POD_NAME), as in the Deployment.
        return [
            *python_module("allocation_controller"),
            *shipped,
            f"--kubeconfig={self.plane.kubeconfig(self.account)}",
            f"--host={HOST}",
            f"--port={self.port}",
        ]

    def environment(self) -> dict[str, str] | None:
        assert self.install is not None
        chart = self.install.environment(self.deployment, self.identity)
        # The fault tests add their injection point on top of the chart's settings.
        return {**blank_tmi(), **chart, **self.env}

    def is_leader(self) -> bool:
        """What the replica itself reports (its tmi_allocation_is_leader gauge)."""
        return metric(self.metrics(), "tmi_allocation_is_leader") == 1.0


@dataclass
class LocalController:
    """The controller's replicas and the Lease through which they elect the one that writes."""

    plane: ControlPlane
    # The first tenant namespace (the Lease's, without ``lease_namespace``).
    namespace: str
    count: int = 2
    replicas: list[ControllerReplica] = field(default_factory=list)
    # The owner's rendered part and the ServiceAccount identity the replicas run as.
    install: Rendered | None = None
    identity: str = CONTROLLER_IDENTITY
    # Where the Lease lives (None: ``namespace``); the chart puts it in the owner's namespace.
    lease_namespace: str | None = None
    # The Deployment and the Lease: one of each for every tenant namespace of the owner release.
    deployment: str = CONTROLLER_DEPLOYMENT
    lease_name: str = CONTROLLER_LEASE

    def __post_init__(self) -> None:
        if not self.replicas:
            self.replicas = [
                ControllerReplica(
                    self.plane,
                    identity=f"{self.lease_name}-{i}",
                    install=self.install,
                    account=self.identity,
                    deployment=self.deployment,
                )
                for i in range(self.count)
            ]

    def set_install(self, install: Rendered) -> None:
        """The rendered part the replicas run from at their next start (an upgrade's)."""
        self.install = install
        for replica in self.replicas:
            replica.install = install

    def log_file(self, replica: ControllerReplica) -> Path:
        return replica.log_file

    def _pick(self, index: int | None) -> list[ControllerReplica]:
        return list(self.replicas) if index is None else [self.replicas[index]]

    def spawn(self, index: int | None = None) -> None:
        for replica in self._pick(index):
            replica.spawn()

    def wait_ready(self, index: int | None = None, timeout: float = START_TIMEOUT) -> None:
        """Until each replica's caches have synced (its /readyz; leadership is separate)."""
        for replica in self._pick(index):
            replica.wait_ready(timeout)

    def start(self, index: int | None = None, *, wait_leader: bool = True) -> None:
        """Start one replica (or all) and wait until it is ready and some replica leads."""
        self.spawn(index)
        self.wait_ready(index)
        if wait_leader:
            self.wait_leader()

    def stop(self, index: int | None = None) -> None:
        for replica in self._pick(index):
            replica.stop()

    def restart(self, index: int | None = None) -> None:
        self.stop(index)
        self.start(index)

    def lease(self) -> JSON | None:
        try:
            return self.plane.kube("admin").get(
                "coordination.k8s.io/v1",
                "Lease",
                self.lease_name,
                self.lease_namespace or self.namespace,
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
        return self.replicas[index].metrics_text()

    def is_leader(self, index: int) -> bool:
        return self.replicas[index].is_leader()

    def wait_leader(self, timeout: float = 45.0) -> str:
        """Until a running replica both holds the Lease and says it leads; its identity."""

        def leading() -> str | None:
            holder = self.leader()
            if holder is None:
                return None
            index = next(i for i, r in enumerate(self.replicas) if r.identity == holder)
            return holder if self.is_leader(index) else None

        return wait_until(leading, timeout=timeout, what=f"a leader for Lease {self.lease_name}")


__all__ = [
    "CONTROLLER_DEPLOYMENT",
    "CONTROLLER_IDENTITY",
    "CONTROLLER_LEASE",
    "ControllerReplica",
    "LocalController",
]
