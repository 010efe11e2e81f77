"""Benchmark of the allocation controller: from a Pod's binding to its AllocationVerified verdict.

Pods arrive at a steady rate (default 100 a second); each is created planned (as the admission
webhook leaves it) and bound at once (as the scheduler would). The figure is the time from the
binding to the verdict, at p50/p99/max, with the target p99 <= 1 s. Two setups:

* `memory`: the controller's own pipeline on the in-memory API server (watch event -> informer
  -> queue -> reconcile -> patch), with leader election on, in one process. Binding time is taken
  when the fake stores the bound Pod; verdict time when the fake receives the patch. Run with no
  API latency and with a simulated 2 ms per call.
* `apiserver`: the real control plane from `localcluster` (etcd + kube-apiserver), the
  controller as its own process (`python -m allocation_controller`) with two replicas electing
  on a real Lease, authenticated as its ServiceAccount and bound to the Role in
  manifests/controller/ (which the run applies, Deployment and PDB included, so the API server
  validates every manifest). Binding is a `pods/binding` POST; the verdict time is when a watch
  opened by the benchmark sees the condition, so it includes one watch delivery. After the
  load, the leader is stopped and the standby's takeover is timed.

Run with `.venv/bin/python bench/bench_controller.py [--mode memory|apiserver|all]`. It writes
bench/results/controller.json and prints it. It measures; it asserts nothing. The machine's load
average before each run is recorded, because on a shared 2-CPU machine the API server's share of
the CPU, not the controller, decides the real-control-plane figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from allocation_controller.config import ControllerSettings  # noqa: E402
from allocation_controller.controller import Controller  # noqa: E402
from allocation_controller.kubeapi import HttpKube  # noqa: E402
from allocation_controller.leader import LeaderSettings  # noqa: E402
from inference_policy.granting.grant import CONDITION_TYPE  # noqa: E402
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME  # noqa: E402
from kits.controllerkit import MemoryKube  # noqa: E402
from kits.podstates import bind, planned_pod  # noqa: E402
from kits.polling import Timeout, eventually  # noqa: E402
from kits.profilekit import CLUSTER, NOW, Owner, request  # noqa: E402
from localcluster.plane.metrics import parse_metrics  # noqa: E402
from localcluster.plane.process import python_module  # noqa: E402
from serving.informer import Collection, list_all  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "controller.json"
NAMESPACE = "kamiwaza"
# The name the controller reads by default and the kustomize base's Role names.
PROFILE_NAME = DEFAULT_CONFIGMAP_NAME
CREATED = "2026-11-29T12:00:00Z"


def summary(samples: list[float]) -> dict[str, float | int]:
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {
        "count": len(ordered),
        "p50_ms": round(pick(0.50) * 1000, 2),
        "p90_ms": round(pick(0.90) * 1000, 2),
        "p99_ms": round(pick(0.99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(sum(ordered) / len(ordered) * 1000, 2),
    }


async def pace(rate: float, count: int, start: float, index: int) -> None:
    delay = start + index / rate - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


# -- the in-memory pipeline ----------------------------------------------------------------------


async def bench_memory(rate: float, count: int, latency: float) -> dict[str, Any]:
    owner = Owner()
    kube = MemoryKube(NAMESPACE)
    kube.latency = latency
    kube.put("configmaps", owner.sign(name=PROFILE_NAME))
    document = request()
    plan = owner.state().decide(document, NOW).body
    settings = ControllerSettings(
        policy=owner.settings(),
        leader=LeaderSettings(name="tmi-allocation-controller", identity="bench-0"),
    )
    loop = asyncio.get_running_loop()
    began = loop.time()
    controller = Controller(
        kube, settings, clock=lambda: NOW + timedelta(seconds=loop.time() - began)
    )
    verified_at: dict[str, float] = {}
    kube.on_patch = lambda patch: verified_at.setdefault(patch.name, patch.at)
    stop = asyncio.Event()
    task = loop.create_task(controller.run(stop))
    await eventually(lambda: controller._workers, what="the controller's workers", timeout=60)
    bound_at: dict[str, float] = {}
    load_before = os.getloadavg()[0]
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(count):
        await pace(rate, count, start, i)
        name = f"bench-{i}"
        kube.put("pods", planned_pod(name, document, plan, created=CREATED))
        kube.mutate("pods", name, lambda pod: bind(pod, at=CREATED))
        bound_at[name] = time.perf_counter()
    offered = time.perf_counter() - start
    deadline = time.perf_counter() + 60
    while len(verified_at) < count and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    stop.set()
    await task
    reasons: dict[str, int] = {}
    for event in kube.events:
        reasons[event["reason"]] = reasons.get(event["reason"], 0) + 1
    return {
        "setup": "in-memory API server, leader election on, 8 workers",
        "api_latency_ms": latency * 1000,
        "pods": count,
        "offered_rate_per_s": round(count / offered, 1),
        "load_average_1m_before": round(load_before, 2),
        "bind_to_verdict": summary([verified_at[n] - bound_at[n] for n in verified_at]),
        "verified": len(verified_at),
        "patches": len(kube.patches),
        "events_by_reason": reasons,
        "process_cpu_share": round(cpu / elapsed, 2),
    }


# -- the real control plane ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _metrics(port: int) -> dict[str, float]:
    """The replica's samples by series, as written: `name` or `name{label="value",...}`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for sample in parse_metrics(text):
        labels = ",".join(f'{key}="{value}"' for key, value in sample.labels.items())
        values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def _ready(port: int) -> bool:
    """Whether the replica's caches have synced (its /readyz)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _verdicts(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("tmi_allocation_verdicts_total"))


def _manifests(namespace: str) -> list[dict[str, Any]]:
    import yaml

    documents: list[dict[str, Any]] = []
    for path in sorted((ROOT / "manifests" / "controller").glob("*.yaml")):
        if path.name == "kustomization.yaml":  # the kustomize base's index, not an object
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects") or []:
                subject["namespace"] = namespace
            documents.append(doc)
    return documents


async def bench_apiserver(rate: float, count: int, workdir: Path) -> dict[str, Any]:
    from localcluster import ControlPlane

    plane = ControlPlane.start(workdir, start_scheduler=False, start_kwok=False)
    processes: list[tuple[subprocess.Popen[bytes], int, Any]] = []
    try:
        return await _bench_apiserver(plane, rate, count, workdir, processes)
    finally:
        for proc, _, log in processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            if proc.poll() is None:
                proc.kill()
            log.close()
        plane.stop()


async def _bench_apiserver(
    plane: Any,
    rate: float,
    count: int,
    workdir: Path,
    processes: list[tuple[subprocess.Popen[bytes], int, Any]],
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    plane.create_namespace(NAMESPACE)
    admin = plane.kube("admin")
    applied = [
        f"{doc['kind']}/{doc['metadata']['name']}"
        for doc in plane.apply_manifest(_manifests(NAMESPACE))
    ]
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "nvidia"}
    admin.apply({**runtime_class, "metadata": {"name": "nvidia"}})
    account = f"system:serviceaccount:{NAMESPACE}:tmi-allocation-controller"
    kubeconfig = plane.add_identity(
        "bench-controller",
        account,
        ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"),
    )
    owner = Owner()
    now = datetime.now(UTC).replace(microsecond=0)
    window = {
        "issuedAt": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "expiresAt": (now + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    envelope = owner.envelope(**window)
    admin.apply(owner.sign(envelope, name=PROFILE_NAME))
    state = owner.state(envelope)
    document = request()
    plan = state.decide(document, now).body

    # The checkout behind whatever PYTHONPATH names, as the benchmark itself runs.
    inherited = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (inherited, str(ROOT)))))
    for identity in ("bench-a", "bench-b"):
        port = _free_port()
        log = (workdir / f"controller-{identity}.log").open("wb")
        proc = subprocess.Popen(
            [
                *python_module("allocation_controller"),
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                NAMESPACE,
                "--owner-public-key",
                owner.public_key,
                "--cluster-binding-id",
                CLUSTER,
                "--identity",
                identity,
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        processes.append((proc, port, log))

    def leader() -> tuple[subprocess.Popen[bytes], int, Any] | None:
        for entry in processes:
            with contextlib.suppress(OSError):
                if entry[0].poll() is None and _metrics(entry[1]).get("tmi_allocation_is_leader"):
                    return entry
        return None

    def synced_leader() -> tuple[subprocess.Popen[bytes], int, Any] | None:
        # A leader starts its workers once its caches have synced, which its /readyz reports.
        entry = leader()
        with contextlib.suppress(OSError):
            if entry is not None and _ready(entry[1]):
                return entry
        return None

    try:
        first = await eventually(
            synced_leader, what="a controller to lead with synced caches", timeout=60, interval=0.2
        )
    except Timeout:
        raise RuntimeError(f"no controller became leader; logs in {workdir}") from None

    api = HttpKube.from_kubeconfig(str(plane.kubeconfig("admin")), NAMESPACE, timeout=30)
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    pods = Collection("pods", "Pod", NAMESPACE)
    version = (await list_all(api, pods)).resource_version
    verified_at: dict[str, float] = {}
    reasons: dict[str, int] = {}

    async def observe() -> None:
        resume = version
        while True:
            async for event in api.watch(pods, resource_version=resume, timeout_seconds=300):
                resume = event.object.get("metadata", {}).get("resourceVersion", resume)
                name = event.object.get("metadata", {}).get("name")
                for entry in (event.object.get("status") or {}).get("conditions") or []:
                    if entry.get("type") == CONDITION_TYPE and name not in verified_at:
                        verified_at[name] = time.perf_counter()
                        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1

    watcher = asyncio.get_running_loop().create_task(observe())
    bound_at: dict[str, float] = {}
    errors: list[str] = []

    async def one(name: str) -> None:
        try:
            await api.request("POST", pods_path, body=planned_pod(name, document, plan))
            await api.request(
                "POST",
                f"{pods_path}/{name}/binding",
                body={
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"},
                },
            )
            bound_at[name] = time.perf_counter()
        except Exception as exc:
            errors.append(f"{name}: {exc}")

    pids = {
        "controller_leader": first[0].pid,
        "controller_standby": next(e for e in processes if e is not first)[0].pid,
        **{p.name: p.pid for p in plane.processes()},
    }
    cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    tasks = []
    start = time.perf_counter()
    for i in range(count):
        await pace(rate, count, start, i)
        tasks.append(asyncio.get_running_loop().create_task(one(f"bench-{i}")))
    await asyncio.gather(*tasks)
    offered = time.perf_counter() - start
    deadline = time.perf_counter() + 60
    while len(verified_at) < len(bound_at) and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    samples = [verified_at[n] - bound_at[n] for n in bound_at if n in verified_at]
    busy = time.perf_counter() - start
    cpu_share = {
        name: round((_cpu_seconds(pid) - cpu_before[name]) / busy, 2) for name, pid in pids.items()
    }

    leader_metrics = _metrics(first[1])
    follower = next(entry for entry in processes if entry is not first)
    follower_metrics = _metrics(follower[1])
    internal = {
        "count": leader_metrics.get("tmi_allocation_bind_to_verdict_seconds_count", 0),
        "mean_ms": round(
            1000
            * leader_metrics.get("tmi_allocation_bind_to_verdict_seconds_sum", 0)
            / max(1, leader_metrics.get("tmi_allocation_bind_to_verdict_seconds_count", 1)),
            2,
        ),
        "le_0.25s": leader_metrics.get('tmi_allocation_bind_to_verdict_seconds_bucket{le="0.25"}'),
        "le_1s": leader_metrics.get('tmi_allocation_bind_to_verdict_seconds_bucket{le="1.0"}'),
        "reconcile_mean_ms_api_calls_included": round(
            1000
            * leader_metrics.get("tmi_allocation_reconcile_duration_seconds_sum", 0)
            / max(1, leader_metrics.get("tmi_allocation_reconcile_duration_seconds_count", 1)),
            2,
        ),
        "reconciles": leader_metrics.get("tmi_allocation_reconcile_duration_seconds_count"),
    }

    # Failover: stop the leader (SIGTERM releases the Lease), time the standby's first verdict.
    stopped = time.perf_counter()
    first[0].send_signal(signal.SIGTERM)
    takeover = None
    while time.perf_counter() - stopped < 30:
        with contextlib.suppress(OSError):
            if _metrics(follower[1]).get("tmi_allocation_is_leader"):
                takeover = time.perf_counter() - stopped
                break
        await asyncio.sleep(0.05)
    await one("after-failover")
    deadline = time.perf_counter() + 30
    while "after-failover" not in verified_at and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await api.close()
    return {
        "setup": (
            "etcd + kube-apiserver v1.36 from localcluster; controller as a separate process, "
            "2 replicas on a Lease, ServiceAccount identity under the manifests' Role; "
            "verdict seen through a watch"
        ),
        "pods": count,
        "offered_rate_per_s": round(count / offered, 1),
        "load_average_1m_before": round(load_before, 2),
        "bind_to_verdict": summary(samples),
        "verdicts_by_reason": reasons,
        "cpu_share_of_one_core_during_load": cpu_share,
        "errors": errors[:5],
        "leader_internal_bind_to_verdict": internal,
        "verdicts_written_by_leader": _verdicts(leader_metrics),
        "verdicts_written_by_standby_while_not_leader": _verdicts(follower_metrics),
        "failover_standby_leads_after_s": round(takeover, 2) if takeover is not None else None,
        "failover_pod_verified": "after-failover" in verified_at,
        "manifests_applied": applied,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["memory", "apiserver", "all"], default="all")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--keep", action="store_true", help="keep the control plane's and controllers' logs"
    )
    args = parser.parse_args()
    count = int(args.rate * args.seconds)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "target": "p99 bind-to-verdict <= 1000 ms at 100 Pods/s",
    }
    if RESULTS.exists():
        with contextlib.suppress(ValueError):
            previous = json.loads(RESULTS.read_text())
            results.update({k: v for k, v in previous.items() if k.startswith(("memory", "api"))})
    results["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if args.mode in ("memory", "all"):
        results["memory_no_latency"] = await bench_memory(args.rate, count, 0.0)
        # Each setup's figures are kept as soon as they are measured.
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        results["memory_2ms_latency"] = await bench_memory(args.rate, count, 0.002)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    if args.mode in ("apiserver", "all"):
        workdir = Path(tempfile.mkdtemp(prefix="tmi-bench-controller-"))
        try:
            results["apiserver"] = await bench_apiserver(args.rate, count, workdir)
        except BaseException:
            print(f"logs kept in {workdir}", file=sys.stderr)
            raise
        if args.keep:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
