"""`tmi-extender` / `python -m extender`: the scheduler extender as a process.

HTTPS on uvloop (plain HTTP only with `--plain-http`, for a loopback test). On SIGTERM it first
reports unready for `--drain-seconds`, so the Service stops sending new calls while it still
answers them, then stops listening and gives in-flight calls `--shutdown-timeout` seconds.
Exit status: 0 after a clean shutdown, 2 for a setting or certificate that cannot be used.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp import web

from extender.app import RUNTIME, create_app
from extender.config import ExtenderSettings, settings_from_args
from extender.quota import QuotaBoard
from extender.sources import KubernetesSource
from serving import process
from serving.apiserver import from_kubeconfig
from serving.tls import CertificateReloader

log = logging.getLogger("extender")


async def serve(
    app: web.Application, settings: ExtenderSettings, reloader: CertificateReloader | None
) -> None:
    def started(runner: web.AppRunner) -> None:
        tenants = settings.every_tenant()
        log.info(
            "serving %s on %s; profiles %s; accounting pods in %s",
            "HTTPS" if reloader else "plain HTTP",
            process.addresses(runner),
            ", ".join(f"{t.namespace}/{t.policy.bundle_configmap}" for t in tenants),
            ", ".join(settings.pod_namespaces),
        )

    await process.serve_draining(
        app,
        settings,
        app[RUNTIME],
        log,
        started=started,
        ssl_context=reloader.context if reloader else None,
    )


def prepare(settings: ExtenderSettings) -> Coroutine[Any, Any, None]:
    reloader = (
        None if settings.plain_http else CertificateReloader(settings.cert_file, settings.key_file)
    )
    quota = QuotaBoard(t.namespace for t in settings.every_tenant())
    source = KubernetesSource(
        settings.pod_namespaces,
        from_kubeconfig(settings.kubeconfig),
        resync_seconds=settings.resync_seconds,
        watch_seconds=settings.watch_seconds,
        room_seconds=settings.room_seconds,
        quota=quota,
    )
    app = create_app(
        settings.policy,
        source,
        pod_namespaces=settings.pod_namespaces,
        max_body_bytes=settings.max_body_bytes,
        reloader=reloader,
        cert_reload_seconds=settings.cert_reload_seconds,
        read_timeout=settings.limits.read_timeout,
        rollback_record=settings.rollback_record,
        tenants=settings.every_tenant(),
        allocation_controller=settings.allocation_controller,
        rights_seconds=settings.rights_seconds,
        quota=quota,
    )
    view = app[RUNTIME].view
    if view.policy.trust_error:
        log.error(
            "owner public key unusable (%s): every GPU Pod will be refused", view.policy.trust_error
        )
    return serve(app, settings, reloader)


def main(argv: Sequence[str] | None = None) -> int:
    return process.main(argv, settings_from_args, prepare)


if __name__ == "__main__":
    raise SystemExit(main())
