"""How the scheduling benchmarks run a kube-scheduler over Pods and read what it did: the
extender processes they start (`tmi`'s own, a constant one), the run that creates its Pods before
the scheduler starts and times the first binding to the last, and the CPU, queue and API server
figures beside it.

`bench_scheduling.py`, `bench_dra.py` and `bench_peer.py` all measure this way, so a figure in one
means what it means in the others; the module holds what they share and nothing of any one
fleet.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from kits.profilekit import CLUSTER, NAMESPACE, Owner
from localcluster import ApiError, ControlPlane
from localcluster.plane.metrics import parse_metrics
from localcluster.plane.process import python_module, wait_until

ROOT = Path(__file__).resolve().parent.parent
# The kustomize base's (the chart's default) name, which its extender Role names.
PROFILE_CONFIGMAP = DEFAULT_CONFIGMAP_NAME
MANIFESTS = ROOT / "manifests" / "scheduler"
# API Priority and Fairness shares the API server's concurrency (by default 400 + 200 requests
# in flight) among priority levels; on two cores every request is held longer, so the
# scheduler's own level (workload-high) filled up and its bindings were refused with 429 in the
# faster runs, a retry and a backoff each, at random. Four times the default keeps the
# scheduler's requests in, so the figure is the scheduler's and the extender's, not the
# throttle's; the rejections per run are recorded (`apiserver_per_run`).
APISERVER_ARGS = ("--max-requests-inflight=1600", "--max-mutating-requests-inflight=800")


def grant_extender(plane: ControlPlane) -> None:
    plane.apply_manifest(MANIFESTS / "namespace.yaml")
    plane.apply_manifest(MANIFESTS / "extender-rbac.yaml")
    kube = plane.kube("admin")
    user = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tmi-extender"}
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-tmi-extender-user"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "kamiwaza-tmi-extender",
            },
            "subjects": [user],
        }
    )
    # The Roles the chart binds its ServiceAccount to in the tenant namespace: reading the
    # profiles, and writing the room figures (without it every room update is refused).
    for role in ("tmi-extender-read-profiles", "tmi-extender-write-room"):
        kube.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"bench-{role}-user", "namespace": NAMESPACE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [user],
            }
        )


def start_extender(
    plane: ControlPlane, owner: Owner, port: int, *, tls: bool = False
) -> subprocess.Popen[bytes]:
    """`tmi`'s extender as its own process, as the shipped RBAC lets it read; over HTTPS with a
    certificate from the plane's CA when `tls` (as the chart runs it), else plain HTTP on
    loopback."""
    serving = _serving_flags(plane, "tmi-extender") if tls else ["--plain-http"]
    argv = [
        *python_module("extender"),
        *serving,
        "--host=127.0.0.1",
        f"--port={port}",
        f"--namespace={NAMESPACE}",
        f"--bundle-configmap={PROFILE_CONFIGMAP}",
        f"--owner-public-key={owner.public_key}",
        f"--cluster-binding-id={CLUSTER}",
        f"--kubeconfig={plane.kubeconfig('tmi-extender')}",
    ]
    return serve(plane, "tmi-extender", argv, port, tls=tls)


def start_constant_extender(
    plane: ControlPlane, port: int, *, tls: bool = False
) -> subprocess.Popen[bytes]:
    serving = _serving_flags(plane, "constant-extender") if tls else []
    argv = [sys.executable, str(ROOT / "bench" / "constant_extender.py"), f"--port={port}"]
    return serve(plane, "constant-extender", [*argv, *serving], port, tls=tls)


def _serving_flags(plane: ControlPlane, name: str) -> list[str]:
    pair = plane.issue_serving_cert(name, ("127.0.0.1",))
    return [f"--cert={pair.cert_file}", f"--key={pair.key_file}"]


def serve(
    plane: ControlPlane, name: str, argv: list[str], port: int, *, tls: bool = False
) -> subprocess.Popen[bytes]:
    """Start an extender process, its output in the plane's logs, once its /readyz answers."""
    log = (plane.logs_dir / f"{name}.log").open("wb")
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    context = ssl.create_default_context(cafile=str(plane.ca_file)) if tls else None
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/readyz"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_until(ready, timeout=60, what=f"{name} /readyz")
    return process


