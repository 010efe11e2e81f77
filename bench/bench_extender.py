"""Latency of the extender's /filter and /prioritize over HTTP on loopback, in node-cache mode.

The server is the real app (uvloop, orjson) in a child process, fed from memory with a mixed
fleet (whole-GPU H100 nodes, A100 nodes in MIG mixed mode, L40S nodes with the VRAM plugin, CPU
nodes, a few arm64 and T4 nodes that every GPU binding refuses) and two bound engine Pods per
GPU node. The client sends one call at a time, as kube-scheduler does, with every node name in
the body: the worst case (kube-scheduler usually sends only the feasible nodes it found, at most
a few hundred by default on a large cluster).

Run: `.venv/bin/python bench/bench_extender.py`. Writes bench/results/extender.json.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from kits.extenderkit import (  # noqa: E402
    block,
    bound,
    fleet_envelope,
    plan_for,
    planned_pod,
    published,
    request,
)
from kits.fleetkit import a100_mig, cpu_only, gh200, h100, l40s, t4  # noqa: E402
from kits.profilekit import Owner  # noqa: E402
from localcluster.nodes.kwok import FakeNode  # noqa: E402

SIZES = (500, 5000)
ROUNDS = 400
WARMUP = 30
TARGET_P99_MS = 25.0


def fleet(size: int) -> list[FakeNode]:
    """A deterministic mixed fleet of `size` nodes."""
    nodes: list[FakeNode] = []
    for i in range(size):
        kind = i % 10
        name = f"node-{i:05d}"
        if kind in (0, 1, 2, 3):
            nodes.append(h100(name, gpus=8 if kind < 2 else 4))
        elif kind in (4, 5):
            nodes.append(a100_mig(name, gpus=4, slices=8))
        elif kind in (6, 7):
            nodes.append(l40s(name))
        elif kind == 8:
            nodes.append(cpu_only(name))
        else:
            nodes.append(gh200(name) if i % 20 == 9 else t4(name))
    return nodes


def _serve(port: int, owner_key: bytes, size: int, ready: Any) -> None:
    """Child process: the real app on 127.0.0.1:port, plain HTTP, uvloop."""
    import uvloop
    from aiohttp import web
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from extender.app import create_app
    from kits.memory_sources import ExtenderMemorySource as MemorySource

    key = load_pem_private_key(owner_key, None)
    owner = Owner(key)  # type: ignore[arg-type]
    envelope = fleet_envelope(owner)
    plans = _plans(owner, envelope)
    nodes = fleet(size)
    pods = []
    for spec in nodes:
        if spec.gpus <= 0 or spec.arch != "amd64" or spec.compute_capability == "7.5":
            continue
        kind = "share" if spec.vram_budget else "mig" if spec.mig else "whole"
        pods += [bound(planned_pod(plans[kind]), spec.name) for _ in range(2)]
    source = MemorySource([n.manifest() for n in nodes], pods, published(owner.sign(envelope)))
    app = create_app(owner.settings(), source)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop_runner:
        loop_runner.run(main())


def _plans(owner: Owner, envelope: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "whole": plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole"))),
        "mig": plan_for(owner, envelope, request(inferenceResources=block("nvidia-mig-3g40gb"))),
        "share": plan_for(owner, envelope, request(inferenceResources=block("nvidia-vram-share"))),
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


async def _measure(port: int, owner: Owner, size: int) -> dict[str, Any]:
    envelope = fleet_envelope(owner)
    plans = _plans(owner, envelope)
    names = [n.name for n in fleet(size)]
    bodies = {
        kind: orjson.dumps({"Pod": planned_pod(plan), "Nodes": None, "NodeNames": names})
        for kind, plan in plans.items()
    }
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"nodes": size, "body_bytes": len(bodies["whole"])}
    async with aiohttp.ClientSession() as session:
        cold: dict[str, float] = {}
        for kind, body in bodies.items():
            start = time.perf_counter()
            async with session.post(f"{url}/filter", data=body) as resp:
                result = await resp.json()
            cold[kind] = round((time.perf_counter() - start) * 1000, 2)
            out[f"{kind}_passing_nodes"] = len(result["NodeNames"])
        out["filter_first_call_ms"] = cold
        for verb in ("filter", "prioritize"):
            samples: list[float] = []
            kinds = list(bodies)
            for i in range(WARMUP + ROUNDS):
                body = bodies[kinds[i % len(kinds)]]
                start = time.perf_counter()
                async with session.post(f"{url}/{verb}", data=body) as resp:
                    await resp.read()
                    assert resp.status == 200
                if i >= WARMUP:
                    samples.append((time.perf_counter() - start) * 1000)
            out[verb] = {"rounds": ROUNDS, **_summary(samples)}
    return out


def main() -> None:
    from cryptography.hazmat.primitives import serialization

    owner = Owner()
    pem = owner.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    results: dict[str, Any] = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": multiprocessing.cpu_count(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "mode": "node-cache (NodeNames), every node name in each call, one call at a time",
        "target_p99_ms_at_5000": TARGET_P99_MS,
        "runs": [],
    }
    out = ROOT / "bench" / "results" / "extender.json"
    out.parent.mkdir(exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    for size in SIZES:
        port = _free_port()
        ready = ctx.Event()
        server = ctx.Process(target=_serve, args=(port, pem, size, ready), daemon=True)
        server.start()
        try:
            if not ready.wait(120):
                raise RuntimeError("the extender did not start")
            results["runs"].append(asyncio.run(_measure(port, owner, size)))
        finally:
            server.terminate()
            server.join(10)
        # Each size's figures are kept as soon as they are measured.
        results["load_average_1m"] = round(os.getloadavg()[0], 2)
        out.write_text(json.dumps(results, indent=2) + "\n")
    big = next(r for r in results["runs"] if r["nodes"] == 5000)
    results["meets_target"] = max(big["filter"]["p99_ms"], big["prioritize"]["p99_ms"]) <= (
        TARGET_P99_MS
    )
    text = json.dumps(results, indent=2)
    print(text)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
