"""What a server's aiohttp app does the same way in every server: read a body under the size
limit and in time, and run its cluster source (and certificate reloader) for as long as the app
runs.

The answers stay each server's own: the 413 body is the caller's document, and what the source
feeds (a store, a cluster view) is the caller's to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from serving.settings import ConnectionLimits
from serving.tls import CertificateReloader, reloading

log = logging.getLogger(__name__)

# The app's body read timeout (`ConnectionLimits.read_timeout`), set by its factory.
READ_TIMEOUT = web.AppKey("read_timeout", float)
_DEFAULT_READ_TIMEOUT = ConnectionLimits().read_timeout


async def read_limited(request: web.Request, max_body_bytes: int, too_large: Any) -> bytes:
    """The body, or HTTPRequestEntityTooLarge with `too_large` as its JSON body when the body is
    over `max_body_bytes` (the app's `client_max_size`), or HTTPRequestTimeout (408, with the
    connection closed) when it has not all arrived within the app's `READ_TIMEOUT`: a body
    that trickles in would otherwise hold its connection and handler for as long as the caller
    likes.

    A body that has all arrived (the common case: a review fits in the packets that carry its
    head) is read without the timeout, whose timer costs more than the read itself."""
    try:
        if request.content.is_eof():
            return await request.read()
        async with asyncio.timeout(_read_timeout(request)):
            return await request.read()
    except TimeoutError:
        # Caught here: a TimeoutError that reached aiohttp would become its bare 504.
        detail = f"the request body did not arrive within {_read_timeout(request):g} seconds"
        log.warning("request body not read in time", extra={"status": 408, "path": request.path})
        slow = web.HTTPRequestTimeout(
            text=orjson.dumps({"status": 408, "detail": detail}).decode(),
            content_type="application/json",
        )
        slow.force_close()
        raise slow from None
    except web.HTTPRequestEntityTooLarge:
        raise web.HTTPRequestEntityTooLarge(
            max_size=max_body_bytes,
            actual_size=request.content_length or max_body_bytes + 1,
            text=orjson.dumps(too_large).decode(),
            content_type="application/json",
        ) from None


def _read_timeout(request: web.Request) -> float:
    return request.app.get(READ_TIMEOUT, _DEFAULT_READ_TIMEOUT)


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
