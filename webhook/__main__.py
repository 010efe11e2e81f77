"""`tmi-webhook` / `python -m webhook`: the admission webhook and plan API as a process.

HTTPS only, on uvloop. On SIGTERM it first reports unready for `--drain-seconds`, so the
Service stops sending new reviews while it still answers them, then stops listening and gives
in-flight requests `--shutdown-timeout` seconds; both together stay inside the Pod's grace
period. Exit status: 0 after a clean shutdown, 2 for a setting or certificate that cannot be used.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop
from aiohttp import web

from webhook.app import RUNTIME, create_app
from webhook.config import ConfigError, ServerSettings, settings_from_args
from webhook.profile_source import ClientConfigError, KubernetesSource, PolicyStore, kubernetes_api
from webhook.tlsreload import CertificateError, CertificateReloader

log = logging.getLogger("webhook")


async def serve(
    app: web.Application, settings: ServerSettings, reloader: CertificateReloader
) -> None:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(
        runner,
        settings.host,
        settings.port,
        ssl_context=reloader.context,
        backlog=1024,
        reuse_address=True,
    )
    await site.start()
    # Everything built so far lives as long as the process: keeping it out of the collector's
    # generations keeps full collections (and the latency spikes they cause) small.
    gc.freeze()
    log.info(
        "serving HTTPS on %s for namespace %s (tenant mode %s)",
        ", ".join(f"{a[0]}:{a[1]}" for a in runner.addresses),
        settings.namespace,
        "on" if settings.policy.enabled else "off",
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
        reloader = CertificateReloader(settings.cert_file, settings.key_file)
        store = PolicyStore(settings.policy)
        factory = kubernetes_api(settings.kubeconfig) if store.names else lambda: None
    except (CertificateError, ClientConfigError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if store.state.trust_error and settings.policy.enabled:
        log.error(
            "owner public key unusable (%s): every profile will be refused", store.state.trust_error
        )
    if store.state.catalog_refusal:
        log.error("engine catalog: %s", store.state.catalog_refusal)
    source = KubernetesSource(
        settings.namespace,
        settings.kubeconfig,
        settings.resync_seconds,
        api_factory=factory,
    )
    app = create_app(
        settings.policy,
        source,
        store=store,
        max_body_bytes=settings.max_body_bytes,
        reloader=reloader,
        cert_reload_seconds=settings.cert_reload_seconds,
    )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(app, settings, reloader))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
