"""Benchmark of the admission webhook against an aiohttp server that answers a constant review.

Both servers run in their own process on uvloop, behind the same TLS setup, and are driven by the
same aiohttp client (keep-alive connections, as the API server keeps them) from this process;
with at least two CPUs, the servers and the client are pinned to different ones. Each gets:

* throughput: a fixed number of reviews at a fixed concurrency, as fast as they are answered,
  in rounds that alternate between the servers (a neighbour's load on a shared machine then
  hits both alike); the median round is reported, with the server's CPU time per review, which
  noise on a shared machine disturbs far less than wall-clock rates;
* latency: reviews sent open-loop at a fixed rate (1,000/s), p50/p99 of the time each took.

The review is an engine Pod planned onto a GPU binding (a JSON Patch comes back), the most
expensive path, in two workloads: `same-deployment`, reviews that differ only in their uid, as
the Pods of one ReplicaSet arrive; and `distinct-deployments`, every review a request no other
carries, so nothing the webhook memoises helps. The constant server reads the body and returns
the webhook's own answer, prepared once: the ratio is what admission costs over HTTP and TLS.

    .venv/bin/python bench/bench_webhook.py [--requests 20000] [--concurrency 32] [--rate 1000]

Writes bench/results/webhook.json. It measures and compares with the targets; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import json
import os
import platform
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

import aiohttp  # noqa: E402
import orjson  # noqa: E402
import uvloop  # noqa: E402
from aiohttp import web  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "webhook.json"
# The admission targets: server CPU per review, throughput against the constant server, and p99
# at 1,000 reviews a second.
TARGET_CPU_US = 100.0
TARGET_P99_MS = 1.0
TARGET_RATIO = 0.65


# -- the two servers ---------------------------------------------------------------------------


UID = "b3f1c2d4-0000-4000-8000-000000000001"


def _review_body(index: int | None = None, distinct: bool = False) -> bytes:
    """The benchmark review, with its own uid per index as the API server sends it; with
    `distinct`, also a deployment request that no other index shares."""
    from kits.profilekit import request
    from kits.webhookkit import engine_pod, review

    if distinct and index is not None:
        body = request(model__weightsBytes=4_000_000_000 + index)
    else:
        body = request()
    uid = UID if index is None else f"b3f1c2d4-0000-4000-8000-{index:012d}"
    return orjson.dumps(review(engine_pod(body), uid=uid))


def _our_app() -> web.Application:
    from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
    from kits.memory_sources import WebhookMemorySource as MemorySource
    from kits.profilekit import NOW, Owner
    from kits.webhookkit import published
    from webhook.app import create_app
    from webhook.profile_source import PolicyStore

    owner = Owner()
    settings = owner.settings(gpu_registry_credentials_secret="kamiwaza-pull")
    source = MemorySource({DEFAULT_CONFIGMAP_NAME: published(owner.sign())})
    store = PolicyStore(settings, clock=lambda: NOW)
    return create_app(settings, source, store=store, clock=lambda: NOW)


def _constant_app() -> web.Application:
    # Exactly the bytes our webhook answers the benchmark review with, computed once.
    from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
    from kits.profilekit import NOW, Owner
    from kits.webhookkit import published
    from webhook.admission import Reviewer, envelope
    from webhook.profile_source import PolicyStore

    owner = Owner()
    store = PolicyStore(owner.settings(gpu_registry_credentials_secret="kamiwaza-pull"))
    store.feed.read(DEFAULT_CONFIGMAP_NAME, published(owner.sign()))
    request = orjson.loads(_review_body())["request"]
    body = orjson.dumps(envelope(Reviewer(store).review(request, request["uid"], NOW)))

    async def mutate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/mutate", mutate)
    return app


def serve(kind: str, cert: str, key: str, cpu: int | None) -> None:
    """Child process: run one server until stdin closes; print its port when listening."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})

    async def run() -> None:
        # Logging as the webhook process sets it up, so its cost is part of the figure.
        from serving import logs

        logs.install("INFO")
        app = _our_app() if kind == "webhook" else _constant_app()
        context = None
        if cert:
            from serving.tls import CertificateReloader

            context = CertificateReloader(cert, key).context
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context, backlog=1024)
        await site.start()
        gc.freeze()  # as the webhook process does once it listens
        sys.stdout.write(f"{runner.addresses[0][1]}\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    uvloop.run(run())


# -- the client --------------------------------------------------------------------------------


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def q(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1000, 3)

    return {
        "p50_ms": q(0.50),
        "p90_ms": q(0.90),
        "p99_ms": q(0.99),
        "p999_ms": q(0.999),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> bool:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        data = await resp.read()
        if resp.status != 200 or b'"allowed":true' not in data:
            return False
        # The webhook's answer must carry this review's uid; the constant server's cannot.
        if "constant" in url:
            return True
        start = body.index(b'"uid":"') + 7
        return b'"uid":"' + body[start : body.index(b'"', start)] + b'"' in data


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process: robust where wall-clock rates are not."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    url: str, bodies: list[bytes], requests: int, concurrency: int, tls: Any, pid: int
) -> Any:
    connector = aiohttp.TCPConnector(ssl=tls, limit=concurrency)
    errors = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        for index in range(min(500, requests)):  # warm-up: connections, code paths
            await _post(session, url, bodies[-1 - index % len(bodies)])
        queue = iter(range(requests))

        async def worker() -> None:
            nonlocal errors
            for index in queue:
                if not await _post(session, url, bodies[index % len(bodies)]):
                    errors += 1

        cpu = _cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = _cpu_seconds(pid) - cpu
    return {
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "reviews_per_second": round(requests / elapsed, 1),
        "server_cpu_us_per_review": round(cpu / requests * 1e6, 1),
        "errors": errors,
    }


async def at_rate(url: str, bodies: list[bytes], requests: int, rate: float, tls: Any) -> Any:
    connector = aiohttp.TCPConnector(ssl=tls, limit=256)
    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        for index in range(min(500, requests)):
            await _post(session, url, bodies[-1 - index % len(bodies)])

        async def one(body: bytes) -> None:
            nonlocal errors
            started = time.perf_counter()
            ok = await _post(session, url, body)
            latencies.append(time.perf_counter() - started)
            errors += not ok

        loop = asyncio.get_running_loop()
        tasks = []
        begin = loop.time()
        for index in range(requests):
            delay = begin + index / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(bodies[index % len(bodies)])))
        await asyncio.gather(*tasks)
        elapsed = loop.time() - begin
    return {
        "requests": requests,
        "target_rate": rate,
        "achieved_rate": round(requests / elapsed, 1),
        "errors": errors,
        **_quantiles(latencies),
    }


