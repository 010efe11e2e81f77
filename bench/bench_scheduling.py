"""Scheduling through the real kube-scheduler (v1.36) with and without the tmi extender.

A local control plane (etcd, kube-apiserver, KWOK; `localcluster.ControlPlane`) with a fleet
of fake GPU nodes that carry GPU Feature Discovery's labels. The extender runs as its own
process (`tmi-extender --plain-http`) and authenticates as the user `tmi-extender`, bound to the
ClusterRole and Role of manifests/scheduler/extender-rbac.yaml, so the shipped RBAC is what it
reads nodes, pods and the profile with. kube-scheduler runs with the configuration
`tmi render-scheduler-config` renders for the profile (leader election off, plain HTTP on
loopback), once with the extender, once with a constant extender in its place
(`bench/constant_extender.py`: every node passes, none is scored, so it shows what consulting
any extender costs the scheduler), and once with the same configuration minus the extender, in
eleven repeats that rotate which goes first; the figure is the median of the repeats' paired
ratios (each repeat's runs share whatever else loads the machine), next to the ratio of the
medians. Wall-clock rates on a shared 2-core machine swing by 2x between runs of the same
mode, so each run also records the machine's busy CPU time per Pod bound (/proc/stat, every
process), each control-plane process's and the extender's own: the CPU ratio is the rate ratio
a quiet, CPU-bound machine would show, and moves far less between runs.

The same planned engine Pods (whole GPUs, MIG slices, VRAM shares, as the webhook leaves them)
are created each time before the scheduler starts, the extender's run's in the tenant
namespace it watches and the other two runs' in a namespace beside it (so the extender, which
runs throughout, does not spend the other runs' CPU on their Pods' watch events); the script
measures the time from the
first binding to the last, as a watch opened before the scheduler starts sees them (scheduling
throughput; the scheduler's start-up is outside the window), and counts Pods
bound to nodes whose GFD labels contradict the signed binding (a T4 node and a node without GFD
labels, both advertising nvidia.com/gpu): with the extender there must be none. Beside the
rate, each run records the scheduler's own mean algorithm time per Pod (its serial filters and
scores, the extender's calls included) and what the API server did besides the benchmark's
calls (closed watchers, lists, watches, API Priority and Fairness refusals), whose in-flight
limits are raised so that the scheduler's own requests are not refused (`APISERVER_ARGS`).

Needs the control-plane binaries (`make controlplane`). Run:
`.venv/bin/python bench/bench_scheduling.py`. Writes bench/results/scheduling.json.
"""

from __future__ import annotations

import json
import os
import platform
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path


from inference_policy.base.wire import ENGINE_LABEL as DEPLOYMENT_LABEL  # noqa: E402
from inference_policy.placing.schedconfig import render_scheduler_config  # noqa: E402
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME  # noqa: E402
from kits.extenderkit import (  # noqa: E402
    block,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from kits.fleetkit import a100_mig, cpu_only, h100, l40s, no_gfd, t4  # noqa: E402
from kits.profilekit import CLUSTER, NAMESPACE, Owner  # noqa: E402
from localcluster import ApiError, ControlPlane, FakeNode, create_fake_nodes  # noqa: E402
from localcluster.plane.metrics import parse_metrics  # noqa: E402
from localcluster.plane.process import free_port, wait_until  # noqa: E402
from localcluster.servers.webhook import apply_runtime_class  # noqa: E402

# The kustomize base's (the chart's default) name, which its extender Role names.
PROFILE_CONFIGMAP = DEFAULT_CONFIGMAP_NAME
SCHEDULER = "kamiwaza-inference-scheduler"
PODS = {"whole": 480, "mig": 160, "share": 160}
REPEATS = 11
MANIFESTS = ROOT / "manifests" / "scheduler"
# API Priority and Fairness shares the API server's concurrency (by default 400 + 200 requests
# in flight) among priority levels; on two cores every request is held longer, so the
# scheduler's own level (workload-high) filled up and its bindings were refused with 429 in the
# faster runs, a retry and a backoff each, at random. Four times the default keeps the
# scheduler's requests in, so the figure is the scheduler's and the extender's, not the
# throttle's; the rejections per run are recorded (`apiserver_per_run`).
APISERVER_ARGS = ("--max-requests-inflight=1600", "--max-mutating-requests-inflight=800")


def fleet() -> list[FakeNode]:
    nodes = [h100(f"h100-{i:02d}") for i in range(64)]
    nodes += [a100_mig(f"a100-mig-{i:02d}", gpus=4, slices=8) for i in range(24)]
    nodes += [l40s(f"l40s-{i:02d}") for i in range(32)]
    nodes += [cpu_only(f"cpu-{i:02d}") for i in range(8)]
    # Nodes whose facts contradict the whole-GPU binding (cc 8.0, CUDA 13): a T4 (cc 7.5) and a
    # node with no GFD labels. Both advertise nvidia.com/gpu, so the scheduler alone would use
    # them.
    nodes.append(t4("t4-00", vram_gb=80, gpus=8))
    nodes.append(no_gfd("no-gfd-00"))
    return nodes


CONTRADICTED = {"t4-00", "no-gfd-00"}


def _grant_extender(plane: ControlPlane) -> None:
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
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "bench-tmi-extender-user", "namespace": NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "tmi-extender-read-profiles",
            },
            "subjects": [user],
        }
    )


