"""The shared serving machinery on its own: probes, the entry point's exit statuses, the serving
loop with its signal and drain, and the certificate watch an app runs while it serves.

The servers' own tests run this code through their apps and processes; these pin down the
contract each of them relies on, without a server's settings or sources.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from pytest_aiohttp import AiohttpClient

from kits.polling import eventually
from policy_io.state import PolicySettings
from serving import process
from serving.kube import ClientConfigError
from serving.probes import add_probes
from serving.settings import ConfigError, ServingSettings
from serving.tls import CertificateError, CertificateReloader, reloading

log = logging.getLogger("serving-test")


@dataclass
class Phase:
    draining: bool = False
    missing: str | None = None


SETTINGS = ServingSettings(
    policy=PolicySettings(), host="127.0.0.1", port=0, shutdown_timeout=1.0, drain_seconds=2.0
)
PHASE = web.AppKey("phase", Phase)
REGISTRY = web.AppKey("registry", CollectorRegistry)


def _app(phase: Phase) -> web.Application:
    app = web.Application()
    app[PHASE] = phase
    app[REGISTRY] = CollectorRegistry()
    Counter("tmi_test_things", "Things.", registry=app[REGISTRY]).inc()

    def unready(app: web.Application) -> str | None:
        phase = app[PHASE]
        return "shutting down" if phase.draining else phase.missing

    add_probes(app, unready=unready, registry=lambda app: app[REGISTRY])
    return app


async def test_probes_answer_from_what_the_app_says_at_each_request(
    aiohttp_client: AiohttpClient,
) -> None:
    phase = Phase(missing="not read yet: ConfigMap p")
    client = await aiohttp_client(_app(phase))
    resp = await client.get("/healthz")
    assert (resp.status, await resp.text()) == (200, "ok\n")
    resp = await client.get("/readyz")
    assert resp.status == 503 and resp.content_type == "application/json"
    assert await resp.json() == {"status": 503, "detail": "not read yet: ConfigMap p"}
    phase.missing = None
    resp = await client.get("/readyz")
    assert (resp.status, await resp.text()) == (200, "ok\n")
    resp = await client.get("/metrics")
    assert resp.status == 200 and resp.content_type == "text/plain"
    assert "tmi_test_things_total 1.0" in await resp.text()


def _settings(argv: Sequence[str] | None) -> ServingSettings:
    if argv:
        raise ConfigError(f"{argv[0]}: refused")
    return SETTINGS


@pytest.mark.parametrize(
    ("argv", "problem", "message"),
    [
        (["--port"], None, "error: --port: refused\n"),
        ([], CertificateError("cannot read the certificate or key"), "error: cannot read the"),
        ([], ClientConfigError("cannot load the Kubernetes client"), "error: cannot load the"),
    ],
)
def test_an_unusable_start_exits_2_with_the_reason(
    argv: list[str],
    problem: Exception | None,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def prepare(settings: ServingSettings) -> Any:
        assert problem is not None
        raise problem

    assert process.main(argv, _settings, prepare) == process.EXIT_UNUSABLE
    assert capsys.readouterr().err.startswith(message)


def test_a_clean_run_exits_0() -> None:
    ran: list[str] = []

    async def serve(settings: ServingSettings) -> None:
        ran.append(type(asyncio.get_running_loop()).__module__)

    assert process.main([], _settings, serve) == 0
    assert ran == ["uvloop"]


async def test_serve_listens_until_told_and_then_closes() -> None:
    ports: list[int] = []

    async def until(stop: asyncio.Event) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{ports[0]}/healthz") as resp,
        ):
            assert resp.status == 200

    await process.serve(
        _app(Phase()),
        "127.0.0.1",
        0,
        shutdown_timeout=1.0,
        started=lambda runner: ports.append(runner.addresses[0][1]),
        until=until,
    )
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", ports[0])


async def test_sigterm_drains_unready_then_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "serving-test")
    phase = Phase()
    ports: list[int] = []
    loop = asyncio.get_running_loop()

    def started(runner: web.AppRunner) -> None:
        ports.append(runner.addresses[0][1])
        # Runs once the serving loop waits, when its signal handlers are in place.
        loop.call_soon(os.kill, os.getpid(), signal.SIGTERM)

    task = asyncio.create_task(
        process.serve_draining(_app(phase), SETTINGS, phase, log, started=started)
    )
    # The unready window must outlast a loaded machine's delay before the client connects.
    await eventually(lambda: phase.draining, what="the server to start draining", timeout=5)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{ports[0]}/readyz") as resp:
            assert resp.status == 503
            assert await resp.json() == {"status": 503, "detail": "shutting down"}
        async with session.get(f"http://127.0.0.1:{ports[0]}/healthz") as resp:
            assert resp.status == 200
    await asyncio.wait_for(task, 5)
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["stopping: unready for 2.0s, then draining", "stopped"]


def _issue(ca: trustme.CA, cert: Path, key: Path) -> int:
    leaf = ca.issue_cert("127.0.0.1")
    for path, data in (
        (key, leaf.private_key_pem.bytes()),
        (cert, b"".join(pem.bytes() for pem in leaf.cert_chain_pems)),
    ):
        path.with_suffix(".tmp").write_bytes(data)
        os.replace(path.with_suffix(".tmp"), path)
    return CertificateReloader(str(cert), str(key)).serial


async def test_the_certificate_is_watched_only_while_serving(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    _issue(ca, cert, key)
    results: list[str] = []
    reloader = CertificateReloader(str(cert), str(key), on_reload=results.append)
    async with reloading(reloader, 0.02):
        serial = _issue(ca, cert, key)
        await eventually(
            lambda: reloader.reloads, what="the new certificate to be loaded", timeout=2
        )
    assert (reloader.reloads, reloader.serial, results) == (1, serial, ["loaded"])
    _issue(ca, cert, key)
    # Time passes with no watch: five of the intervals a watch would have checked in.
    await asyncio.sleep(0.1)
    assert reloader.reloads == 1
    async with reloading(reloader, 0):
        await asyncio.sleep(0.05)  # an interval of 0 watches nothing, however long it runs
    async with reloading(None, 0.02):
        pass
    assert reloader.reloads == 1


async def test_a_metrics_port_serves_metrics_alone_and_takes_them_off_the_serving_port() -> None:
    from serving.probes import json_response

    app = _app(Phase())

    async def business(_: web.Request) -> web.Response:
        return json_response({"ok": True})

    app.router.add_post("/mutate", business)
    metrics_port = _free_port()
    ports: list[int] = []
    seen: dict[str, int] = {}

    async def until(stop: asyncio.Event) -> None:
        serving = f"http://127.0.0.1:{ports[0]}"
        metrics = f"http://127.0.0.1:{metrics_port}"
        async with aiohttp.ClientSession() as session:
            for name, method, url in (
                ("serving /mutate", "POST", f"{serving}/mutate"),
                ("serving /metrics", "GET", f"{serving}/metrics"),
                ("serving /readyz", "GET", f"{serving}/readyz"),
                ("metrics /metrics", "GET", f"{metrics}/metrics"),
                ("metrics /healthz", "GET", f"{metrics}/healthz"),
                ("metrics /mutate", "POST", f"{metrics}/mutate"),
            ):
                async with session.request(method, url) as resp:
                    seen[name] = resp.status
                    if name == "metrics /metrics":
                        assert "tmi_test_things_total 1.0" in await resp.text()

    await process.serve(
        app,
        "127.0.0.1",
        0,
        shutdown_timeout=1.0,
        started=lambda runner: ports.append(runner.addresses[0][1]),
        until=until,
        metrics_port=metrics_port,
    )
    assert seen == {
        "serving /mutate": 200,
        "serving /metrics": 404,
        "serving /readyz": 200,
        "metrics /metrics": 200,
        "metrics /healthz": 200,
        "metrics /mutate": 404,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_metrics_port_is_a_setting_and_never_the_serving_port() -> None:
    from webhook.config import settings_from_args

    base = ["--namespace=kamiwaza", "--owner-public-key=" + "A" * 43 + "=", "--cert=c", "--key=k"]
    assert settings_from_args([*base]).metrics_port is None
    assert settings_from_args([*base, "--metrics-port=9090"]).metrics_port == 9090
    assert settings_from_args(base, {"TMI_METRICS_PORT": "9091"}).metrics_port == 9091
    with pytest.raises(ConfigError, match="already the serving or another port"):
        settings_from_args([*base, "--port=8443", "--metrics-port=8443"])


async def test_own_ports_serve_their_paths_alone() -> None:
    from serving.probes import json_response

    app = _app(Phase())

    async def answer(_: web.Request) -> web.Response:
        return json_response({"ok": True})

    app.router.add_post("/mutate", answer)
    app.router.add_post("/v1/plan", answer)
    plan_port, metrics_port = _free_port(), _free_port()
    ports: list[int] = []
    seen: dict[tuple[str, str], int] = {}

    async def until(stop: asyncio.Event) -> None:
        named = {"serving": ports[0], "plan": plan_port, "metrics": metrics_port}
        async with aiohttp.ClientSession() as session:
            for where, port in named.items():
                for method, path in (
                    ("POST", "/mutate"),
                    ("POST", "/v1/plan"),
                    ("GET", "/metrics"),
                    ("GET", "/readyz"),
                ):
                    url = f"http://127.0.0.1:{port}{path}"
                    async with session.request(method, url) as resp:
                        seen[(where, path)] = resp.status

    await process.serve(
        app,
        "127.0.0.1",
        0,
        shutdown_timeout=1.0,
        started=lambda runner: ports.append(runner.addresses[0][1]),
        until=until,
        metrics_port=metrics_port,
        own_ports={plan_port: (frozenset({"/v1/plan"}), None)},
    )
    assert seen == {
        ("serving", "/mutate"): 200,
        ("serving", "/v1/plan"): 404,
        ("serving", "/metrics"): 404,
        ("serving", "/readyz"): 200,
        ("plan", "/mutate"): 404,
        ("plan", "/v1/plan"): 200,
        ("plan", "/metrics"): 404,
        ("plan", "/readyz"): 200,
        ("metrics", "/mutate"): 404,
        ("metrics", "/v1/plan"): 404,
        ("metrics", "/metrics"): 200,
        ("metrics", "/readyz"): 200,
    }


def test_the_plan_port_is_a_webhook_setting_of_its_own() -> None:
    from webhook.config import settings_from_args

    base = ["--namespace=kamiwaza", "--owner-public-key=" + "A" * 43 + "=", "--cert=c", "--key=k"]
    assert settings_from_args(base).plan_port is None
    assert settings_from_args([*base, "--plan-port=8444"]).plan_port == 8444
    with pytest.raises(ConfigError, match="already the serving or another port"):
        settings_from_args([*base, "--metrics-port=9090", "--plan-port=9090"])