def _start(kind: str, cert: str, key: str, cpu: int | None) -> tuple[subprocess.Popen[str], int]:
    args = [sys.executable, __file__, "--serve", kind, "--cert", cert, "--key", key]
    if cpu is not None:
        args += ["--cpu", str(cpu)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, port


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0] if len(cpus) > 1 else None
    if server_cpu is not None:
        os.sched_setaffinity(0, set(cpus[1:]))
    body = _review_body()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cert = key = ""
        tls: Any = None
        if args.tls:
            import trustme

            ca = trustme.CA()
            leaf = ca.issue_cert("127.0.0.1")
            cert, key = f"{tmp}/tls.crt", f"{tmp}/tls.key"
            leaf.private_key_pem.write_to_path(key)
            leaf.cert_chain_pems[0].write_to_path(cert)
            tls = ssl.create_default_context()
            ca.configure_trust(tls)
        count = max(args.requests, args.rate_requests) + 1000
        same = [_review_body(i) for i in range(count)]
        distinct = [_review_body(i, distinct=True) for i in range(count)]
        runs = (
            ("webhook", "same-deployment", same),
            ("webhook", "distinct-deployments", distinct),
            ("constant", "same-deployment", same),
        )
        scheme = "https" if args.tls else "http"
        procs = {}
        urls = {}
        for kind in ("webhook", "constant"):
            procs[kind], port = _start(kind, cert, key, server_cpu)
            urls[kind] = f"{scheme}://127.0.0.1:{port}/mutate?timeout=5s&server={kind}"
        gc.collect()
        gc.freeze()  # keep the client's collector out of what it measures
        try:
            # Rounds interleave the servers, so a neighbour's load on a shared machine hits
            # both alike; the median round is reported, and every round is kept.
            rounds: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for round_ in range(args.rounds):
                for kind, workload, bodies in runs:
                    rounds.setdefault((kind, workload), []).append(
                        await throughput(
                            urls[kind],
                            bodies,
                            args.requests,
                            args.concurrency,
                            tls,
                            procs[kind].pid,
                        )
                    )
                # The rounds so far, kept should the run be stopped; the summary replaces them.
                partial = {f"{k} {w}": measured for (k, w), measured in rounds.items()}
                args.output.parent.mkdir(parents=True, exist_ok=True)
                args.output.write_text(
                    json.dumps({"partial_rounds": round_ + 1, "rounds": partial}, indent=2) + "\n"
                )
            for kind, workload, bodies in runs:
                measured = rounds[(kind, workload)]
                median = sorted(measured, key=lambda r: r["reviews_per_second"])[len(measured) // 2]
                results.setdefault(kind, {})[workload] = {
                    "throughput": median,
                    "throughput_rounds": [r["reviews_per_second"] for r in measured],
                    "server_cpu_us_per_review_rounds": [
                        r["server_cpu_us_per_review"] for r in measured
                    ],
                    "latency_at_rate": await at_rate(
                        urls[kind], bodies, args.rate_requests, args.rate, tls
                    ),
                }
        finally:
            gc.unfreeze()
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(10)
    constant = results["constant"]["same-deployment"]
    base = constant["throughput"]["reviews_per_second"]
    targets: dict[str, Any] = {
        "server_cpu_us_per_review": TARGET_CPU_US,
        "p99_ms_at_rate": TARGET_P99_MS,
        "throughput_ratio": TARGET_RATIO,
    }
    base_cpu = min(constant["server_cpu_us_per_review_rounds"])
    for workload, run in results["webhook"].items():
        ratio = run["throughput"]["reviews_per_second"] / base
        run["throughput_ratio"] = round(ratio, 3)
        # The same comparison in server CPU per review (best rounds): what the throughput
        # ratio would be on an otherwise idle machine.
        run["cpu_ratio"] = round(base_cpu / min(run["server_cpu_us_per_review_rounds"]), 3)
        targets[workload] = {
            "cpu_met": run["throughput"]["server_cpu_us_per_review"] <= TARGET_CPU_US,
            "p99_met": run["latency_at_rate"]["p99_ms"] <= TARGET_P99_MS,
            "ratio_met": ratio >= TARGET_RATIO,
        }
    return {
        "benchmark": "admission webhook vs constant-answer aiohttp server",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": len(cpus),
            "server_pinned_to_cpu": server_cpu,
            "python": platform.python_version(),
            "aiohttp": aiohttp.__version__,
            "uvloop": importlib.metadata.version("uvloop"),
        },
        "transport": "https (TLS, keep-alive)" if args.tls else "http (keep-alive)",
        "review": "engine Pod CREATE planned onto a GPU binding (JSON Patch returned)",
        "workloads": {
            "same-deployment": "reviews differ only in uid: the Pods of one ReplicaSet",
            "distinct-deployments": "every review carries a request no other review has",
        },
        "review_bytes": len(body),
        "webhook": results["webhook"],
        "constant": results["constant"],
        "targets": targets,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20000, help="throughput reviews")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=float, default=1000.0, help="reviews per second")
    parser.add_argument("--rate-requests", type=int, default=20000, help="reviews at the rate")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds per server")
    parser.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--serve", choices=("webhook", "constant"), help=argparse.SUPPRESS)
    parser.add_argument("--cert", default="", help=argparse.SUPPRESS)
    parser.add_argument("--key", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.cert, args.key, args.cpu)
        return
    summary = uvloop.run(measure(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
