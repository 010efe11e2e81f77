"""What `bench_peer.py` measures of each system's scheduler run over a burst, the same way for
every system: the bindings a watch sees, the CPU each process spent between the first and the
last, the API requests of the system's whole path (`peer_audit.py`), the scheduler's own account
of its attempts, when nothing is left to try, and the packing that results.

A run with more demand than the fleet holds never binds every Pod, so its end is not "all
bound": it is kube-scheduler's queues holding nothing it could still try (its active and
backoff queues empty, every Pod either bound or parked as unschedulable), seen on three polls
in a row of its `scheduler_pending_pods` gauge. A Pod parked unschedulable is retried when the
cluster changes (HAMi's node locks are node updates, so its Pods are retried more often than
`tmi`'s); those retries are in the window and in the CPU figures. A run that has not settled
after `timeout` is stopped there and reports what it bound (HAMi as its chart installs it binds
a burst at a fraction of a Pod a second).
"""

from __future__ import annotations

import os
import ssl
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import hami_peer
from peer_audit import AuditTail, per_pod
from peer_systems import SHARE_RESOURCE, System
from scheduling_run import SCHEDULER_ARGS, busy_seconds, process_seconds

from localcluster import ApiError, ControlPlane, wait_until
from localcluster.plane.metrics import parse_metrics

SETTLE_TIMEOUT = 300.0
POLL = 0.25
WHOLE_RESOURCE = "nvidia.com/gpu"
CARD_GB = 48


