"""`tmi-controller` / `python -m allocation_controller`: the AllocationVerified controller process.

Runs on uvloop. On SIGTERM it releases its Lease (so the other replica leads within one retry
period instead of after the Lease expires), stops its loops and exits 0. Exit status 2 means a
setting or the Kubernetes client configuration cannot be used.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp import web

from allocation_controller.app import create_app
from allocation_controller.config import ControllerSettings, settings_from_args
from allocation_controller.controller import Controller
from allocation_controller.kubeapi import HttpKube
from serving import process

log = logging.getLogger("allocation_controller")
# Only probes and scrapes are in flight at a stop, and each is answered at once.
SHUTDOWN_TIMEOUT = 2.0


async def serve(settings: ControllerSettings, api: HttpKube) -> None:
    controller = Controller(api, settings)
    if controller.policy.state.trust_error:
        log.error("owner public key unusable: %s", controller.policy.state.trust_error)
    if controller.policy.state.catalog_refusal:
        log.error("engine catalog: %s", controller.policy.state.catalog_refusal)

    def started(runner: web.AppRunner) -> None:
        log.info(
            "serving /healthz, /readyz, /metrics on port %d; namespace %s; identity %s",
            settings.port,
            settings.namespace,
            settings.leader.identity,
        )

    try:
        await process.serve(
            create_app(controller),
            settings.host,
            settings.port,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
            started=started,
            until=controller.run,
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
