"""`tmi-controller` / `python -m allocation_controller`: the AllocationVerified controller process.

Runs on uvloop, one fleet (`allocation_controller.fleet`) of every tenant namespace it is given
(`TMI_TENANTS`, else the one of `TMI_NAMESPACE`) under one Lease. On SIGTERM it releases its
Lease (so the other replica leads within one retry period instead of after the Lease expires),
stops its loops and exits 0. Exit status 2 means a setting or the Kubernetes client
configuration cannot be used.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp import web

from allocation_controller.app import create_app
from allocation_controller.config import ControllerSettings, settings_from_args
from allocation_controller.fleet import Fleet
from allocation_controller.kubeapi import HttpKube
from serving import process

log = logging.getLogger("allocation_controller")
# Only probes and scrapes are in flight at a stop, and each is answered at once.
SHUTDOWN_TIMEOUT = 2.0


async def serve(settings: ControllerSettings, api: HttpKube) -> None:
    ports = [api, *(api.beside(t.namespace) for t in settings.every_tenant()[1:])]
    fleet = Fleet(ports, settings, lease=api)
    for controller in fleet.controllers:
        state = controller.policy.state
        if state.trust_error:
            log.error("%s: owner public key unusable: %s", controller.namespace, state.trust_error)
        if state.catalog_refusal:
            log.error("%s: engine catalog: %s", controller.namespace, state.catalog_refusal)
    namespaces = ", ".join(controller.namespace for controller in fleet.controllers)

    def started(runner: web.AppRunner) -> None:
        log.info(
            "serving /healthz, /readyz, /metrics on port %d; namespaces %s; identity %s",
            settings.port,
            namespaces,
            settings.leader.identity,
        )

    try:
        await process.serve(
            create_app(fleet),
            settings.host,
            settings.port,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
            started=started,
            until=fleet.run,
        )
    finally:
        await api.close()
    log.info("stopped")


def prepare(settings: ControllerSettings) -> Coroutine[Any, Any, None]:
    api = HttpKube.from_kubeconfig(
        settings.kubeconfig,
        settings.namespace,
        lease_namespace=settings.lease_namespace,
        timeout=settings.api_timeout,
    )
    return serve(settings, api)


def main(argv: Sequence[str] | None = None) -> int:
    return process.main(argv, settings_from_args, prepare)


if __name__ == "__main__":
    raise SystemExit(main())
