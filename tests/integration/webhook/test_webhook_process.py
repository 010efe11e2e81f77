"""`python -m webhook` as a process: TLS on uvloop, the API server as its source, SIGTERM.

This is how the e2e tier will start the webhook, so it is tested the same way here, against the
fake API server through a kubeconfig: readiness once the profile is read, a planned Pod, a
certificate swapped under it, unreadiness while draining, and a clean exit on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from cryptography import x509

from kits.fakeapi import FakeApiServer
from kits.polling import eventually_async
from kits.profilekit import CLUSTER, NAMESPACE, Owner, request
from kits.webhookkit import engine_pod, review
from localcluster.plane.process import python_module


def _env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TMI_", "KUBERNETES_")) and k not in ("POD_NAMESPACE", "KUBECONFIG")
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _issue(ca: trustme.CA, directory: Path) -> int:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    for name, data in (
        ("tls.key", leaf.private_key_pem.bytes()),
        ("tls.crt", b"".join(p.bytes() for p in leaf.cert_chain_pems)),
    ):
        (directory / (name + ".tmp")).write_bytes(data)
        os.replace(directory / (name + ".tmp"), directory / name)
    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(NAMESPACE)
    await server.start()
    yield server
    await server.stop()


async def _run(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *python_module("webhook"), *args, env=_env(), stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_process_serves_rotates_and_stops(api: FakeApiServer, tmp_path: Path) -> None:
    owner = Owner()
    api.put(owner.sign())
    ca = trustme.CA()
    first_serial = _issue(ca, tmp_path)
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        *python_module("webhook"),
        "--cert", str(tmp_path / "tls.crt"),
        "--key", str(tmp_path / "tls.key"),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
        "--namespace", NAMESPACE,
        "--enabled",
        "--owner-public-key", f"{Owner().public_key},{owner.public_key}",
        "--cluster-binding-id", CLUSTER,
        "--cert-reload-seconds", "0.2",
        "--drain-seconds", "1",
        "--shutdown-timeout", "2",
        env=_env(),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(context)
    base = f"https://127.0.0.1:{port}"
    try:
        connector = aiohttp.TCPConnector(ssl=context, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def readyz_is(status: int) -> bool:
                async with session.get(base + "/readyz") as resp:
                    return resp.status == status

            await eventually_async(
                lambda: readyz_is(200),
                what="the webhook to become ready",
                timeout=20,
                interval=0.1,
                ignoring=(aiohttp.ClientConnectionError,),
            )

            async with session.post(
                base + "/mutate?timeout=5s", json=review(engine_pod(request()))
            ) as resp:
                body = await resp.json()
            assert body["response"]["allowed"] is True and body["response"]["patch"]
            async with session.post(base + "/v1/plan", json=request(engine="mlx")) as resp:
                assert resp.status == 422

            new_serial = _issue(ca, tmp_path)
            assert new_serial != first_serial

            async def serving_the_new_certificate() -> bool:
                _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
                der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
                writer.close()
                return bool(x509.load_der_x509_certificate(der).serial_number == new_serial)

            await eventually_async(
                serving_the_new_certificate,
                what="the new certificate to be served",
                interval=0.05,
            )

            proc.send_signal(signal.SIGTERM)
            # Draining: unready while still answering, for the drain window (1 s).
            await eventually_async(
                lambda: readyz_is(503), what="the webhook to turn unready", interval=0.02
            )
            async with session.get(base + "/healthz") as resp:
                assert resp.status == 200
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    # Every line the process wrote is one JSON object in the servers' shared shape.
    records = [json.loads(line) for line in (await proc.stderr.read()).decode().splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= set(record) for record in records)
    log = "\n".join(record["msg"] for record in records)
    assert "serving HTTPS on 127.0.0.1" in log
    assert "verified profile kamiwaza-inference-profiles version 1" in log
    assert "serving certificate reloaded" in log
    assert "stopped" in log


async def test_process_refuses_unusable_settings(tmp_path: Path) -> None:
    status, err = await _run("--namespace", NAMESPACE)
    assert status == 2 and "error: --cert and --key" in err
    status, err = await _run("--cert", "a", "--key", "b")
    assert status == 2 and "--namespace" in err
    status, err = await _run("--cert", "a", "--key", "b", "--namespace", NAMESPACE, "--port", "x")
    assert status == 2 and "--port: 'x' is not a whole number" in err
    status, err = await _run("--cert", "a", "--key", "b", "--namespace", NAMESPACE)
    assert status == 2 and "error: cannot read the certificate or key" in err
    ca = trustme.CA()
    _issue(ca, tmp_path)
    status, err = await _run(
        "--cert", str(tmp_path / "tls.crt"),
        "--key", str(tmp_path / "tls.key"),
        "--namespace", NAMESPACE,
        "--enabled",
        "--kubeconfig", str(tmp_path / "missing-kubeconfig"),
    )  # fmt: skip
    assert status == 2 and "cannot load the Kubernetes client configuration" in err
    status, err = await _run(
        "--cert", str(tmp_path / "tls.crt"),
        "--key", str(tmp_path / "tls.key"),
        "--namespace", NAMESPACE,
        "--engine-image-map", "{not json",
    )  # fmt: skip
    assert status == 2 and "--engine-image-map" in err