def busy_seconds() -> float:
    """CPU time the whole machine has spent busy (every process, user and system), from
    /proc/stat: what the control plane, the scheduler and the extender cost together."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def run(
    plane: ControlPlane,
    pods: list[dict[str, Any]],
    label: str,
    config: dict[str, Any],
    extender_pid: int | None,
    timeout: float = 300,
    contradicted: Collection[str] = (),
) -> dict[str, Any]:
    """Create every Pod first, then start the scheduler: the queue is full from the start, so
    the time to bind them all is the scheduler's, not the rate at which Pods were created.

    The window runs from the first binding to the last, both seen on a watch of bound Pods
    opened before the scheduler starts. Timing from the scheduler's readiness instead counted
    the Pods it bound while the harness's readiness poll (backing off to a second) had not yet
    noticed: up to half the Pods of a run, a different share each time.

    Beside the wall-clock rate, the machine's busy CPU time over the same window, read when the
    first and the last binding arrive: the rate is at the mercy of whatever else the shared
    machine runs, the CPU a Pod's scheduling costs much less so (on these 2 cores the run is
    CPU-bound, so the CPU ratio is the rate ratio a quiet machine would show)."""
    kube = plane.kube("admin")
    for pod in pods:
        kube.create(pod)
    path = f"/api/v1/namespaces/{pods[0]['metadata']['namespace']}/pods"
    listed = kube.request("GET", path, query={"limit": 1})["metadata"]["resourceVersion"]
    names = {p["metadata"]["name"] for p in pods}
    counters = apiserver_counters(kube)
    window = Window(plane, label, extender_pid)
    watcher = threading.Thread(
        target=wait_bound,
        args=(plane.kube("admin"), path, listed, names, timeout, window),
        daemon=True,
    )
    watcher.start()
    cycle: dict[str, float] = {}
    try:
        plane.start_scheduler(config, name=label, extra_args=SCHEDULER_ARGS)
        # How many the old window (from the harness seeing readiness) would have missed.
        before_ready = window.count
        watcher.join(timeout + 30)
        cycle = scheduler_cycle(plane, label)
    finally:
        plane.stop_scheduler(label)
    if window.error is not None:
        raise window.error
    after = apiserver_counters(kube)
    first, last = window.first, window.last
    if first is None or last is None or window.count < 2:
        raise RuntimeError(f"{label}: {window.count} of {len(pods)} Pods bound in {timeout}s")
    elapsed = last.at - first.at
    # The first binding opens the window, so it is not one of the Pods bound within it.
    within = window.count - 1
    bound: dict[str, str] = {}
    for item in kube.request("GET", path)["items"]:
        name = item["metadata"]["name"]
        node = item.get("spec", {}).get("nodeName")
        if name in names and node:
            bound[name] = node
    components = {
        name: seconds - first.components.get(name, 0.0) for name, seconds in last.components.items()
    }
    return {
        "pods": len(pods),
        "bound": len(bound),
        "first_to_last_binding_seconds": round(elapsed, 3),
        "bound_before_readiness_seen": before_ready,
        "pods_per_second": round(within / elapsed, 1),
        "machine_cpu_ms_per_pod": round((last.busy - first.busy) / within * 1000, 3),
        "extender_cpu_ms_per_pod": round(components.pop("extender", 0.0) / within * 1000, 3),
        "component_cpu_ms_per_pod": {
            name: round(seconds / within * 1000, 3) for name, seconds in sorted(components.items())
        },
        "on_contradicted_nodes": sorted({n for n in bound.values() if n in contradicted}),
        "pods_on_contradicted_nodes": sum(1 for n in bound.values() if n in contradicted),
        "placement": placement(bound),
        "apiserver": {name: after[name] - counters.get(name, 0.0) for name in sorted(after)},
        "benchmark_watch_resumed": window.resumed,
        "scheduler_cycle": cycle,
    }


@dataclass
class Instant:
    at: float
    busy: float
    components: dict[str, float]


class Window:
    """The first and the last binding of a run, each with the CPU every process had spent by
    then; filled by the watching thread."""

    def __init__(self, plane: ControlPlane, label: str, extender_pid: int | None) -> None:
        self.plane = plane
        self.label = label
        self.extender_pid = extender_pid
        self.first: Instant | None = None
        self.last: Instant | None = None
        self.count = 0
        self.resumed = 0
        self.error: BaseException | None = None

    def bound(self, done: bool) -> None:
        self.count += 1
        if self.first is None or done:
            instant = Instant(time.perf_counter(), busy_seconds(), self._components())
            if self.first is None:
                self.first = instant
            if done:
                self.last = instant

    def _components(self) -> dict[str, float]:
        """CPU time of each control-plane process and the extender: where a Pod's cost lands
        besides the scheduler, the API server and etcd serving its calls."""
        pids = self.plane.pids()
        scheduler = pids.pop(f"scheduler-{self.label}", None)
        if scheduler is not None:
            pids["kube-scheduler"] = scheduler
        if self.extender_pid:
            pids["extender"] = self.extender_pid
        out: dict[str, float] = {}
        for name, pid in pids.items():
            try:
                out[name] = process_seconds(pid)
            except OSError:
                continue
        return out


def wait_bound(
    kube: Any, path: str, version: str, names: set[str], timeout: float, window: Window
) -> None:
    """Follow a watch of the namespace's bound Pods from `version` until every Pod named has
    been bound (or `timeout`), telling `window` of each. The API server closes a watch whose
    reader falls behind during the burst (`apiserver_terminated_watchers_total`); the watch is
    then resumed from the last event's resource version, as an informer does."""
    waiting = set(names)
    deadline = time.monotonic() + timeout
    event: Any = None
    try:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"{len(waiting)} Pods unbound after {timeout}s; last event: "
                    f"{json.dumps(event)[:500]}"
                )
            query = {"fieldSelector": "spec.nodeName!=", "resourceVersion": version}
            for event in kube.watch(path, query, timeout=max(1, int(left))):
                meta = event.get("object", {}).get("metadata", {})
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"the watch failed: {json.dumps(event)[:500]}")
                version = meta.get("resourceVersion", version)
                name = meta.get("name")
                if name in waiting:
                    waiting.discard(name)
                    window.bound(done=not waiting)
                    if not waiting:
                        return
            window.resumed += 1
    except BaseException as exc:
        window.error = exc


