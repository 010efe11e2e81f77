"""Create-to-bound under steady arrival: what a user of an inference platform waits for when
engine Pods arrive over time rather than all at once.

In one window a system's kube-scheduler is already running (started once for the whole
phase, so its start-up is in no window) and its engine Pods are created at a fixed rate, each
on its own schedule (open loop: a slow create does not hold back the next; four in flight at
most). Each Pod's latency runs from the moment its create is sent to the moment a watch opened
before the window sees it bound: the webhook, the scheduling (the extender's calls, HAMi's node
lock and kube-scheduler's backoff included) and the bind together. A Pod not bound `drain`
seconds after the last create is reported unbound and counted in the percentiles as slower than
any that was (`None` for a percentile it decides). Beside the latencies: the create call alone,
the CPU each process spent, the API requests of the system's path per Pod (`peer_audit.py`),
what its kube-scheduler says it did, and the machine's load average. A system's windows at one
rate may be slices taken in turn with other systems' (`bench_peer.py` interleaves the systems
that bind in milliseconds so), merged before they are reported (`Window.add`).
"""

from __future__ import annotations

import os
import ssl
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from peer_audit import AuditTail, per_pod
from peer_systems import Item, System
from scheduling_run import busy_seconds, process_seconds

from localcluster import ControlPlane
from localcluster.plane.metrics import parse_metrics

IN_FLIGHT = 4


def percentiles(samples: Sequence[float | None]) -> dict[str, float | int | None]:
    """p50, p90 and p99 in ms of `samples`, an unbound Pod (None) ranked above every bound
    one; a percentile that falls on one is None."""
    bound = sorted(s for s in samples if s is not None)
    ordered: list[float | None] = [*bound, *([None] * (len(samples) - len(bound)))]

    def pct(p: float) -> float | None:
        if not ordered:
            return None
        value = ordered[min(len(ordered) - 1, int(p * len(ordered)))]
        return None if value is None else round(value * 1000, 1)

    return {
        "count": len(samples),
        "unbound": len(samples) - len(bound),
        "p50_ms": pct(0.5),
        "p90_ms": pct(0.9),
        "p99_ms": pct(0.99),
        "max_bound_ms": round(bound[-1] * 1000, 1) if bound else None,
    }


class _Bound:
    """When each Pod of one namespace was first seen bound, from a watch opened before."""

    def __init__(self, kube: Any, namespace: str) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.version = kube.request("GET", self.path, query={"limit": 1})["metadata"][
            "resourceVersion"
        ]
        self.at: dict[str, float] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        query = {"fieldSelector": "spec.nodeName!=", "resourceVersion": self.version}
        while not self.stop.is_set():
            try:
                for event in self.kube.watch(self.path, query, timeout=5):
                    meta = event.get("object", {}).get("metadata", {})
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"the watch failed: {str(event)[:300]}")
                    query["resourceVersion"] = meta.get("resourceVersion", query["resourceVersion"])
                    name = meta.get("name")
                    if name and name not in self.at:
                        self.at[name] = time.perf_counter()
                    if self.stop.is_set():
                        return
            except Exception as exc:  # resumed from the last version seen
                self.errors.append(repr(exc)[:300])
                if len(self.errors) > 20:
                    return

    def close(self) -> None:
        # Not joined: the thread sits in a watch read until the next event or the watch's end
        # (up to 5 s), which would be dead time between windows; it ends on its own.
        self.stop.set()


