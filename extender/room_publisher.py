"""The owner's room figures, published into each tenant namespace for its webhook to plan with.

`inference_policy.planning.room` says what the figures are and how the webhook chooses with them;
this writes them. The extender is the one `tmi` server that sees Nodes and every tenant's bound
Pods, so it is the one that can say how much of each device-plugin binding's resource is free. Every
`interval` seconds, once its view is ready, it computes each tenant's figures from the profile
that tenant's feed verified (none without one) and writes the `tmi-binding-room` ConfigMap into
the tenant's namespace when the figures differ from those last written there, or when those
are older than `refresh` seconds (the webhook takes figures older than 90 s as stale). The
figures are recomputed only when their inputs moved: a node, the ledger, or a tenant's feed (any
tenant's profile may change whom this tenant's shares may meet on a GPU).

It writes with a PUT by name and creates the ConfigMap on a 404, so the Role names the one
ConfigMap it may update and grants create in the namespace (RBAC cannot name what is created).
A write that fails is logged and tried again at the next tick; what the figures steer is only
which compatible binding a Pod asks for, so a missing figure costs a Pending Pod at most.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from extender.rollback_record import Requests
from extender.view import ClusterView
from inference_policy.placing.placement import Demand
from inference_policy.placing.room_figures import figures_with
from inference_policy.planning.room import ROOM_CONFIGMAP, BindingRoom, RoomFigures, configmap
from inference_policy.trust.profile import format_timestamp
from serving.kube import NotFound, describe_error
from serving.periodic import Periodic

log = logging.getLogger(__name__)
DEFAULT_INTERVAL = 2.0
DEFAULT_REFRESH = 30.0


@dataclass
class _Written:
    """What was last computed and written for one tenant namespace."""

    inputs: tuple[tuple[int, ...], int, int] | None = None
    bundle: str | None = None
    bindings: dict[str, BindingRoom] | None = None
    written: dict[str, BindingRoom] | None = None
    written_at: datetime | None = None


class RoomPublisher:
    """Keeps `tmi-binding-room` current in every tenant namespace `view` has a feed for."""

    def __init__(
        self,
        view: ClusterView,
        api: Requests,
        clock: Callable[[], datetime],
        *,
        interval: float = DEFAULT_INTERVAL,
        refresh: float = DEFAULT_REFRESH,
    ) -> None:
        self.view = view
        self.api = api
        self.clock = clock
        self.interval = interval
        self.refresh = refresh
        self.ticks = 0
        self.writes = 0
        self.failures = 0
        self._state: dict[str, _Written] = {}
        # One bad tick must not end publishing; the next one starts over.
        self._loop = Periodic(
            self.tick, lambda: self.interval, log, "publishing room figures failed", "room-failed"
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def tick(self) -> None:
        """One round: every tenant's figures, written where they changed or are due."""
        self.ticks += 1
        if not self.view.ready:
            return
        now = self.clock()
        for namespace, feed in self.view.feeds.items():
            profile = feed.snapshot.profile
            if profile is None:
                continue
            state = self._state.setdefault(namespace, _Written())
            inputs = (
                self.view.trust_version,
                self.view.ledger.version,
                self.view.node_revision,
            )
            if inputs != state.inputs or state.bundle != profile.sha256:
                figures = figures_with(profile.envelope, profile.sha256, self._frees, now)
                state.inputs, state.bundle, state.bindings = (
                    inputs,
                    profile.sha256,
                    figures.bindings,
                )
            due = state.written_at is None or (now - state.written_at).total_seconds() >= (
                self.refresh
            )
            if state.bindings == state.written and not due:
                continue
            figures = RoomFigures(
                schemaVersion=1,
                bundle=profile.sha256,
                observedAt=format_timestamp(now),
                bindings=state.bindings or {},
            )
            if await self._write(namespace, configmap(namespace, figures)):
                state.written, state.written_at = state.bindings, now

    def _frees(self, demand: Demand) -> list[int | None]:
        # The view's remembered frees: after the first round only the nodes whose facts or
        # load changed are judged again (20 ms a tenant at 5,000 nodes otherwise).
        view = self.view
        return view.frees(demand, list(view.nodes), list(view.nodes.values()))[0]

    async def _write(self, namespace: str, body: dict[str, object]) -> bool:
        collection = f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps"
        try:
            try:
                await self.api.request("PUT", f"{collection}/{ROOM_CONFIGMAP}", body=body)
            except NotFound:
                await self.api.request("POST", collection, body=body)
        except Exception as exc:
            self.failures += 1
            log.warning(
                "could not write %s in namespace %s: %s",
                ROOM_CONFIGMAP,
                namespace,
                describe_error(exc),
                extra={"code": "room-write-failed", "namespace": namespace},
            )
            return False
        self.writes += 1
        return True


__all__ = ["DEFAULT_INTERVAL", "DEFAULT_REFRESH", "RoomPublisher"]