# kube-scheduler's own account of each attempt's algorithm: its filters and scores with the
# extender's two calls, serial, one Pod at a time.
_CYCLE_METRICS = {"algorithm": "scheduler_scheduling_algorithm_duration_seconds"}


# Its /metrics without a client identity, as its probes are read.
SCHEDULER_ARGS = ("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",)


def scheduler_cycle(plane: ControlPlane, label: str) -> dict[str, float]:
    """Mean milliseconds per attempt of each of `_CYCLE_METRICS` since the scheduler started,
    and the attempts counted, read from its /metrics."""
    sched = plane.schedulers[label]
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{sched.port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for sample in parse_metrics(text):
        for short, family in _CYCLE_METRICS.items():
            if sample.name == family + "_sum":
                sums[short] = sums.get(short, 0.0) + sample.value
            elif sample.name == family + "_count":
                counts[short] = counts.get(short, 0.0) + sample.value
    out = {
        f"{short}_ms": round(sums[short] / counts[short] * 1000, 3)
        for short in sums
        if counts.get(short)
    }
    out["attempts"] = counts.get("algorithm", 0.0)
    return out


def apiserver_counters(kube: Any) -> dict[str, float]:
    """What the API server did for Pods besides serving the benchmark's own calls: watchers of
    Pods it closed for falling behind, the lists and watches of Pods it served (a closed
    watcher comes back as a new watch, or a list), and requests it refused with 429."""
    pool = kube.api_client.rest_client.pool_manager
    text = pool.request("GET", kube._host + "/metrics").data.decode()
    out = {"terminated_pod_watchers": 0.0, "pod_lists": 0.0, "pod_watches": 0.0, "rejected": 0.0}
    for sample in parse_metrics(text):
        labels, value = sample.labels, sample.value
        pods = labels.get("resource") == "pods"
        if sample.name == "apiserver_terminated_watchers_total" and pods:
            out["terminated_pod_watchers"] += value
        elif sample.name == "apiserver_request_total" and pods:
            if not labels.get("subresource"):
                if labels.get("verb") == "LIST":
                    out["pod_lists"] += value
                elif labels.get("verb") == "WATCH":
                    out["pod_watches"] += value
        elif sample.name == "apiserver_flowcontrol_rejected_requests_total":
            out["rejected"] += value
            who = f"rejected {labels.get('priority_level', '')}/{labels.get('flow_schema', '')}"
            out[who] = out.get(who, 0.0) + value
    return out


def placement(bound: dict[str, str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for pod, node in bound.items():
        kind = pod.split("-")[1]
        family = node.rsplit("-", 1)[0]
        out.setdefault(kind, {})
        out[kind][family] = out[kind].get(family, 0) + 1
    return out


def clear(plane: ControlPlane, pods: list[dict[str, Any]]) -> None:
    kube = plane.kube("admin")
    for pod in pods:
        try:
            kube.request(
                "DELETE",
                f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                query={"gracePeriodSeconds": 0},
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
    namespaces = {pod["metadata"]["namespace"] for pod in pods}
    wait_until(
        lambda: (
            not any(
                kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
                for namespace in namespaces
            )
        ),
        timeout=120,
        what="pods to be gone",
    )