def _start_extender(plane: ControlPlane, owner: Owner, port: int) -> subprocess.Popen[bytes]:
    return _serve(
        plane,
        "tmi-extender",
        [
            str(ROOT / ".venv" / "bin" / "tmi-extender"),
            "--plain-http",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--namespace={NAMESPACE}",
            f"--bundle-configmap={PROFILE_CONFIGMAP}",
            f"--owner-public-key={owner.public_key}",
            f"--cluster-binding-id={CLUSTER}",
            f"--kubeconfig={plane.kubeconfig('tmi-extender')}",
        ],
        port,
    )


def _start_constant_extender(plane: ControlPlane, port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(ROOT / "bench" / "constant_extender.py"), f"--port={port}"]
    return _serve(plane, "constant-extender", argv, port)


def _serve(plane: ControlPlane, name: str, argv: list[str], port: int) -> subprocess.Popen[bytes]:
    """Start an extender process, its output in the plane's logs, once its /readyz answers."""
    log = (plane.logs_dir / f"{name}.log").open("wb")
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_until(ready, timeout=60, what=f"{name} /readyz")
    return process


# The constant extender's and the extender-less runs' Pods: the same Pods, in a namespace the
# extender's Pod informer does not watch.
OTHER_NAMESPACE = "bench-other-runs"


def _pods(owner: Owner, envelope: dict[str, Any], run: str, namespace: str) -> list[dict[str, Any]]:
    plans = {
        "whole": plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole"))),
        "mig": plan_for(owner, envelope, request(inferenceResources=block("nvidia-mig-3g40gb"))),
        "share": plan_for(owner, envelope, request(inferenceResources=block("nvidia-vram-share"))),
    }
    pods = []
    for kind, count in PODS.items():
        for i in range(count):
            pod = planned_pod(plans[kind], name=f"{run}-{kind}-{i:03d}")
            pod["apiVersion"], pod["kind"] = "v1", "Pod"
            del pod["metadata"]["uid"]
            del pod["status"]
            pod["metadata"]["labels"] = {DEPLOYMENT_LABEL: f"{run}-{kind}-{i:03d}"}
            pod["metadata"]["namespace"] = namespace
            pods.append(pod)
    return pods


