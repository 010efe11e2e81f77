"""`tmi-controller` / `python -m allocation_controller`: the AllocationVerified controller process.

Runs on uvloop. On SIGTERM it releases its Lease (so the other replica leads within one retry
period instead of after the Lease expires), stops its loops and exits 0. Exit status 2 means a
setting or the Kubernetes client configuration cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop
from aiohttp import web

from allocation_controller.app import create_app
from allocation_controller.config import ConfigError, ControllerSettings, settings_from_args
from allocation_controller.controller import Controller
from allocation_controller.kubeapi import ClientConfigError, HttpKube

log = logging.getLogger("allocation_controller")


async def serve(settings: ControllerSettings, api: HttpKube) -> None:
    controller = Controller(api, settings)
    if controller.policy.state.trust_error:
        log.error("owner public key unusable: %s", controller.policy.state.trust_error)
    if controller.policy.state.catalog_refusal:
        log.error("engine catalog: %s", controller.policy.state.catalog_refusal)
    runner = web.AppRunner(create_app(controller), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
    await site.start()
    log.info(
        "serving /healthz, /readyz, /metrics on port %d; namespace %s; identity %s",
        settings.port,
        settings.namespace,
        settings.leader.identity,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await controller.run(stop)
    finally:
        await runner.cleanup()
        await api.close()
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_from_args(argv)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        api = HttpKube.from_kubeconfig(
            settings.kubeconfig, settings.namespace, timeout=settings.api_timeout
        )
    except ClientConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(settings, api))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
