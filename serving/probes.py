"""`/healthz`, `/readyz` and `/metrics` for a server's app, and its JSON answers.

Liveness is the process answering at all. Readiness is a server's own question (has it read
what it needs, is it stopping), so each server says why it is not ready, or None, and the probe
answers 503 with that reason as a JSON problem, or `ok`. The metrics come from the app's own
Prometheus registry, so several apps can live in one process (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def json_response(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(document), status=status, content_type="application/json")


def problem(status: int, detail: str, code: str | None = None) -> web.Response:
    """An error answer a person can read: `{"status": ..., "detail": ...}`, and the stable code
    a script can branch on."""
    body: dict[str, object] = {"status": status, "detail": detail}
    if code:
        body["code"] = code
    return json_response(body, status)


def ok() -> web.Response:
    return web.Response(text="ok\n")


def exposition(registry: CollectorRegistry) -> web.Response:
    """The registry's metrics in the Prometheus text format."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def healthz(request: web.Request) -> web.Response:
    return ok()


def add_probes(
    app: web.Application,
    *,
    unready: Callable[[web.Application], str | None],
    registry: Callable[[web.Application], CollectorRegistry],
) -> None:
    """Route the three probes; `unready` says why the app is not ready (None: it is), and
    `registry` finds the app's registry. Both are asked at each request, so they see the app
    as it is then."""

    async def readyz(request: web.Request) -> web.Response:
        reason = unready(request.app)
        return ok() if reason is None else problem(503, reason)

    async def metrics(request: web.Request) -> web.Response:
        return exposition(registry(request.app))

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
