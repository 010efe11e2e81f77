"""Soak: the webhook and the extender as real processes under steady load for nine minutes (ten
with `make soak`).

Why it exists: a leak (memory, file descriptors, asyncio tasks) or an error that shows once in
a hundred thousand calls is invisible to the tests and to a short benchmark. This runs both
servers the way a cluster runs them, `python -m webhook` / `python -m extender` entry points
with their flags, TLS on loopback and a kubeconfig, against a fake API server in this process
(`kits.fakeapi`, the API server's list and watch wire protocol) that holds the
signed profile, a fleet of GPU nodes and bound engine Pods. Each server runs inside a thin
wrapper (`--serve`) that only adds a sampler task reporting the server's own asyncio task count
once a second; everything else is the server's real `main`.

Load, open-loop at fixed rates: 200 AdmissionReviews/s (repeated reviews of one deployment
that differ only in their uid, distinct deployments no other review shares, and plain Pods
reaching for a GPU, which must be refused), plus filter and prioritize calls to the extender
in both wire modes. Every answer is checked (status 200, the review's uid echoed, allowed or
refused as expected, the filter's nodes as expected); anything else is an error.

Pass: zero errors; each server's RSS at most 100 MiB and flat (end within 8 MiB of the value
after warm-up); once the load stops and the client closes its connections, open file
descriptors and asyncio tasks back to their values before the load (plus a small allowance).
Each keep-alive connection holds a descriptor, a handler task and its buffers, so during the
load those follow the client's connection count (at most `CONNECTIONS`), which a latency spike
raises; only what is left after the connections close is a leak. Writes
bench/results/soak.json and exits 1 when a criterion fails.

    .venv/bin/python bench/soak.py [--seconds 540] [--rate 200] [--extender-rate 40]

540 s of load by default, so a run with its start and settling ends within ten minutes; `make
soak` gives 600. The calls and the checks of their answers are `soak_load.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

import aiohttp  # noqa: E402
import uvloop  # noqa: E402
from soak_load import Load, check_extender, check_review, paced, post  # noqa: E402
from soak_load import fixture as make_fixture  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "soak.json"
MAX_RSS_MIB = 100.0
FLAT_RSS_MIB = 8.0
FD_ALLOWANCE = 8
TASK_ALLOWANCE = 8
WARMUP_SECONDS = 60.0
CONNECTIONS = 32
SETTLE_SECONDS = 15.0
SAMPLE_SECONDS = 5.0


# -- the server wrapper (child process) -------------------------------------------------------


def serve(kind: str, stats: str, argv: list[str]) -> int:
    """Run the real server `main` with a sampler task beside it that writes the loop's task
    count to `stats` once a second (the count includes the sampler itself)."""
    from serving import process

    if kind == "webhook":
        from webhook import __main__ as server
        from webhook import config
    else:
        from extender import __main__ as server  # type: ignore[no-redef]
        from extender import config  # type: ignore[no-redef]

    async def sample() -> None:
        with open(stats, "a", encoding="utf-8") as out:
            while True:
                out.write(json.dumps({"t": time.time(), "tasks": len(asyncio.all_tasks())}) + "\n")
                out.flush()
                await asyncio.sleep(1.0)

    async def with_sampler(serving: Any) -> None:
        sampler = asyncio.create_task(sample())
        try:
            await serving
        finally:
            sampler.cancel()

    def prepare(settings: Any) -> Any:
        return with_sampler(server.prepare(settings))

    return process.main(argv, config.settings_from_args, prepare)


# -- measuring the servers ---------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _tasks(stats: Path) -> int | None:
    try:
        lines = stats.read_text().splitlines()
    except OSError:
        return None
    return json.loads(lines[-1])["tasks"] if lines else None


class Server:
    def __init__(self, kind: str, proc: asyncio.subprocess.Process, stats: Path, url: str):
        self.kind = kind
        self.proc = proc
        self.stats = stats
        self.url = url
        self.samples: list[dict[str, Any]] = []

    def sample(self, elapsed: float) -> None:
        self.samples.append(
            {
                "t": round(elapsed, 1),
                "rss_mib": round(_rss_mib(self.proc.pid), 1),
                "fds": _fds(self.proc.pid),
                "tasks": _tasks(self.stats),
            }
        )

    def settled(self) -> dict[str, Any]:
        return {"fds": _fds(self.proc.pid), "tasks": _tasks(self.stats)}

    def summary(self) -> dict[str, Any]:
        warm = [s for s in self.samples if s["t"] >= WARMUP_SECONDS] or self.samples
        load = [s for s in self.samples if "settled" not in s]
        first, after, last = self.samples[0], warm[0], load[-1]
        settled = self.samples[-1]
        peak = max(s["rss_mib"] for s in self.samples)
        return {
            "rss_mib": {
                "start": first["rss_mib"],
                "after_warmup": after["rss_mib"],
                "peak": peak,
                "end": last["rss_mib"],
            },
            "fds": {
                "start": first["fds"],
                "after_warmup": after["fds"],
                "peak": max(s["fds"] for s in self.samples),
                "end": last["fds"],
                "after_connections_closed": settled["fds"],
            },
            "tasks": {
                "start": first["tasks"],
                "after_warmup": after["tasks"],
                "peak": max(s["tasks"] or 0 for s in self.samples),
                "end": last["tasks"],
                "after_connections_closed": settled["tasks"],
            },
        }

    def verdicts(self) -> dict[str, bool]:
        summary = self.summary()
        rss, fds, tasks = summary["rss_mib"], summary["fds"], summary["tasks"]
        return {
            "rss_at_most_100_mib": rss["peak"] <= MAX_RSS_MIB,
            "rss_flat": rss["end"] - rss["after_warmup"] <= FLAT_RSS_MIB,
            "fds_back": fds["after_connections_closed"] <= fds["start"] + FD_ALLOWANCE,
            "tasks_back": (tasks["after_connections_closed"] or 0)
            <= (tasks["start"] or 0) + TASK_ALLOWANCE,
        }


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _start(kind: str, tmp: Path, flags: list[str], client: aiohttp.ClientSession) -> Server:
    port = _port()
    stats = tmp / f"{kind}-tasks.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TMI_", "KUBERNETES_"))}
    env.pop("KUBECONFIG", None)
    env.pop("POD_NAMESPACE", None)
    log = (tmp / f"{kind}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve",
        kind,
        "--stats",
        str(stats),
        "--",
        *flags,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stderr=log,
    )
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"{kind} exited {proc.returncode}; see {tmp}/{kind}.log")
        with contextlib.suppress(aiohttp.ClientError):
            async with client.get(f"{url}/readyz") as resp:
                if resp.status == 200:
                    return Server(kind, proc, stats, url)
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{kind} not ready within 60 s; see {tmp}/{kind}.log")


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    import trustme

    from kits.fakeapi import FakeCluster
    from kits.profilekit import CLUSTER, NAMESPACE

    fixture = make_fixture()
    api = FakeCluster()
    await api.start()
    api.put("configmaps", fixture["configmap"])
    for node in fixture["nodes"]:
        api.put("nodes", node)
    for pod in fixture["pods"]:
        api.put("pods", pod)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        leaf.private_key_pem.write_to_path(str(tmp / "tls.key"))
        leaf.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
        tls = ssl.create_default_context()
        ca.configure_trust(tls)
        kubeconfig = api.kubeconfig(tmp / "kubeconfig")
        common = [
            "--namespace",
            NAMESPACE,
            "--owner-public-key",
            fixture["owner"].public_key,
            "--cluster-binding-id",
            CLUSTER,
            "--cert",
            str(tmp / "tls.crt"),
            "--key",
            str(tmp / "tls.key"),
            "--kubeconfig",
            str(kubeconfig),
            "--log-level",
            "WARNING",
            "--drain-seconds",
            "0.5",
        ]
        connector = aiohttp.TCPConnector(ssl=tls, limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector) as client:
            servers = [
                await _start("webhook", tmp, ["--enabled", *common], client),
                await _start("extender", tmp, common, client),
            ]
            webhook, extender = servers
            load = Load(fixture)
            counts = {"reviews": 0, "filter": 0, "prioritize": 0}
            errors: list[str] = []
            latencies: list[float] = []

            async def one_review() -> None:
                body, uid, allowed = load.review()
                started = time.perf_counter()
                problem = await post(
                    client,
                    f"{webhook.url}/mutate?timeout=5s",
                    body,
                    lambda data: check_review(data, uid, allowed),
                )
                latencies.append(time.perf_counter() - started)
                counts["reviews"] += 1
                if problem:
                    errors.append(f"review: {problem}")

            async def one_extender_call() -> None:
                verb, body = load.extender_calls[
                    (counts["filter"] + counts["prioritize"]) % len(load.extender_calls)
                ]
                counts[verb] += 1
                problem = await post(
                    client,
                    f"{extender.url}/{verb}",
                    body,
                    lambda data: check_extender(verb, data, load.node_count),
                )
                if problem:
                    errors.append(f"{verb}: {problem}")

            stop = asyncio.Event()
            begin = time.monotonic()

            async def sampler() -> None:
                while not stop.is_set():
                    for server in servers:
                        server.sample(time.monotonic() - begin)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)

            sampling = asyncio.create_task(sampler())
            await asyncio.gather(
                paced(args.rate, args.seconds, one_review, stop),
                paced(args.extender_rate, args.seconds, one_extender_call, stop),
            )
            elapsed = time.monotonic() - begin
            for server in servers:
                server.sample(elapsed)
            stop.set()
            await sampling
            # The load's connections close; what the servers still hold after that is a leak.
            await connector.close()
            baseline = {s.kind: s.samples[0] for s in servers}
            deadline = time.monotonic() + SETTLE_SECONDS
            while time.monotonic() < deadline:
                settled = {s.kind: s.settled() for s in servers}
                if all(
                    settled[k]["fds"] <= baseline[k]["fds"]
                    and (settled[k]["tasks"] or 0) <= (baseline[k]["tasks"] or 0)
                    for k in settled
                ):
                    break
                await asyncio.sleep(0.5)
            for server in servers:
                server.samples.append(
                    {
                        "t": round(time.monotonic() - begin, 1),
                        "rss_mib": round(_rss_mib(server.proc.pid), 1),
                        "settled": True,
                        **server.settled(),
                    }
                )
            exits = {}
            for server in servers:
                server.proc.send_signal(signal.SIGTERM)
                exits[server.kind] = await asyncio.wait_for(server.proc.wait(), 30)
        await api.stop()
    ordered = sorted(latencies)

    def q(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1000, 2)

    report: dict[str, Any] = {
        "benchmark": "soak: webhook and extender processes under steady load",
        "seconds": round(elapsed, 1),
        "review_rate": args.rate,
        "extender_rate": args.extender_rate,
        "calls": counts,
        "achieved_review_rate": round(counts["reviews"] / elapsed, 1),
        "review_latency_ms": {"p50": q(0.5), "p99": q(0.99), "max": q(1.0)},
        "errors": len(errors),
        "first_errors": errors[:10],
        "exit_status": exits,
        "servers": {s.kind: s.summary() for s in servers},
        "verdicts": {s.kind: s.verdicts() for s in servers},
        "samples": {s.kind: s.samples for s in servers},
    }
    report["passed"] = (
        not errors
        and all(code == 0 for code in exits.values())
        and all(all(v.values()) for v in report["verdicts"].values())
    )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=540)
    parser.add_argument("--rate", type=float, default=200, help="reviews per second")
    parser.add_argument("--extender-rate", type=float, default=40, help="extender calls/s")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--serve", choices=["webhook", "extender"], help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.serve:
        return serve(args.serve, args.stats, [a for a in rest if a != "--"])
    report = uvloop.run(soak(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    brief = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(brief, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