def _busy_seconds() -> float:
    """CPU time the whole machine has spent busy (every process, user and system), from
    /proc/stat: what the control plane, the scheduler and the extender cost together."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _process_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def _run(
    plane: ControlPlane,
    pods: list[dict[str, Any]],
    label: str,
    config: dict[str, Any],
    extender_pid: int | None,
    timeout: float = 300,
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
    counters = _apiserver_counters(kube)
    window = _Window(plane, label, extender_pid)
    watcher = threading.Thread(
        target=_wait_bound,
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
        cycle = _scheduler_cycle(plane, label)
    finally:
        plane.stop_scheduler(label)
    if window.error is not None:
        raise window.error
    after = _apiserver_counters(kube)
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
        "on_contradicted_nodes": sorted({n for n in bound.values() if n in CONTRADICTED}),
        "pods_on_contradicted_nodes": sum(1 for n in bound.values() if n in CONTRADICTED),
        "placement": _placement(bound),
        "apiserver": {name: after[name] - counters.get(name, 0.0) for name in sorted(after)},
        "benchmark_watch_resumed": window.resumed,
        "scheduler_cycle": cycle,
    }


@dataclass
class _Instant:
    at: float
    busy: float
    components: dict[str, float]


class _Window:
    """The first and the last binding of a run, each with the CPU every process had spent by
    then; filled by the watching thread."""

    def __init__(self, plane: ControlPlane, label: str, extender_pid: int | None) -> None:
        self.plane = plane
        self.label = label
        self.extender_pid = extender_pid
        self.first: _Instant | None = None
        self.last: _Instant | None = None
        self.count = 0
        self.resumed = 0
        self.error: BaseException | None = None

    def bound(self, done: bool) -> None:
        self.count += 1
        if self.first is None or done:
            instant = _Instant(time.perf_counter(), _busy_seconds(), self._components())
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
                out[name] = _process_seconds(pid)
            except OSError:
                continue
        return out


def _wait_bound(
    kube: Any, path: str, version: str, names: set[str], timeout: float, window: _Window
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


def _scheduler_cycle(plane: ControlPlane, label: str) -> dict[str, float]:
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


def _apiserver_counters(kube: Any) -> dict[str, float]:
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


def _placement(bound: dict[str, str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for pod, node in bound.items():
        kind = pod.split("-")[1]
        family = node.rsplit("-", 1)[0]
        out.setdefault(kind, {})
        out[kind][family] = out[kind].get(family, 0) + 1
    return out


def _clear(plane: ControlPlane, pods: list[dict[str, Any]]) -> None:
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


def main() -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    configmap = owner.sign(envelope, name=PROFILE_CONFIGMAP)
    results: dict[str, Any] = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "nodes": len(fleet()),
        "workload": PODS,
    }
    plane = ControlPlane.start(start_scheduler=False, apiserver_args=APISERVER_ARGS)
    extender: subprocess.Popen[bytes] | None = None
    constant: subprocess.Popen[bytes] | None = None
    try:
        plane.create_namespace(NAMESPACE)
        plane.create_namespace(OTHER_NAMESPACE)
        # The planned Pods name the plan's RuntimeClass, which the API server must know.
        apply_runtime_class(plane, "nvidia")
        plane.kube("admin").create({**configmap, "metadata": {**configmap["metadata"]}})
        _grant_extender(plane)
        create_fake_nodes(plane.kube("admin"), fleet())
        port = free_port()
        extender = _start_extender(plane, owner, port)
        config = render_scheduler_config(extender_url=f"http://127.0.0.1:{port}")
        config["leaderElection"] = {"leaderElect": False}
        # The default client rate limit (50 QPS) would cap both runs at the bind rate and hide
        # the extender's cost; lift it so the scheduling cycle itself is measured.
        config["clientConnection"] = {"qps": 1000, "burst": 2000}
        results["scheduler_config_extender"] = config["extenders"][0]
        constant_port = free_port()
        constant = _start_constant_extender(plane, constant_port)
        constant_config = {
            **config,
            "extenders": [
                {**config["extenders"][0], "urlPrefix": f"http://127.0.0.1:{constant_port}"}
            ],
        }
        runs: dict[str, Any] = {}
        modes = (
            ("with_extender", config, extender.pid),
            ("constant_extender", constant_config, constant.pid),
            ("without_extender", {k: v for k, v in config.items() if k != "extenders"}, None),
        )
        paired: list[float] = []
        paired_constant: list[float] = []
        cpu: dict[str, list[float]] = {label: [] for label, _, _ in modes}
        extender_cpu: dict[str, list[float]] = {"with_extender": [], "constant_extender": []}
        components: dict[str, dict[str, list[float]]] = {label: {} for label, _, _ in modes}
        apiserver: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in modes}
        cycles: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in modes}
        for repeat in range(REPEATS):
            # Rotate which mode goes first, and compare the runs of each repeat: a neighbour's
            # load on a shared machine then hits the modes of a repeat alike.
            rates_now: dict[str, float] = {}
            shift = repeat % len(modes)
            for label, cfg, pid in modes[shift:] + modes[:shift]:
                namespace = NAMESPACE if label == "with_extender" else OTHER_NAMESPACE
                pods = _pods(owner, envelope, f"{label.replace('_', '')}{repeat}", namespace)
                run = _run(plane, pods, label, cfg, pid)
                _clear(plane, pods)
                cpu[label].append(run.pop("machine_cpu_ms_per_pod"))
                for name, value in run.pop("component_cpu_ms_per_pod").items():
                    components[label].setdefault(name, []).append(value)
                cycles[label].append(run.pop("scheduler_cycle"))
                apiserver[label].append(
                    {
                        **run.pop("apiserver"),
                        "benchmark_watch_resumed": run.pop("benchmark_watch_resumed"),
                    }
                )
                spent = run.pop("extender_cpu_ms_per_pod")
                if label in extender_cpu:
                    extender_cpu[label].append(spent)
                best = runs.get(label)
                rates = [*(best or {}).get("pods_per_second_runs", []), run["pods_per_second"]]
                run["pods_per_second_runs"] = rates
                run["bound_before_readiness_seen"] = [
                    *(best or {}).get("bound_before_readiness_seen", []),
                    run["bound_before_readiness_seen"],
                ]
                run["pods_per_second"] = sorted(rates)[len(rates) // 2]
                runs[label] = run
                rates_now[label] = rates[-1]
            paired.append(rates_now["with_extender"] / rates_now["without_extender"])
            paired_constant.append(rates_now["constant_extender"] / rates_now["without_extender"])
        results["runs"] = runs
        results["paired_throughput_ratios"] = [round(r, 3) for r in paired]
        results["median_paired_throughput_ratio"] = round(sorted(paired)[len(paired) // 2], 3)
        results["median_paired_throughput_ratio_constant_vs_without"] = round(
            sorted(paired_constant)[len(paired_constant) // 2], 3
        )
        # CPU per Pod: the median of the repeats, and the rate ratio it implies when the machine
        # is CPU-bound (without / with: the extender's CPU is what it adds).
        median_cpu = {label: sorted(v)[len(v) // 2] for label, v in cpu.items()}
        results["machine_cpu_ms_per_pod"] = {
            label: {"median": median_cpu[label], "runs": values} for label, values in cpu.items()
        }
        results["extender_cpu_ms_per_pod"] = {
            label: {"median": sorted(values)[len(values) // 2], "runs": values}
            for label, values in extender_cpu.items()
        }
        results["component_cpu_ms_per_pod"] = {
            label: {
                name: {"median": sorted(v)[len(v) // 2], "runs": v}
                for name, v in sorted(by_name.items())
            }
            for label, by_name in components.items()
        }
        # Per run: what the API server did beyond the benchmark's calls (see
        # `_apiserver_counters`), the figures behind its CPU per Pod.
        results["apiserver_per_run"] = apiserver
        results["scheduler_cycle_per_run"] = cycles
        results["scheduler_cycle_median_ms"] = {
            label: {
                key: sorted(run[key] for run in runs_of)[len(runs_of) // 2]
                for key in ("algorithm_ms",)
                if all(key in run for run in runs_of)
            }
            for label, runs_of in cycles.items()
        }
        results["cpu_throughput_ratio_with_vs_without"] = round(
            median_cpu["without_extender"] / median_cpu["with_extender"], 3
        )
        results["cpu_throughput_ratio_constant_vs_without"] = round(
            median_cpu["without_extender"] / median_cpu["constant_extender"], 3
        )
        results["cpu_throughput_ratio_with_vs_constant"] = round(
            median_cpu["constant_extender"] / median_cpu["with_extender"], 3
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        results["extender_metrics"] = [
            line
            for line in metrics.splitlines()
            if line.startswith(
                (
                    "tmi_extender_requests_total",
                    "tmi_extender_node_verdicts_total",
                    "tmi_extender_informer_events",
                )
            )
        ]
    finally:
        for process in (extender, constant):
            if process is not None:
                process.terminate()
                process.wait(15)
        plane.stop()
    with_ext, without = results["runs"]["with_extender"], results["runs"]["without_extender"]
    results["throughput_ratio_with_vs_without"] = round(
        with_ext["pods_per_second"] / without["pods_per_second"], 3
    )
    results["throughput_ratio_constant_vs_without"] = round(
        results["runs"]["constant_extender"]["pods_per_second"] / without["pods_per_second"], 3
    )
    results["extender_kept_pods_off_contradicted_nodes"] = (
        with_ext["pods_on_contradicted_nodes"] == 0
    )
    text = json.dumps(results, indent=2)
    print(text)
    out = ROOT / "bench" / "results" / "scheduling.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
