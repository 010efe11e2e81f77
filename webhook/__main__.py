"""`tmi-webhook` / `python -m webhook`: the admission webhook and plan API as a process.

HTTPS only, on uvloop. On SIGTERM it first reports unready for `--drain-seconds`, so the
Service stops sending new reviews while it still answers them, then stops listening and gives
in-flight requests `--shutdown-timeout` seconds; both together stay inside the Pod's grace
period. Exit status: 0 after a clean shutdown, 2 for a setting or certificate that cannot be used.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp import web

from serving import process
from serving.apiserver import from_kubeconfig
from serving.tls import CertificateReloader
from webhook.app import RUNTIME, create_app
from webhook.config import ServerSettings, settings_from_args
from webhook.profile_source import KubernetesSource, PolicyStore

log = logging.getLogger("webhook")


async def serve(
    app: web.Application, settings: ServerSettings, reloader: CertificateReloader
) -> None:
    def started(runner: web.AppRunner) -> None:
        log.info(
            "serving HTTPS on %s for namespace %s (tenant mode %s)",
            process.addresses(runner),
            settings.namespace,
            "on" if settings.policy.enabled else "off",
        )

    own_ports = {settings.plan_port: frozenset({"/v1/plan"})} if settings.plan_port else None
    await process.serve_draining(
        app,
        settings,
        app[RUNTIME],
        log,
        started=started,
        ssl_context=reloader.context,
        own_ports=own_ports,
    )


def prepare(settings: ServerSettings) -> Coroutine[Any, Any, None]:
    reloader = CertificateReloader(settings.cert_file, settings.key_file)
    store = PolicyStore(settings.policy)
    # Loaded now, so a bad kubeconfig is exit status 2; not at all when nothing is to be read.
    api = from_kubeconfig(settings.kubeconfig) if store.names or store.follows else None
    if store.state.trust_error and settings.policy.enabled:
        log.error(
            "owner public key unusable (%s): every profile will be refused", store.state.trust_error
        )
    if store.state.catalog_refusal:
        log.error("engine catalog: %s", store.state.catalog_refusal)
    source = KubernetesSource(settings.namespace, api, settings.resync_seconds)
    app = create_app(
        settings.policy,
        source,
        store=store,
        max_body_bytes=settings.max_body_bytes,
        reloader=reloader,
        cert_reload_seconds=settings.cert_reload_seconds,
        read_timeout=settings.limits.read_timeout,
    )
    return serve(app, settings, reloader)


def main(argv: Sequence[str] | None = None) -> int:
    return process.main(argv, settings_from_args, prepare)


if __name__ == "__main__":
    raise SystemExit(main())
