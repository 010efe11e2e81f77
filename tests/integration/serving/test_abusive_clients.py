"""Slow and abusive callers against the real listener: TLS (trustme), loopback sockets, limits.

The webhook's app runs under `serving.process.serve`, the function both HTTPS servers listen
with, so the limits under test are the ones a deployed server applies: a request body that
trickles in is answered 408 and its connection closed after the read timeout; a request head
that trickles in, and a TLS handshake that never finishes, are closed after their own timeouts;
a header past the size limit is refused. Meanwhile a well-behaved caller on its own connection
still gets its answers within a bound. Every loop here is bounded and ends by itself; the only
waits are the pacing of a trickle, which is the behaviour under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
import trustme

from kits.profilekit import Owner, request
from kits.webhookkit import engine_pod, review, webhook_app
from serving import process
from serving.app import READ_TIMEOUT
from serving.settings import ConnectionLimits

HOST = "127.0.0.1"
# Generous on a loaded two-core machine, and still far below the 60 s asyncio would give a
# handshake or the hour aiohttp would give an idle connection without the limits.
SLACK = 3.0
ANSWER_BOUND = 2.5


@dataclass
class Served:
    port: int
    client_tls: ssl.SSLContext
    limits: ConnectionLimits

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(
            HOST, self.port, ssl=self.client_tls, server_hostname=HOST
        )


@contextlib.asynccontextmanager
async def served(limits: ConnectionLimits) -> AsyncIterator[Served]:
    ca = trustme.CA()
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(HOST).configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    app, _, _ = webhook_app(Owner())
    app[READ_TIMEOUT] = limits.read_timeout
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def until(_: asyncio.Event) -> None:
        await stop.wait()

    task = asyncio.create_task(
        process.serve(
            app,
            HOST,
            0,
            shutdown_timeout=1.0,
            started=lambda runner: port.set_result(runner.addresses[0][1]),
            until=until,
            ssl_context=server_tls,
            limits=limits,
        )
    )
    try:
        yield Served(await asyncio.wait_for(port, 30), client_tls, limits)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def read_until_closed(reader: asyncio.StreamReader, got: bytearray) -> float:
    """Read until the server closes the connection; returns when that happened."""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while chunk := await reader.read(65536):
            got.extend(chunk)
    return time.monotonic()


async def trickle(
    served: Served, head: bytes, drip: bytes, every: float, give_up: float
) -> tuple[float, bytes]:
    """Send `head`, then `drip` every `every` seconds until the server closes the connection
    (or `give_up` seconds pass); the seconds it took the server to close, and what it sent."""
    reader, writer = await served.connect()
    started = time.monotonic()
    got = bytearray()
    closed = asyncio.create_task(read_until_closed(reader, got))
    writer.write(head)
    while not closed.done() and time.monotonic() - started < give_up:
        with contextlib.suppress(ConnectionError, ssl.SSLError, RuntimeError):
            writer.write(drip)
        await asyncio.wait({closed}, timeout=every)
    if not closed.done():
        closed.cancel()
        writer.close()
        return float("inf"), bytes(got)
    writer.close()
    return closed.result() - started, bytes(got)


def review_body() -> bytes:
    return orjson.dumps(review(engine_pod(request())))


async def well_behaved(served: Served, count: int) -> list[float]:
    """`count` reviews on one keep-alive connection; the seconds each took, each checked."""
    connector = aiohttp.TCPConnector(ssl=served.client_tls, limit=1)
    took: list[float] = []
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(count):
            body = review_body()
            started = time.monotonic()
            async with session.post(f"https://{HOST}:{served.port}/mutate", data=body) as resp:
                answer = await resp.json()
            took.append(time.monotonic() - started)
            assert resp.status == 200
            assert answer["response"]["uid"] == orjson.loads(body)["request"]["uid"]
            assert answer["response"]["allowed"] is True
    return took


async def test_a_body_that_trickles_in_gets_408_and_is_cut_off() -> None:
    limits = ConnectionLimits(read_timeout=1.0, linger_seconds=0.5)
    async with served(limits) as server:
        head = (
            f"POST /mutate HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
        ).encode()
        took, answer = await trickle(server, head + b"{", b" ", every=0.1, give_up=20)
        assert took <= limits.read_timeout + limits.linger_seconds + SLACK, took
        assert took >= limits.read_timeout * 0.9, took
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive within 1 seconds" in answer
        # The server is unharmed: the next caller is answered.
        assert max(await well_behaved(server, 3)) < ANSWER_BOUND


async def test_a_request_head_that_trickles_in_is_cut_off() -> None:
    limits = ConnectionLimits(idle_timeout=1.0)
    async with served(limits) as server:
        head = f"POST /mutate HTTP/1.1\r\nHost: {HOST}\r\n".encode()
        took, answer = await trickle(server, head, b"X-Slow: 1\r\n", every=0.1, give_up=20)
        assert took <= limits.idle_timeout + SLACK, took
        assert not answer.startswith(b"HTTP/1.1 2"), answer[:200]


@pytest.mark.parametrize("flood", [200])
async def test_half_open_tls_handshakes_time_out_and_starve_no_one(flood: int) -> None:
    limits = ConnectionLimits(tls_handshake_timeout=1.0)
    async with served(limits) as server:
        started = time.monotonic()
        half_open = []
        for index in range(flood):
            reader, writer = await asyncio.open_connection(HOST, server.port)
            # Half of them start a TLS record and stop; the rest send nothing at all.
            if index % 2:
                writer.write(b"\x16\x03\x01\x02")
            half_open.append((reader, writer))
        took = await well_behaved(server, 20)
        assert max(took) < ANSWER_BOUND, took
        closed_at = await asyncio.wait_for(
            asyncio.gather(*(read_until_closed(r, bytearray()) for r, _ in half_open)),
            limits.tls_handshake_timeout + 30,
        )
        assert max(closed_at) - started <= limits.tls_handshake_timeout + SLACK + 2
        for _, writer in half_open:
            writer.close()


async def test_oversized_headers_are_refused_and_starve_no_one() -> None:
    limits = ConnectionLimits(max_header_bytes=4096)
    async with served(limits) as server:

        async def oversized() -> bytes:
            reader, writer = await server.connect()
            writer.write(
                f"POST /mutate HTTP/1.1\r\nHost: {HOST}\r\nX-Big: ".encode()
                + b"a" * 64 * 1024
                + b"\r\n\r\n"
            )
            got = bytearray()
            await asyncio.wait_for(read_until_closed(reader, got), 30)
            writer.close()
            return bytes(got)

        flood = [asyncio.create_task(oversized()) for _ in range(50)]
        took = await well_behaved(server, 20)
        answers = await asyncio.gather(*flood)
        assert max(took) < ANSWER_BOUND, took
        for answer in answers:
            assert answer.split(b" ", 2)[1] in (b"400", b"431"), answer[:200]


async def test_a_request_line_within_the_limit_is_served() -> None:
    # The limit refuses what is over it, not what is near it.
    limits = ConnectionLimits(max_header_bytes=4096)
    async with served(limits) as server:
        connector = aiohttp.TCPConnector(ssl=server.client_tls)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(
                f"https://{HOST}:{server.port}/mutate",
                data=review_body(),
                headers={"X-Near": "a" * 3500},
            ) as resp,
        ):
            assert resp.status == 200
