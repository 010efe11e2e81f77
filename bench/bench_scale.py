"""The extender at 15,000 nodes with 150,000 engine Pods in its ledger: filter and prioritize
latency, its memory, and how long it takes to be ready after a restart.

The server is the real app (uvloop, orjson) in a child process, fed from memory
(`bench_extender.py`'s fleet, scaled): each GPU node holds two bound GPU engine Pods and the
rest of its ten are CPU engine Pods, each CPU node ten CPU engine Pods, so the ledger holds ten
Pods per node. Calls are one at a time, as kube-scheduler makes them, in two sizes: the names
kube-scheduler sends by default (the headline figure and the target's), and every node's name
(the worst case, `percentageOfNodesToScore: 100`, for information). By default kube-scheduler
stops filtering once it has found a share of the nodes feasible and sends the extender those:
v1.36's adaptive share is `50 - nodes/125` percent, at least 5%, and at least 100 nodes
(`numFeasibleNodesToFind`, pkg/scheduler/schedule_one.go), so 750 of 15,000
(`default_names_sent`).

Ready after a restart: the child receives the Pods as the API server's list answer would carry
them (pages of 500 JSON documents), then decodes each page and keeps each Pod's `holding_part`
as the informer does, and builds the view from them, timed from the first decode to the view
being ready. The API server's own time to answer the list is not in it (a 150,000-Pod etcd is
beyond this machine).

Memory: the child's RSS once ready and again after the calls, with the list's pages dropped,
as the extender's own figure (the bench's fixtures are built before and released). Beside it,
the allocation controller's Pod store after the same list (it keeps whole engine Pods, less
managedFields) in a child of its own; the webhook watches ConfigMaps only, so 150,000 Pods do
not reach its memory.

Run: `.venv/bin/python bench/bench_scale.py [--nodes N] [--pods-per-node K]`. Writes
bench/results/scale.json once the extender's figures are in and again with the controller's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import platform
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path
sys.path.append(str(ROOT / "bench"))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from bench_extender import _free_port, _plans, _summary, fleet  # noqa: E402

from kits.extenderkit import (  # noqa: E402
    bound,
    fleet_envelope,
    plan_for,
    planned_pod,
    published,
    request,
)
from kits.profilekit import Owner  # noqa: E402

NODES = 15_000
PODS_PER_NODE = 10
PAGE = 500  # the informer's list page size
ROUNDS = 300
WARMUP = 20
TARGETS = {"filter_p99_ms": 10.0, "ready_s": 30.0, "rss_mib": 1024.0}
RESULTS = ROOT / "bench" / "results" / "scale.json"


def default_names_sent(nodes: int) -> int:
    """How many feasible nodes kube-scheduler v1.36 looks for (and sends the extender) with
    `percentageOfNodesToScore` unset: 50% less one point per 125 nodes, never under 5%, and
    never under 100 nodes (all of them below that)."""
    if nodes < 100:
        return nodes
    percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


def _pods(owner: Owner, size: int, per_node: int) -> list[dict[str, Any]]:
    envelope = fleet_envelope(owner)
    plans = _plans(owner, envelope)
    cpu = plan_for(owner, envelope, request())
    pods: list[dict[str, Any]] = []
    for spec in fleet(size):
        gpu = spec.gpus > 0 and spec.arch == "amd64" and spec.compute_capability != "7.5"
        kind = "share" if spec.vram_budget else "mig" if spec.mig else "whole"
        for i in range(per_node):
            plan = plans[kind] if gpu and i < 2 else cpu
            pods.append(bound(planned_pod(plan), spec.name))
    return pods


def _serve(port: int, owner_key: bytes, size: int, per_node: int, out: Any, ready: Any) -> None:
    """Child process: the real app on 127.0.0.1:port, plain HTTP, uvloop."""
    import uvloop
    from aiohttp import web
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from extender.app import create_app
    from extender.view import ClusterView
    from inference_policy.placing.ledger import holding_part
    from kits.memory_sources import ExtenderMemorySource as MemorySource

    key = load_pem_private_key(owner_key, None)
    owner = Owner(key)  # type: ignore[arg-type]
    envelope = fleet_envelope(owner)
    nodes = [n.manifest() for n in fleet(size)]
    pods = _pods(owner, size, per_node)
    answer = {
        "pages": [
            orjson.dumps({"kind": "PodList", "items": pods[i : i + PAGE]})
            for i in range(0, len(pods), PAGE)
        ]
    }
    del pods
    gc.collect()

    async def main() -> None:
        pages = answer.pop("pages")
        listed = sum(len(page) for page in pages)
        started = time.perf_counter()
        # As the informer lists (`serving.informer.list_all`): page by page, each Pod kept as
        # its holding_part as its page arrives.
        kept = [holding_part(pod) for page in pages for pod in orjson.loads(page)["items"]]
        del pages
        source = MemorySource(nodes, kept, published(owner.sign(envelope)))
        del kept
        app = create_app(owner.settings(), source)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        view = source.view
        assert isinstance(view, ClusterView) and view.ready, "the view is not ready"
        ready_s = time.perf_counter() - started
        await web.TCPSite(runner, "127.0.0.1", port).start()
        out["ready_s"] = round(ready_s, 2)
        out["accounted_pods"] = len(view.ledger)
        out["list_bytes"] = listed
        gc.collect()
        ready.set()
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop_runner:
        loop_runner.run(main())


async def _measure(port: int, owner: Owner, size: int) -> dict[str, Any]:
    envelope = fleet_envelope(owner)
    plans = _plans(owner, envelope)
    names = [n.name for n in fleet(size)]
    default = default_names_sent(len(names))
    step = max(1, len(names) // default)
    sent = {"default": names[::step][:default], "all": names}
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for label, chosen in sent.items():
            bodies = [
                orjson.dumps({"Pod": planned_pod(plan), "Nodes": None, "NodeNames": chosen})
                for plan in plans.values()
            ]
            for verb in ("filter", "prioritize"):
                samples: list[float] = []
                for i in range(WARMUP + ROUNDS):
                    start = time.perf_counter()
                    async with session.post(f"{url}/{verb}", data=bodies[i % len(bodies)]) as r:
                        await r.read()
                        assert r.status == 200
                    if i >= WARMUP:
                        samples.append((time.perf_counter() - start) * 1000)
                out[f"{verb}_{label}_names"] = {"rounds": ROUNDS, **_summary(samples)}
    return out


def _controller_store(owner_key: bytes, size: int, per_node: int, out: Any) -> None:
    """Child process: the allocation controller's Pod store after its list (it keeps whole
    engine Pods, less managedFields), decoded page by page as its informer lists: what the
    store holds once the pages are dropped."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from serving.informer import _trim

    key = load_pem_private_key(owner_key, None)
    owner = Owner(key)  # type: ignore[arg-type]
    pods = _pods(owner, size, per_node)
    pages = [orjson.dumps({"items": pods[i : i + PAGE]}) for i in range(0, len(pods), PAGE)]
    del pods
    gc.collect()
    # Traced allocations, not RSS: the fixtures built and freed above leave arenas the RSS
    # would count.
    tracemalloc.start()
    store: dict[str, Any] = {}
    for page in pages:
        for pod in orjson.loads(page)["items"]:
            _trim(pod)
            store[pod["metadata"]["name"]] = pod
    del pages
    gc.collect()
    out["controller_store_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
    tracemalloc.stop()
    out["controller_pods"] = len(store)


def _child_rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def meets(figures: dict[str, Any]) -> dict[str, bool]:
    """Each target against this run's figures: the p99 target for both verbs with the names
    kube-scheduler sends by default (every node named is information, not a target)."""
    limit = TARGETS["filter_p99_ms"]
    return {
        f"{verb}_p99_ms_default_names": figures[f"{verb}_default_names"]["p99_ms"] <= limit
        for verb in ("filter", "prioritize")
    } | {
        "ready_s": figures["ready_s"] <= TARGETS["ready_s"],
        "rss_mib": figures["rss_mib_after_calls"] <= TARGETS["rss_mib"],
    }


def main() -> None:
    from cryptography.hazmat.primitives import serialization

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--pods-per-node", type=int, default=PODS_PER_NODE)
    args = parser.parse_args()
    owner = Owner()
    pem = owner.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    shared = manager.dict()
    ready = ctx.Event()
    port = _free_port()
    server = ctx.Process(
        target=_serve, args=(port, pem, args.nodes, args.pods_per_node, shared, ready), daemon=True
    )
    server.start()
    try:
        if not ready.wait(900):
            raise RuntimeError("the extender did not start")
        assert server.pid is not None
        rss_ready = _child_rss(server.pid)
        calls = asyncio.run(_measure(port, owner, args.nodes))
        rss_after = _child_rss(server.pid)
    finally:
        server.terminate()
        server.join(10)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {multiprocessing.cpu_count()} CPUs",
        "python": platform.python_version(),
        "cpus": multiprocessing.cpu_count(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "nodes": args.nodes,
        "pods_per_node": args.pods_per_node,
        "default_names_sent": default_names_sent(args.nodes),
        "targets": TARGETS,
        "ready_s": shared["ready_s"],
        "accounted_pods": shared["accounted_pods"],
        "list_bytes": shared["list_bytes"],
        # The child also holds the node manifests the source was given: an upper bound on the
        # extender's own.
        "rss_mib_ready": rss_ready,
        "rss_mib_after_calls": rss_after,
        **calls,
    }
    results["meets"] = meets(results)
    _write(results)
    measured = ctx.Process(
        target=_controller_store, args=(pem, args.nodes, args.pods_per_node, shared)
    )
    measured.start()
    measured.join(900)
    # The controller keeps whole engine Pods; the webhook watches ConfigMaps only, so its
    # memory does not grow with the Pods.
    results["controller_pods"] = shared["controller_pods"]
    results["controller_store_mib"] = shared["controller_store_mib"]
    _write(results)
    print(RESULTS.read_text())


def _write(results: dict[str, Any]) -> None:
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
