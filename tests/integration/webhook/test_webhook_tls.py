"""The webhook over real TLS: trusted by a test CA, and rotating its certificate while serving.

The server runs on a TCPSite on 127.0.0.1 with the reloader's context, exactly as the process
does; clients trust only the trustme CA. The rotation test keeps requests flowing on fresh
connections (each one a new handshake) while the files are replaced, the key first and the
certificate a moment later, as a careless writer would: not one request may fail, new
connections must see the new serial, and a connection opened before must keep working.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from cryptography import x509

from kits.polling import eventually
from kits.profilekit import Owner, request
from kits.webhookkit import engine_pod, review, webhook_app
from serving.tls import CertificateError, CertificateReloader
from webhook.app import RUNTIME


def _write(path: Path, data: bytes) -> None:
    # Atomic replacement, as the kubelet's Secret volume does it.
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _issue(ca: trustme.CA, cert: Path, key: Path) -> int:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    _write(key, leaf.private_key_pem.bytes())
    _write(cert, b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number


class Server:
    def __init__(self, runner: web.AppRunner, port: int, reloader: CertificateReloader) -> None:
        self.runner, self.port, self.reloader = runner, port, reloader
        self.url = f"https://127.0.0.1:{port}"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_ssl(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(context)
    return context


@pytest.fixture
async def server(ca: trustme.CA, tmp_path: Path) -> AsyncIterator[Server]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    _issue(ca, cert, key)
    reloader = CertificateReloader(str(cert), str(key))
    app, _, _ = webhook_app(Owner())
    app[RUNTIME].reloader = reloader
    app[RUNTIME].cert_reload_seconds = 0.05
    app[RUNTIME].metrics.watch_certificate(reloader)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Server(runner, port, reloader)
    finally:
        await runner.cleanup()


async def _raw_connection(
    server: Server, context: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return reader, writer, x509.load_der_x509_certificate(der).serial_number


async def _raw_healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(3)  # "ok\n"
    return head.split(b"\r\n", 1)[0]


async def test_admission_over_tls(server: Server, client_ssl: ssl.SSLContext) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl)) as session:
        async with session.post(
            server.url + "/mutate?timeout=5s", json=review(engine_pod(request()))
        ) as resp:
            assert resp.status == 200
            body = await resp.json()
        assert body["response"]["allowed"] is True and body["response"]["patch"]
        async with session.get(server.url + "/readyz") as resp:
            assert resp.status == 200


async def test_untrusted_clients_fail_the_handshake(server: Server) -> None:
    context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH)
    trustme.CA().configure_trust(context)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(server.url + "/healthz")


async def test_certificate_rotates_without_a_failed_request(
    server: Server, ca: trustme.CA, client_ssl: ssl.SSLContext, tmp_path: Path
) -> None:
    old_reader, old_writer, old_serial = await _raw_connection(server, client_ssl)
    assert old_serial == server.reloader.serial
    results: list[Any] = []
    stop = asyncio.Event()

    async def hammer() -> None:
        # force_close: every request is a new connection, so a new handshake.
        connector = aiohttp.TCPConnector(ssl=client_ssl, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not stop.is_set():
                try:
                    async with session.post(
                        server.url + "/mutate", json=review(engine_pod(request()))
                    ) as resp:
                        body = await resp.json()
                        results.append((resp.status, body["response"]["allowed"]))
                except Exception as exc:
                    results.append(exc)

    outcomes: list[str] = []
    counted = server.reloader.on_reload

    def record(result: str) -> None:
        outcomes.append(result)
        counted(result)

    server.reloader.on_reload = record
    workers = [asyncio.create_task(hammer()) for _ in range(4)]
    await eventually(lambda: len(results) >= 20, what="requests on the first certificate")
    before = len(results)

    # A half-written pair first: the new key with the old certificate must not be served.
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    _write(tmp_path / "tls.key", leaf.private_key_pem.bytes())
    await eventually(lambda: "failed" in outcomes, what="the half-written pair to be refused")
    assert server.reloader.serial == old_serial
    _write(tmp_path / "tls.crt", b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    new_serial = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number

    await eventually(
        lambda: server.reloader.serial == new_serial, what="the new certificate to be loaded"
    )
    rotated = len(results)
    await eventually(
        lambda: len(results) >= rotated + 20, what="requests on the rotated certificate"
    )
    stop.set()
    await asyncio.gather(*workers)

    failures = [r for r in results if r != (200, True)]
    assert not failures, failures[:5]
    assert len(results) > before > 0

    _, new_writer, serial = await _raw_connection(server, client_ssl)
    assert serial == new_serial != old_serial
    new_writer.close()
    # The connection made before the rotation is untouched and still served.
    assert await _raw_healthz(old_reader, old_writer) == b"HTTP/1.1 200 OK"
    assert old_writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    old_writer.close()

    connector = aiohttp.TCPConnector(ssl=client_ssl)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(server.url + "/metrics") as resp,
    ):
        text = await resp.text()
    assert 'tmi_webhook_certificate_reloads_total{result="loaded"} 1.0' in text
    assert 'tmi_webhook_certificate_reloads_total{result="failed"}' in text


def test_unusable_certificate_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(CertificateError):
        CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    with pytest.raises(CertificateError):
        CertificateReloader(str(tmp_path / "missing.crt"), str(tmp_path / "missing.key"))


async def test_tmi_ping_gets_the_plan_api_answer_over_the_servers_tls(
    server: Server, ca: trustme.CA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the chart's `helm test` Pod runs: the plan API answers over the certificate its
    callers check, by name even when the URL names an address; another CA is refused."""
    import json

    from tmi_cli.main import main

    ca_file = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    body = json.dumps(request())
    loop = asyncio.get_running_loop()

    async def ping(*argv: str) -> tuple[int, Any]:
        status = await loop.run_in_executor(None, main, ["ping", *argv])
        return status, json.loads(capsys.readouterr().out)

    status, out = await ping(f"{server.url}/v1/plan", "--ca-file", str(ca_file), "--json", body)
    assert status == 0 and out["answered"] is True and out["status"] == 200
    assert out["body"]["path"] in ("gpu", "cpu")
    # The certificate names 127.0.0.1 and localhost: checked against a name it carries.
    status, out = await ping(
        f"{server.url}/readyz", "--ca-file", str(ca_file), "--server-name", "localhost"
    )
    assert (status, out["status"], out["body"]) == (0, 200, "ok")
    status, out = await ping(
        f"{server.url}/readyz", "--ca-file", str(ca_file), "--server-name", "tmi-webhook.x.svc"
    )
    assert status == 1 and out["answered"] is False and "certificate" in out["error"].lower()
    other = tmp_path / "other.crt"
    trustme.CA().cert_pem.write_to_path(str(other))
    status, out = await ping(f"{server.url}/readyz", "--ca-file", str(other))
    assert status == 1 and "certificate verify failed" in out["error"]
