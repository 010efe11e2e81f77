"""`/healthz`, `/readyz` and `/metrics` for the controller, over plain HTTP.

The probes answer for the replica, not for the leader: a follower with warm caches is ready
(it can take over at once), so both replicas stay in the Service and the PodDisruptionBudget
counts them. A replica that has lost its rights in a tenant namespace stays ready too, and
says so in the answer: the tenant's doing cannot hold up the owner's rollouts and drains.
Liveness fails only when a background loop (an informer, the election, the rights review) has
died, which the loops themselves never allow for an ordinary error; a restart is the right fix
then. What is served is the process's fleet (`allocation_controller.fleet`: every tenant, one
answer) or, in tests and the benchmark, one tenant's `Controller`; both answer the same way.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from allocation_controller.config import ControllerSettings
from allocation_controller.evidence import MAX_REPORT_BYTES, EvidenceBoard, add_evidence_routes
from allocation_controller.metrics import Metrics
from serving.probes import exposition, ok


class Served(Protocol):
    """What the probes and the scrape read: a `Controller` or a `Fleet`."""

    @property
    def settings(self) -> ControllerSettings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def synced(self) -> bool: ...

    @property
    def leading(self) -> bool: ...

    def lacking(self) -> list[str]: ...


SERVED: web.AppKey[Served] = web.AppKey("served")


async def healthz(request: web.Request) -> web.Response:
    if request.app[SERVED].healthy:
        return ok()
    return web.Response(status=503, text="a background loop has stopped\n")


async def readyz(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    if served.synced:
        role = "leader" if served.leading else "follower"
        # Still ready without a tenant's rights (`allocation_controller.rights` says why); the
        # answer names each such tenant for whoever reads it.
        lacking = "".join(f"; {said}" for said in served.lacking())
        return web.Response(text=f"ok ({role}){lacking}\n")
    return web.Response(status=503, text="the Pod and ConfigMap caches have not synced yet\n")


async def metrics(request: web.Request) -> web.Response:
    return exposition(request.app[SERVED].metrics.registry)


def create_app(served: Served) -> web.Application:
    # The evidence route is the only one that reads a body: the app's limit is a report's.
    app = web.Application(client_max_size=MAX_REPORT_BYTES)
    app[SERVED] = served
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if served.settings.evidence_token:
        add_evidence_routes(
            app,
            EvidenceBoard(served.settings.evidence_ttl),
            served.settings.evidence_token,
            served.metrics.registry,
        )
    return app
