"""`tmi-extender` / `python -m extender`: the scheduler extender as a process.

HTTPS on uvloop (plain HTTP only with `--plain-http`, for a loopback test). On SIGTERM it first
reports unready for `--drain-seconds`, so the Service stops sending new calls while it still
answers them, then stops listening and gives in-flight calls `--shutdown-timeout` seconds.
Exit status: 0 after a clean shutdown, 2 for a setting or certificate that cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop
from aiohttp import web

from extender.app import RUNTIME, create_app
from extender.config import ConfigError, ExtenderSettings, settings_from_args
from extender.sources import ClientConfigError, KubernetesSource, kubernetes_api
from extender.tls import CertificateError, CertificateReloader

log = logging.getLogger("extender")


async def serve(
    app: web.Application, settings: ExtenderSettings, reloader: CertificateReloader | None
) -> None:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(
        runner,
        settings.host,
        settings.port,
        ssl_context=reloader.context if reloader else None,
        backlog=1024,
        reuse_address=True,
    )
    await site.start()
    log.info(
        "serving %s on %s; profile %s/%s; accounting pods in %s",
        "HTTPS" if reloader else "plain HTTP",
        ", ".join(f"{a[0]}:{a[1]}" for a in runner.addresses),
        settings.namespace,
        settings.policy.bundle_configmap,
        ", ".join(settings.pod_namespaces),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("stopping: unready for %.1fs, then draining", settings.drain_seconds)
        app[RUNTIME].draining = True
        await asyncio.sleep(settings.drain_seconds)
    finally:
        await runner.cleanup()
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
        reloader = (
            None
            if settings.plain_http
            else CertificateReloader(settings.cert_file, settings.key_file)
        )
        factory = kubernetes_api(settings.kubeconfig)
    except (CertificateError, ClientConfigError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    source = KubernetesSource(
        settings.pod_namespaces,
        settings.kubeconfig,
        resync_seconds=settings.resync_seconds,
        watch_seconds=settings.watch_seconds,
        api_factory=factory,
    )
    app = create_app(
        settings.policy,
        source,
        pod_namespaces=settings.pod_namespaces,
        max_body_bytes=settings.max_body_bytes,
        reloader=reloader,
        cert_reload_seconds=settings.cert_reload_seconds,
    )
    view = app[RUNTIME].view
    if view.policy.trust_error:
        log.error(
            "owner public key unusable (%s): every GPU Pod will be refused", view.policy.trust_error
        )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(app, settings, reloader))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