def summary(samples: Sequence[float]) -> dict[str, float | int]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)

    return {
        "count": len(ordered),
        "p50_ms": pct(0.5),
        "p90_ms": pct(0.9),
        "p99_ms": pct(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def memory_of(pid: int) -> dict[str, float]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"rss": fields.get("VmRSS", 0.0), "peak": fields.get("VmHWM", 0.0)}


class _Bindings:
    """Bindings of one namespace's Pods as a watch sees them, with the CPU of the processes
    that matter read at the first and at the latest."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.count = 0
        self.first: tuple[float, float, dict[str, float]] | None = None
        self.last: tuple[float, float, dict[str, float]] | None = None
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def seen(self) -> None:
        self.count += 1
        now = (time.perf_counter(), busy_seconds(), self._cpu())
        if self.first is None:
            self.first = now
        self.last = now

    def _cpu(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            try:
                out[name] = process_seconds(pid)
            except OSError:
                continue
        return out


def _watch(kube: Any, path: str, version: str, names: set[str], bindings: _Bindings) -> None:
    waiting = set(names)
    try:
        while waiting and not bindings.stop.is_set():
            query = {"fieldSelector": "spec.nodeName!=", "resourceVersion": version}
            for event in kube.watch(path, query, timeout=5):
                meta = event.get("object", {}).get("metadata", {})
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"the watch failed: {str(event)[:300]}")
                version = meta.get("resourceVersion", version)
                if meta.get("name") in waiting:
                    waiting.discard(meta["name"])
                    bindings.seen()
                if not waiting or bindings.stop.is_set():
                    return
    except BaseException as exc:
        bindings.error = exc


def _scheduler_metrics(plane: ControlPlane, label: str) -> list[Any]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{plane.schedulers[label].port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        return list(parse_metrics(response.read().decode()))


def _queues(samples: Iterable[Any]) -> dict[str, float]:
    return {
        s.labels.get("queue", ""): s.value for s in samples if s.name == "scheduler_pending_pods"
    }


def _cycle(samples: Iterable[Any]) -> dict[str, float]:
    """Mean algorithm and attempt milliseconds per attempt, and attempts by result."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for s in samples:
        if s.name == "scheduler_scheduling_algorithm_duration_seconds_sum":
            sums["algorithm"] = sums.get("algorithm", 0.0) + s.value
        elif s.name == "scheduler_scheduling_algorithm_duration_seconds_count":
            counts["algorithm"] = counts.get("algorithm", 0.0) + s.value
        elif s.name == "scheduler_scheduling_attempt_duration_seconds_sum":
            key = f"attempt_{s.labels.get('result', '')}"
            sums[key] = sums.get(key, 0.0) + s.value
        elif s.name == "scheduler_scheduling_attempt_duration_seconds_count":
            key = f"attempt_{s.labels.get('result', '')}"
            counts[key] = counts.get(key, 0.0) + s.value
    out = {f"{k}_ms": round(v / counts[k] * 1000, 3) for k, v in sums.items() if counts.get(k)}
    out.update({f"{k}_count": v for k, v in counts.items() if k.startswith("attempt_")})
    return out


def schedule_run(
    plane: ControlPlane,
    system: System,
    label: str,
    names: Sequence[str],
    audit: AuditTail,
    timeout: float = SETTLE_TIMEOUT,
) -> dict[str, Any]:
    """Start `system`'s kube-scheduler over its namespace's waiting Pods, follow it until
    nothing is left to try (or `timeout`), stop it, and report."""
    kube = plane.kube("admin")
    path = f"/api/v1/namespaces/{system.namespace}/pods"
    version = kube.request("GET", path, query={"limit": 1})["metadata"]["resourceVersion"]
    started = time.time()
    plane.start_scheduler(
        system.config,
        name=label,
        identity=system.scheduler_identity,
        verbosity=system.verbosity,
        extra_args=SCHEDULER_ARGS,
    )
    pids = dict(system.pids)
    scheduler_pid = plane.pids().get(f"scheduler-{label}")
    if scheduler_pid is not None:
        pids["kube-scheduler"] = scheduler_pid
    pids.update({k: v for k, v in plane.pids().items() if k in ("kube-apiserver", "etcd")})
    bindings = _Bindings(pids)
    watcher = threading.Thread(
        target=_watch, args=(plane.kube("admin"), path, version, set(names), bindings), daemon=True
    )
    watcher.start()
    calm = 0
    settled = False
    deadline = time.monotonic() + timeout
    samples: list[Any] = []
    scheduler_memory: dict[str, float] = {}
    try:
        while time.monotonic() < deadline:
            samples = _scheduler_metrics(plane, label)
            queues = _queues(samples)
            busy = queues.get("active", 0) + queues.get("backoff", 0)
            parked = queues.get("unschedulable", 0)
            calm = calm + 1 if busy == 0 and bindings.count + parked >= len(names) else 0
            if calm >= 3:
                settled = True
                break
            time.sleep(POLL)
        samples = _scheduler_metrics(plane, label)
        if scheduler_pid is not None:
            scheduler_memory = memory_of(scheduler_pid)
    finally:
        bindings.stop.set()
        plane.stop_scheduler(label)
        watcher.join(timeout=10)
    ended = time.time()
    if bindings.error is not None:
        raise bindings.error
    first, last = bindings.first, bindings.last
    out: dict[str, Any] = {
        "pods": len(names),
        "bound": bindings.count,
        "settled": settled,
        "seconds": round(ended - started, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "scheduler_memory_mib": scheduler_memory,
    }
    requests = audit.count(system.users, started, ended)
    out["api_requests"] = requests
    out["api_requests_per_pod_bound"] = per_pod(requests, bindings.count)
    if first is None or last is None or bindings.count < 2:
        return out
    within = bindings.count - 1
    elapsed = last[0] - first[0]
    spent = {name: last[2].get(name, 0.0) - first[2].get(name, 0.0) for name in last[2]}
    out.update(
        {
            "first_to_last_binding_s": round(elapsed, 3),
            "pods_per_second": round(within / elapsed, 2),
            "machine_cpu_ms_per_pod": round((last[1] - first[1]) / within * 1000, 3),
            "cpu_ms_per_pod": {name: round(s / within * 1000, 3) for name, s in spent.items()},
            "scheduler": _cycle(samples),
        }
    )
    return out


def _used(system: str, pods: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per node, what is taken: whole GPUs on an H100 node, GB on an L40S card."""
    used: dict[str, float] = {}
    if system.startswith("hami"):
        for node, devices in hami_peer.device_usage(pods).items():
            if node.startswith("h100"):
                used[node] = sum(1 for mib in devices.values() if mib > 0)
            else:
                used[node] = sum(devices.values()) / 1024
        return used
    for item in pods:
        node = item.get("spec", {}).get("nodeName")
        if not node:
            continue
        for container in item["spec"]["containers"]:
            requests = container.get("resources", {}).get("requests", {})
            amount = requests.get(WHOLE_RESOURCE) or requests.get(SHARE_RESOURCE) or 0
            used[node] = used.get(node, 0.0) + float(amount)
    return used


def stranded(
    kube: Any,
    system: str,
    namespace: str,
    items: Sequence[tuple[str, int, int]],
    names: Sequence[str],
    nodes: Sequence[Any],
) -> dict[str, Any]:
    """Pods placed by class and the free capacity no waiting Pod could use, in GPUs."""
    pods = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    bound = {p["metadata"]["name"] for p in pods if p.get("spec", {}).get("nodeName")}
    placed: dict[str, int] = {"whole": 0, "share": 0}
    gpus_placed = 0.0
    waiting: dict[str, list[int]] = {"whole": [], "share": []}
    for (kind, gpus, gb), name in zip(items, names, strict=True):
        if name in bound:
            placed[kind] += 1
            gpus_placed += gpus if kind == "whole" else gb / CARD_GB
        else:
            waiting[kind].append(gpus if kind == "whole" else gb)
    used = _used(system, pods)
    out: dict[str, float] = {"whole_gpus": 0.0, "share_gpus": 0.0}
    free_total = 0.0
    for node in nodes:
        whole = node.name.startswith("h100")
        capacity = node.gpus if whole else CARD_GB
        free = capacity - used.get(node.name, 0.0)
        free_total += free if whole else free / CARD_GB
        smallest = min(waiting["whole" if whole else "share"], default=None)
        if smallest is not None and free < smallest:
            out["whole_gpus" if whole else "share_gpus"] += free if whole else free / CARD_GB
    return {
        "placed": placed,
        "gpus_placed": round(gpus_placed, 2),
        "waiting": {k: len(v) for k, v in waiting.items()},
        "free_gpus": round(free_total, 2),
        "stranded_gpus": round(out["whole_gpus"] + out["share_gpus"], 2),
        "stranded_by_class": {k: round(v, 2) for k, v in out.items()},
    }


def clear(kube: Any, namespaces: Sequence[str]) -> None:
    for namespace in namespaces:
        kube.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"gracePeriodSeconds": 0}
        )
    wait_until(
        lambda: (
            not any(
                kube.request("GET", f"/api/v1/namespaces/{n}/pods", query={"limit": 1})["items"]
                for n in namespaces
            )
        ),
        timeout=180,
        what="the stream's Pods to be gone",
    )


def clear_locks(kube: Any) -> int:
    """Remove any HAMi node lock left behind (a Pod deleted at the end of a run before the
    stand-in's turn), so the next run starts from free nodes; the benchmark's own calls, not
    counted as HAMi's. Returns how many there were."""
    removed = 0
    for node in kube.request("GET", "/api/v1/nodes")["items"]:
        if hami_peer.NODE_LOCK not in (node["metadata"].get("annotations") or {}):
            continue
        try:
            kube.request(
                "PATCH",
                f"/api/v1/nodes/{node['metadata']['name']}",
                body={"metadata": {"annotations": {hami_peer.NODE_LOCK: None}}},
                content_type="application/merge-patch+json",
            )
            removed += 1
        except ApiError as exc:
            if exc.status != 404:
                raise
    return removed


__all__ = ["clear", "clear_locks", "memory_of", "schedule_run", "stranded", "summary"]
