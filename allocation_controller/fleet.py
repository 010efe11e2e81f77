"""One process, one Lease, every tenant namespace of the owner release.

Why: a Deployment per tenant namespace meant a pair of replicas, a Lease, a settings ConfigMap
and a process's memory for each tenant, and every tenant's controller watching every other
tenant's engine Pods to hold their shares apart (a watch per pair of tenants). Adding a tenant
should add its parameters, its namespace's Roles and its webhook configuration, nothing more.

So a fleet runs one `Controller` per tenant namespace in one process, each over its own
namespaced API port (one connection pool among them, `HttpKube.beside`), under one
`LeaderElector` on one Lease. When this replica wins the Lease, every tenant's controller
starts its workers (each once its own inputs have been read); when it loses the Lease, or
stops, they all stop; and each write asks the same elector first, so the safety argument of
`allocation_controller.leader` holds for every tenant at once. With leader election off, every
tenant leads from the start.

The tenants' neighbours (`allocation_controller.neighbours`) come from the tenants' own Pod
informers through one `Commons`: one watch per namespace in all. A fleet of one tenant is the
process as it always was, `TMI_TENANT_NAMESPACES` included (that controller then follows the
other namespaces itself).

The process has one metrics registry (`allocation_controller.metrics`); it is alive while every
tenant's loops and the election are, and ready once every tenant's inputs have been read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from allocation_controller.config import ControllerSettings
from allocation_controller.controller import Controller
from allocation_controller.leader import LeaderElector, Leadership
from allocation_controller.metrics import Metrics
from allocation_controller.neighbours import Commons
from allocation_controller.ports import KubePort, LeasePort

log = logging.getLogger(__name__)


class _Always:
    """The leadership of a replica that elects no leader: it may always write."""

    def is_leader(self) -> bool:
        return True


class Fleet:
    """Every tenant's controller, led together through one Lease."""

    def __init__(
        self,
        ports: Sequence[KubePort],
        settings: ControllerSettings,
        *,
        lease: LeasePort,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`ports`: one per tenant of `settings.every_tenant()`, in that order, each for its
        namespace; `lease`: where the Lease is (`settings.lease_namespace`)."""
        tenants = settings.every_tenant()
        if [port.namespace for port in ports] != [tenant.namespace for tenant in tenants]:
            raise ValueError("the fleet needs one port per tenant namespace, in the same order")
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.elector = (
            LeaderElector(
                lease,
                settings.leader,
                namespace=settings.lease_namespace or settings.namespace,
                on_started=self._lead,
                on_stopped=self._follow,
                monotonic=monotonic,
            )
            if settings.leader_elect
            else None
        )
        leadership: Leadership = self.elector or _Always()
        # A tenant alone keeps its own neighbour informers (`TMI_TENANT_NAMESPACES`).
        commons = Commons() if len(tenants) > 1 else None
        self.controllers = [
            Controller(
                port,
                settings.for_tenant(policy),
                metrics=self.metrics,
                clock=clock,
                monotonic=monotonic,
                leadership=leadership,
                commons=commons,
            )
            for port, policy in zip(ports, tenants, strict=True)
        ]
        self.leading = False
        self._tasks: list[asyncio.Task[None]] = []
        self._election: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """Every tenant's inputs read (or refused to it, as `Controller.synced` counts them)."""
        return all(controller.synced for controller in self.controllers)

    @property
    def healthy(self) -> bool:
        election = self._election is None or not self._election.done()
        return (
            bool(self._tasks)
            and election
            and not any(task.done() for task in self._tasks)
            and all(controller.healthy for controller in self.controllers)
        )

    def lacking(self) -> list[str]:
        """Each tenant's missing rights, in a sentence naming its namespace."""
        return [said for controller in self.controllers for said in controller.lacking()]

    def _lead(self) -> None:
        self.leading = True
        for controller in self.controllers:
            controller.lead()
        log.info("leading for %d tenant namespaces", len(self.controllers))

    def _follow(self) -> None:
        self.leading = False
        for controller in self.controllers:
            controller.follow()

    async def run(self, stop: asyncio.Event) -> None:
        """Watch, elect, reconcile every tenant until `stop` is set; then release the Lease,
        and only then stop the tenants' loops, so none writes after the release."""
        loop = asyncio.get_running_loop()
        tenants_stop = asyncio.Event()
        self._tasks = [
            loop.create_task(controller.run(tenants_stop), name=f"tenant-{controller.namespace}")
            for controller in self.controllers
        ]
        if self.elector is not None:
            self._election = loop.create_task(self.elector.run(stop), name="leader-election")
        else:
            self._lead()
        try:
            await stop.wait()
        finally:
            if self._election is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(self._election, timeout=5)
            self._follow()
            tenants_stop.set()
            await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["Fleet"]
