"""The evidence collector through aiohttp's test client: a node's report in, gauges out, and the
controller's app serving the route only when a token is configured. The reports are the ones
`tmi evidence` makes from the shared-GPU fixtures; one is posted by the CLI's own client."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest

from allocation_controller.app import create_app
from allocation_controller.config import ControllerSettings, settings_from_args
from allocation_controller.controller import Controller
from allocation_controller.evidence import (
    EVIDENCE_PATH,
    MAX_REPORT_BYTES,
    EvidenceBoard,
    add_evidence_routes,
)
from inference_policy.evidence import judge
from kits.controllerkit import MemoryKube
from localcluster.plane.metrics import parse_metrics
from policy_io.state import PolicySettings
from serving.app import READ_TIMEOUT
from tests.evidencekit import GIB, H200_UUID, MIG, SHARED, nvml_observation, owners, pods
from tmi_cli.evidence import post_report

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def report(directory: Any, node: str) -> dict[str, Any]:
    observation = nvml_observation(directory)
    return judge(observation, owners(directory, observation), pods(directory), node=node)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def client_for(
    board: EvidenceBoard, registry: CollectorRegistry
) -> TestClient[web.Request, web.Application]:
    app = web.Application(client_max_size=MAX_REPORT_BYTES)
    add_evidence_routes(app, board, TOKEN, registry)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def sample(text: str, name: str, **labels: str) -> float | None:
    """The first sample called `name` with all of `labels`; None when there is none."""
    for found in parse_metrics(text):
        if found.name == name and labels.items() <= dict(found.labels).items():
            return found.value
    return None


async def test_a_posted_report_becomes_gauges_by_pod_binding_and_gpu() -> None:
    registry, clock = CollectorRegistry(), Clock()
    board = EvidenceBoard(ttl=60, clock=clock)
    client = await client_for(board, registry)
    try:
        answer = await client.put(EVIDENCE_PATH, json=report(SHARED, "gpu-h200-0"), headers=AUTH)
        assert answer.status == 200
        assert (await answer.json())["status"] == "not-honoured"
        answer = await client.put(EVIDENCE_PATH, json=report(MIG, "gpu-h200-1"), headers=AUTH)
        assert answer.status == 200
        text = generate_latest(registry).decode()
        over = {"node": "gpu-h200-0", "pod": "tmi-memory-pressure-q7k2p", "gpu_uuid": H200_UUID}
        assert sample(text, "tmi_evidence_granted_bytes", **over) == 4 * GIB
        assert sample(text, "tmi_evidence_used_bytes", **over) == 5 * GIB
        assert sample(text, "tmi_evidence_overuse_bytes", **over) == GIB
        assert sample(text, "tmi_evidence_share_honoured", **over) == 0
        vllm = {"pod": "vllm-qwen7b-5d8f9c7b6-x2k4p", "binding": "h200-vram-share"}
        assert sample(text, "tmi_evidence_share_honoured", workload="qwen7b-chat", **vllm) == 1
        assert sample(text, "tmi_evidence_overuse_bytes", **vllm) == 0
        gpu = {"node": "gpu-h200-0", "gpu_uuid": H200_UUID}
        assert sample(text, "tmi_evidence_unaccounted_processes", **gpu) == 2
        assert sample(text, "tmi_evidence_gpu_pods", **gpu) == 4
        assert sample(text, "tmi_evidence_node_honoured", node="gpu-h200-0") == 0
        assert sample(text, "tmi_evidence_node_honoured", node="gpu-h200-1") == 1
        slice_ = {"node": "gpu-h200-1", "mig_instance": "7", "isolation": "mig"}
        assert sample(text, "tmi_evidence_granted_bytes", **slice_) == 16 * GIB
        assert sample(text, "tmi_evidence_reports_total", result="accepted") == 2

        # A node that stops reporting loses its series; the other keeps its own.
        clock.now += 45
        await client.put(EVIDENCE_PATH, json=report(MIG, "gpu-h200-1"), headers=AUTH)
        clock.now += 30
        text = generate_latest(registry).decode()
        assert sample(text, "tmi_evidence_node_honoured", node="gpu-h200-0") is None
        assert sample(text, "tmi_evidence_used_bytes", node="gpu-h200-0") is None
        assert sample(text, "tmi_evidence_report_age_seconds", node="gpu-h200-1") == 30
        listed = await (await client.get(EVIDENCE_PATH)).json()
        assert [n["node"] for n in listed] == ["gpu-h200-1"]
    finally:
        await client.close()


async def test_posts_without_the_token_or_not_reports_are_refused() -> None:
    registry = CollectorRegistry()
    board = EvidenceBoard()
    client = await client_for(board, registry)
    good = report(MIG, "gpu-h200-1")
    try:
        assert (await client.put(EVIDENCE_PATH, json=good)).status == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await client.put(EVIDENCE_PATH, json=good, headers=wrong)).status == 401
        bad = await client.put(EVIDENCE_PATH, data=b"{not json", headers=AUTH)
        assert bad.status == 400
        forged = dict(good, allocations=[{"pod": "x"}])
        answer = await client.put(EVIDENCE_PATH, json=forged, headers=AUTH)
        assert answer.status == 400 and "allocations[0]" in (await answer.json())["detail"]
        # A file-like body: aiohttp warns that sending megabytes of bytes at once blocks the loop.
        huge = io.BytesIO(b"[" + b"0," * (3 * 1024 * 1024) + b"0]")
        assert (await client.put(EVIDENCE_PATH, data=huge, headers=AUTH)).status == 413
        text = generate_latest(registry).decode()
        assert sample(text, "tmi_evidence_reports_total", result="refused") == 2
        assert "tmi_evidence_used_bytes{" not in text
    finally:
        await client.close()


async def test_the_cli_client_posts_to_the_collector() -> None:
    registry = CollectorRegistry()
    board = EvidenceBoard()
    client = await client_for(board, registry)
    try:
        url = str(client.make_url(EVIDENCE_PATH))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, post_report, url, TOKEN, report(SHARED, "gpu-h200-0"))
        assert [view.node for view, _ in board.current()] == ["gpu-h200-0"]
        from inference_policy.tools.detection import DetectionError

        with pytest.raises(DetectionError, match="cannot post"):
            await loop.run_in_executor(None, post_report, url, "wrong", report(MIG, "n"))
    finally:
        await client.close()


def settings(token: str = "") -> ControllerSettings:
    policy = PolicySettings(
        enabled=True, namespace="kamiwaza", owner_public_keys=(), cluster_binding_id="c"
    )
    return ControllerSettings(policy=policy, leader_elect=False, evidence_token=token)


async def test_the_controller_serves_evidence_only_with_a_token() -> None:
    with_token = Controller(MemoryKube("kamiwaza"), settings(TOKEN))
    client = TestClient(TestServer(create_app(with_token)))
    await client.start_server()
    try:
        body = json.dumps(report(MIG, "gpu-h200-1"))
        answer = await client.put(EVIDENCE_PATH, data=body, headers=AUTH)
        assert answer.status == 200
        text = await (await client.get("/metrics")).text()
        assert 'tmi_evidence_node_honoured{node="gpu-h200-1"} 1.0' in text
        assert "tmi_allocation_queue_depth" in text
    finally:
        await client.close()
    without = Controller(MemoryKube("kamiwaza"), settings())
    client = TestClient(TestServer(create_app(without)))
    await client.start_server()
    try:
        assert (await client.put(EVIDENCE_PATH, data=body, headers=AUTH)).status == 404
        assert "tmi_evidence" not in await (await client.get("/metrics")).text()
    finally:
        await client.close()


async def test_a_report_is_read_in_time_and_within_the_limit() -> None:
    # The controller's own app, so its body limit is the one under test too.
    app = create_app(Controller(MemoryKube("kamiwaza"), settings(TOKEN)))
    app[READ_TIMEOUT] = 0.5
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        # A body announced and never sent: 408 once the read timeout passes. (Its connection is
        # closed after the listener's linger, which `test_abusive_clients` measures.)
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(
            f"PUT {EVIDENCE_PATH} HTTP/1.1\r\nHost: collector\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408"), head
        assert b"Connection: close" in head
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        detail = orjson.loads(await asyncio.wait_for(reader.readexactly(length), 10))["detail"]
        assert detail == "the request body did not arrive within 0.5 seconds"
        writer.close()

        async def chunks() -> Any:
            # Without a Content-Length, so the limit is found while reading.
            for _ in range(MAX_REPORT_BYTES // (1024 * 1024)):
                yield b" " * (1024 * 1024)
            yield b"{}"

        for body in (io.BytesIO(b" " * MAX_REPORT_BYTES + b"{}"), chunks()):
            answer = await client.put(EVIDENCE_PATH, data=body, headers=AUTH)
            assert answer.status == 413
            assert await answer.json() == {
                "status": 413,
                "detail": f"a report is at most {MAX_REPORT_BYTES} bytes",
            }
    finally:
        await client.close()


def test_the_token_and_lifetime_come_from_the_environment() -> None:
    environ = {
        "TMI_NAMESPACE": "kamiwaza",
        "TMI_OWNER_PUBLIC_KEY": "k",
        "TMI_CLUSTER_BINDING_ID": "c",
        "TMI_EVIDENCE_TOKEN": TOKEN,
        "TMI_EVIDENCE_TTL_SECONDS": "120",
    }
    parsed = settings_from_args([], environ)
    assert parsed.evidence_token == TOKEN and parsed.evidence_ttl == 120
    assert TOKEN not in repr(parsed)
    assert settings_from_args([], {**environ, "TMI_EVIDENCE_TOKEN": ""}).evidence_token == ""
