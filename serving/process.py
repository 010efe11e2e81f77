"""A server as a process: refusing unusable settings, logging, uvloop, and serving until a signal.

Every server exits 2 with `error: ...` on standard error for a setting, certificate or client
configuration it cannot use, logs JSON lines to standard error (`serving.logs`), and runs its
app on uvloop. On SIGTERM or SIGINT it stops the way its Pods need: the webhook and the
extender first report unready for the drain period, so their Service stops sending new calls
while they still answer them, then stop listening and give calls in flight the shutdown
timeout; the controller stops its loops instead. Either way the stop fits inside the Pod's
grace period.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import uvloop
from aiohttp import web

from serving import logs
from serving.kube import ClientConfigError
from serving.settings import ConfigError, ConnectionLimits, ServingSettings
from serving.tls import CertificateError

EXIT_UNUSABLE = 2
# The webhook and the extender are called in bursts (a Deployment scaled up, a scheduling wave):
# an accept queue deeper than aiohttp's 128 keeps a burst from being refused while the loop is busy.
BURST_BACKLOG = 1024


class Logged(Protocol):
    """Settings that name the log level."""

    @property
    def log_level(self) -> str: ...


S = TypeVar("S", bound=Logged)


class Phase(Protocol):
    """What the readiness probe reads: set once a stop has begun."""

    draining: bool


def main(
    argv: Sequence[str] | None,
    settings_from_args: Callable[[Sequence[str] | None], S],
    prepare: Callable[[S], Coroutine[Any, Any, None]],
) -> int:
    """A server's entry point: its settings, then logging, then `prepare` (which loads the
    certificate and the client configuration and builds the app), then the coroutine it returns,
    on uvloop. The exit status: 0 after a clean stop, 2 when a setting, the certificate or the
    client configuration cannot be used, said as `error: ...` on standard error."""
    try:
        settings = settings_from_args(argv)
    except ConfigError as exc:
        return _refuse(exc)
    logs.install(settings.log_level)
    try:
        serving = prepare(settings)
    except (CertificateError, ClientConfigError) as exc:
        return _refuse(exc)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serving)
    return 0


def _refuse(problem: Exception) -> int:
    sys.stderr.write(f"error: {problem}\n")
    return EXIT_UNUSABLE


def addresses(runner: web.AppRunner) -> str:
    """Where the runner listens, as `host:port, ...`, for the log."""
    return ", ".join(f"{address[0]}:{address[1]}" for address in runner.addresses)


class _Site(web.TCPSite):
    """A TCP site whose TLS handshakes are bounded: aiohttp's `TCPSite` passes no handshake
    timeout, which leaves asyncio's 60 s to every connection that opens and never finishes one."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str | None,
        port: int,
        *,
        handshake_timeout: float,
        ssl_context: ssl.SSLContext | None,
        backlog: int,
    ) -> None:
        super().__init__(
            runner, host, port, ssl_context=ssl_context, backlog=backlog, reuse_address=True
        )
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._handshake_timeout if self._ssl_context else None,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


OPS_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
PROBES = frozenset({"/healthz", "/readyz"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _split_ports(serving_port: int, own_ports: Mapping[int, frozenset[str]]) -> Any:
    """A middleware that serves each path set of `own_ports` on its own port alone (the probes
    everywhere) and keeps those paths off every other port: the same app answers all of them,
    and a NetworkPolicy can only tell callers apart by port."""
    owned = {path: port for port, paths in own_ports.items() for path in paths - PROBES}

    @web.middleware
    async def split(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        sockname: Any = transport.get_extra_info("sockname") if transport is not None else None
        port = sockname[1] if isinstance(sockname, tuple) else serving_port
        path = request.path
        if path in PROBES:
            return await handler(request)
        home = owned.get(path)
        if home is not None and home != port:
            raise web.HTTPNotFound(text=f"{path} is served on port {home}\n")
        if home is None and port in own_ports:
            raise web.HTTPNotFound(text=f"port {port} serves only {sorted(own_ports[port])}\n")
        return await handler(request)

    return split


async def serve(
    app: web.Application,
    host: str | None,
    port: int,
    *,
    shutdown_timeout: float,
    started: Callable[[web.AppRunner], None],
    until: Callable[[asyncio.Event], Awaitable[None]],
    ssl_context: ssl.SSLContext | None = None,
    backlog: int = 128,
    limits: ConnectionLimits | None = None,
    metrics_port: int | None = None,
    own_ports: Mapping[int, tuple[frozenset[str], ssl.SSLContext | None]] | None = None,
) -> None:
    """Listen, call `started`, and serve until `until` returns; `until` gets an event that
    SIGTERM and SIGINT set. Then stop listening and give requests in flight `shutdown_timeout`
    seconds before they are cancelled. `limits` bound what one connection may hold (the body's
    own read timeout is the app's, `serving.app.read_limited`). With `metrics_port`, /metrics is
    served there alone (plain HTTP, with the probes) and no longer on `port`; `own_ports` puts
    other paths on ports of their own the same way (with their TLS context)."""
    limits = limits or ConnectionLimits()
    extra: dict[int, tuple[frozenset[str], ssl.SSLContext | None]] = dict(own_ports or {})
    if metrics_port is not None:
        extra[metrics_port] = (OPS_PATHS, None)
    if extra:
        app.middlewares.append(_split_ports(port, {p: paths for p, (paths, _) in extra.items()}))
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=shutdown_timeout, **limits.handler_options()
    )
    await runner.setup()
    site = _Site(
        runner,
        host,
        port,
        handshake_timeout=limits.tls_handshake_timeout,
        ssl_context=ssl_context,
        backlog=backlog,
    )
    await site.start()
    for own_port, (_, context) in extra.items():
        await _Site(
            runner,
            host,
            own_port,
            handshake_timeout=limits.tls_handshake_timeout,
            ssl_context=context,
            backlog=backlog,
        ).start()
    # Everything built so far (modules, the verified profile, the catalog) lives as long as
    # the process: keeping it out of the collector's generations keeps each full collection,
    # a pause of the one event loop that answers every call, down to what came after.
    gc.freeze()
    started(runner)
    # Installed only now: a signal before the server listens ends the process at once, which is
    # all a stop needs then.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await until(stop)
    finally:
        await runner.cleanup()


async def serve_draining(
    app: web.Application,
    settings: ServingSettings,
    phase: Phase,
    log: logging.Logger,
    *,
    started: Callable[[web.AppRunner], None],
    ssl_context: ssl.SSLContext | None = None,
    own_ports: Mapping[int, frozenset[str]] | None = None,
) -> None:
    """Serve until a signal, then report unready (`phase.draining`) for the drain period while
    still answering, then stop. `own_ports`: paths served alone on a port of their own, over
    the same TLS as the serving port."""

    async def drain(stop: asyncio.Event) -> None:
        await stop.wait()
        log.info("stopping: unready for %.1fs, then draining", settings.drain_seconds)
        phase.draining = True
        await asyncio.sleep(settings.drain_seconds)

    await serve(
        app,
        settings.host,
        settings.port,
        shutdown_timeout=settings.shutdown_timeout,
        started=started,
        until=drain,
        ssl_context=ssl_context,
        backlog=BURST_BACKLOG,
        limits=settings.limits,
        metrics_port=settings.metrics_port,
        own_ports={p: (paths, ssl_context) for p, paths in (own_ports or {}).items()},
    )
    log.info("stopped")
