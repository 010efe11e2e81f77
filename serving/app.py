"""What a server's aiohttp app does the same way in every server: read a body under the size
limit, and run its cluster source (and certificate reloader) for as long as the app runs.

The answers stay each server's own: the 413 body is the caller's document, and what the source
feeds (a store, a cluster view) is the caller's to start.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from serving.tls import CertificateReloader, reloading


async def read_limited(request: web.Request, max_body_bytes: int, too_large: Any) -> bytes:
    """The body, or HTTPRequestEntityTooLarge with `too_large` as its JSON body when the body is
    over `max_body_bytes` (the app's `client_max_size`)."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise web.HTTPRequestEntityTooLarge(
            max_size=max_body_bytes,
            actual_size=request.content_length or max_body_bytes + 1,
            text=orjson.dumps(too_large).decode(),
            content_type="application/json",
        ) from None


@contextlib.asynccontextmanager
async def running(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    reloader: CertificateReloader | None,
    cert_reload_seconds: float,
) -> AsyncIterator[None]:
    """Starts the source, reloads the certificate while the app runs, stops the source after."""
    await start()
    try:
        async with reloading(reloader, cert_reload_seconds):
            yield
    finally:
        await stop()
