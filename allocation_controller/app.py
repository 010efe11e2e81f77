"""`/healthz`, `/readyz` and `/metrics` for the controller, over plain HTTP.

The probes answer for the replica, not for the leader: a follower with warm caches is ready
(it can take over at once), so both replicas stay in the Service and the PodDisruptionBudget
counts them. A replica that has lost its rights in the tenant namespace stays ready too, and
says so in the answer: the tenant's doing cannot hold up the owner's rollouts and drains.
Liveness fails only when a background loop (an informer, the election, the rights review) has
died, which the loops themselves never allow for an ordinary error; a restart is the right fix
then.
"""

from __future__ import annotations

from aiohttp import web

from allocation_controller.controller import Controller
from allocation_controller.evidence import MAX_REPORT_BYTES, EvidenceBoard, add_evidence_routes
from serving.probes import exposition, ok

CONTROLLER = web.AppKey("controller", Controller)


async def healthz(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    if controller.healthy:
        return ok()
    return web.Response(status=503, text="a background loop has stopped\n")


async def readyz(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    if controller.synced:
        role = "leader" if controller.leading else "follower"
        # Still ready without its tenant rights (`allocation_controller.rights` says why); the
        # answer says so for whoever reads it.
        lacking = f"; {controller.rights.summary()}" if controller.rights.missing else ""
        return web.Response(text=f"ok ({role}){lacking}\n")
    return web.Response(status=503, text="the Pod and ConfigMap caches have not synced yet\n")


async def metrics(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    controller.metrics.queue_depth.set(len(controller.queue))
    return exposition(controller.metrics.registry)


def create_app(controller: Controller) -> web.Application:
    # The evidence route is the only one that reads a body: the app's limit is a report's.
    app = web.Application(client_max_size=MAX_REPORT_BYTES)
    app[CONTROLLER] = controller
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if controller.settings.evidence_token:
        add_evidence_routes(
            app,
            EvidenceBoard(controller.settings.evidence_ttl),
            controller.settings.evidence_token,
            controller.metrics.registry,
        )
    return app