def _scheduler_counters(plane: ControlPlane, label: str) -> dict[str, float]:
    """Attempts by result, their summed duration, and the SLI sum and count (from a Pod's
    first entry into the queue to its binding), as counters to subtract."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{plane.schedulers[label].port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for s in parse_metrics(text):
        key = ""
        if s.name == "scheduler_schedule_attempts_total":
            key = f"attempts_{s.labels.get('result', '')}"
        elif s.name == "scheduler_scheduling_attempt_duration_seconds_sum":
            key = "attempt_seconds"
        elif s.name == "scheduler_scheduling_algorithm_duration_seconds_sum":
            key = "algorithm_seconds"
        elif s.name == "scheduler_scheduling_algorithm_duration_seconds_count":
            key = "algorithm_count"
        elif s.name == "scheduler_pod_scheduling_sli_duration_seconds_sum":
            key = "sli_seconds"
        elif s.name == "scheduler_pod_scheduling_sli_duration_seconds_count":
            key = "sli_count"
        if key:
            out[key] = out.get(key, 0.0) + s.value
    return out


def _cpu(pids: Mapping[str, int]) -> dict[str, float]:
    out = {"machine": busy_seconds()}
    for name, pid in pids.items():
        try:
            out[name] = process_seconds(pid)
        except OSError:
            continue
    return out


@dataclass
class Window:
    """What one window measured, in a form that adds up: a system's slices of one rate are
    merged into one before it is reported."""

    rate: float
    latencies: list[float | None] = field(default_factory=list)
    create_calls: list[float] = field(default_factory=list)
    after_create: list[float | None] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    scheduler: dict[str, float] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    late: float = 0.0
    loads: list[float] = field(default_factory=list)
    watch_errors: list[str] = field(default_factory=list)
    # How long it waited first for the system's previous requests to finish (HAMi's).
    waited: float = 0.0

    def add(self, other: Window) -> None:
        self.latencies += other.latencies
        self.create_calls += other.create_calls
        self.after_create += other.after_create
        for mine, theirs in ((self.cpu, other.cpu), (self.scheduler, other.scheduler)):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0.0) + value
        self.requests.update(other.requests)
        self.seconds += other.seconds
        self.late = max(self.late, other.late)
        self.loads += other.loads
        self.watch_errors += other.watch_errors

    def report(self) -> dict[str, Any]:
        bound = sum(1 for value in self.latencies if value is not None)
        delta = self.scheduler
        attempts = delta.get("algorithm_count", 0.0)

        def per_attempt(key: str) -> float | None:
            return round(delta.get(key, 0.0) / attempts * 1e3, 2) if attempts else None

        requests = dict(sorted(self.requests.items()))
        return {
            "rate_per_s": self.rate,
            "pods": len(self.latencies),
            "bound": bound,
            "create_to_bound": percentiles(self.latencies),
            # Each Pod's, in ms (None: unbound), for the intervals of the ratios.
            "create_to_bound_ms": [
                None if value is None else round(value * 1000, 2) for value in self.latencies
            ],
            "create_call": percentiles(list(self.create_calls)),
            "created_to_bound": percentiles(self.after_create),
            "latest_create_behind_schedule_ms": round(self.late * 1000, 1),
            "window_s": round(self.seconds, 2),
            "load_average_1m": round(sum(self.loads) / len(self.loads), 2) if self.loads else None,
            "load_average_1m_each_slice": self.loads,
            "cpu_ms_per_pod_bound": {
                name: round(seconds / bound * 1000, 2)
                for name, seconds in self.cpu.items()
                if bound
            },
            "api_requests": requests,
            "api_requests_per_pod_bound": per_pod(requests, bound),
            "scheduler": {
                **{k: v for k, v in delta.items() if k.startswith("attempts_")},
                "algorithm_ms_per_attempt": per_attempt("algorithm_seconds"),
                "attempt_ms_per_attempt": per_attempt("attempt_seconds"),
                "sli_ms_per_pod": round(delta["sli_seconds"] / delta["sli_count"] * 1e3, 2)
                if delta.get("sli_count")
                else None,
            },
            "waited_for_quiet_s": self.waited,
            "watch_errors": self.watch_errors,
        }


def paced_window(
    plane: ControlPlane,
    system: System,
    label: str,
    items: Sequence[Item],
    rate: float,
    prefix: str,
    audit: AuditTail,
    drain: float,
) -> Window:
    """One window: `items` created in `system`'s namespace at `rate` a second while its
    kube-scheduler (running as `label`) places them; the module docstring says what is
    measured."""
    kube = plane.kube("admin")
    watch = _Bound(plane.kube("admin"), system.namespace)
    pids = dict(system.pids)
    pids.update(
        {
            name: pid
            for name, pid in plane.pids().items()
            if name in ("kube-apiserver", "etcd", f"scheduler-{label}")
        }
    )
    names = [f"{prefix}-{index:03d}" for index in range(len(items))]
    sent: dict[str, float] = {}
    created: dict[str, float] = {}
    refused: list[str] = []

    def create(name: str, item: Item) -> None:
        body = system.build(name, item)
        sent[name] = time.perf_counter()
        stored = kube.create(body)
        created[name] = time.perf_counter()
        if not system.admitted(stored):
            refused.append(name)

    before = _scheduler_counters(plane, label)
    cpu_before = _cpu(pids)
    started = time.time()
    origin = time.perf_counter()
    late = 0.0
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        futures = []
        for index, (name, item) in enumerate(zip(names, items, strict=True)):
            due = origin + index / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
            futures.append(pool.submit(create, name, item))
        for future in futures:
            future.result()
    deadline = time.perf_counter() + drain
    while time.perf_counter() < deadline and not all(n in watch.at for n in names):
        time.sleep(0.02)
    ended = time.time()
    cpu_after = _cpu(pids)
    after = _scheduler_counters(plane, label)
    watch.close()
    if refused:
        raise SystemExit(f"{system.name}: {len(refused)} Pods not admitted as expected")
    return Window(
        rate=rate,
        latencies=[watch.at[n] - sent[n] if n in watch.at else None for n in names],
        create_calls=[created[n] - sent[n] for n in names],
        after_create=[watch.at[n] - created[n] if n in watch.at else None for n in names],
        cpu={name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after},
        scheduler={key: after.get(key, 0.0) - before.get(key, 0.0) for key in after},
        requests=Counter(audit.count(system.users, started, ended)),
        seconds=ended - started,
        late=late,
        loads=[round(os.getloadavg()[0], 2)],
        watch_errors=watch.errors,
    )


__all__ = ["Window", "paced_window", "percentiles"]
