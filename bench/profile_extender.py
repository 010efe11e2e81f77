"""Where the extender's time per Pod goes, on the scheduling benchmark's own fleet and Pods: the
profile behind its gap to the constant extender (`bench_scheduling.py`).

The real app (`extender.app.create_app`) is fed from memory with `bench_scheduling`'s 130 nodes
and profile, and asked, over aiohttp's test client, what kube-scheduler asks it each cycle:
/filter then /prioritize for one Pod, with every node named, for each of its 800 engine Pods
(distinct Pods, each its own uid and resourceVersion, as a run's are). The same is asked of the
constant extender (`bench/constant_extender.py`). cProfile times the server side; the figures
are CPU seconds of this one process (client and server together, so the constant extender's
run is the floor of the harness and HTTP alike), and the report groups the extender's own
functions into the steps of a Pod's cycle.

This is a diagnostic, not a benchmark figure (cProfile slows every Python call, about 2x here):
the shares are what it is for. Run: `.venv/bin/python bench/profile_extender.py`. Writes
bench/results/extender_profile.json.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

import orjson  # noqa: E402
from aiohttp import web  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402
from bench_scheduling import _pods, fleet  # noqa: E402
from constant_extender import make_app  # noqa: E402
from scheduling_run import PROFILE_CONFIGMAP  # noqa: E402

from extender.app import create_app  # noqa: E402
from kits.extenderkit import fleet_envelope, published  # noqa: E402
from kits.memory_sources import ExtenderMemorySource  # noqa: E402
from kits.profilekit import NAMESPACE, Owner  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "extender_profile.json"
WARMUP = 50
# The steps of one Pod's cycle, by the function that does each (cumulative time).
STEPS = {
    "grant check (plan re-derived, Pod held to it)": ("grant.py", "check_grant"),
    "plan re-derivation alone": ("grant.py", "_rederive"),
    "filter verdicts over the nodes": ("verbs.py", "filter_nodes"),
    "prioritize scores over the nodes": ("verbs.py", "prioritize_nodes"),
    "ExtenderArgs decode": ("app.py", "_args"),
    "decision log line": ("app.py", "_log_filter"),
    "aiohttp request handling (server)": ("web_protocol.py", "_handle_request"),
}


def _bodies(owner: Owner) -> list[bytes]:
    envelope = fleet_envelope(owner)
    names = [node.name for node in fleet()]
    bodies = []
    for pod in _pods(owner, envelope, "p", NAMESPACE):
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["metadata"]["resourceVersion"] = "1"
        bodies.append(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))
    return bodies


async def _profile(app: web.Application, bodies: list[bytes]) -> tuple[float, pstats.Stats]:
    async with TestClient(TestServer(app)) as client:
        for body in bodies[:WARMUP]:
            for verb in ("filter", "prioritize"):
                await (await client.post(f"/{verb}", data=body)).read()
        profile = cProfile.Profile()
        start = time.process_time()
        profile.enable()
        for body in bodies[WARMUP:]:
            for verb in ("filter", "prioritize"):
                response = await client.post(f"/{verb}", data=body)
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"/{verb} answered {response.status}")
        profile.disable()
        spent = time.process_time() - start
    return spent / (len(bodies) - WARMUP) * 1000, pstats.Stats(profile)


def _cumulative(stats: pstats.Stats, file: str, function: str) -> float:
    total = 0.0
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (path, _line, name), (_cc, _nc, _tt, cumulative, _callers) in table.items():
        if path.endswith("/" + file) and name == function:
            total += cumulative
    return total


def main() -> None:
    owner = Owner()
    bodies = _bodies(owner)
    pods = len(bodies) - WARMUP
    envelope = fleet_envelope(owner)
    source = ExtenderMemorySource(
        [node.manifest() for node in fleet()],
        [],
        published(owner.sign(envelope, name=PROFILE_CONFIGMAP)),
    )
    tmi_ms, stats = asyncio.run(_profile(create_app(owner.settings(), source), bodies))
    constant_ms, constant_stats = asyncio.run(_profile(make_app(), bodies))
    steps = {
        label: round(_cumulative(stats, file, function) / pods * 1000, 3)
        for label, (file, function) in STEPS.items()
    }
    constant_server = _cumulative(constant_stats, "web_protocol.py", "_handle_request")
    results = {
        "pods": pods,
        "nodes": len(fleet()),
        "cpu_ms_per_pod_profiled": {"tmi": round(tmi_ms, 3), "constant": round(constant_ms, 3)},
        "tmi_steps_ms_per_pod_profiled": steps,
        "constant_server_ms_per_pod_profiled": round(constant_server / pods * 1000, 3),
        "note": "cProfile inflates each Python call; compare shares, not absolute figures",
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
