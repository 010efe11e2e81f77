"""What `bench_tenants_scale.py` measures of one run, the same way at 1 tenant and at N: the
owner's rendered objects and Pods, each owner process's memory and CPU, and the measured
tenant's Pod-create and create-to-verified latency.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from inference_policy.base.wire import ENGINE_LABEL
from localcluster import Kube
from localcluster.install.install import Rendered
from localcluster.install.stack import TenantStack
from localcluster.plane.kube import JSON
from localcluster.plane.process import ManagedProcess
from localcluster.servers.engine_pods import CONDITION, condition, engine_pod
from localcluster.servers.server import LocalServer
from localcluster.servers.webhook import is_planned

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary_ms(samples: Sequence[float]) -> dict[str, float | int]:
    if not samples:
        return {"count": 0}
    return {
        "count": len(samples),
        "p50_ms": round(percentile(samples, 0.50) * 1000, 2),
        "p90_ms": round(percentile(samples, 0.90) * 1000, 2),
        "p99_ms": round(percentile(samples, 0.99) * 1000, 2),
        "max_ms": round(max(samples) * 1000, 2),
        "mean_ms": round(statistics.fmean(samples) * 1000, 2),
    }


# -- the owner's objects and Pods ------------------------------------------------------------


def object_counts(owner: Rendered, tenants: Sequence[str]) -> dict[str, Any]:
    """What the owner release installs (its rendered part, Helm hooks aside), by kind, and by
    where: cluster-scoped, in the owner's namespace, in the tenant namespaces (all of them
    together), elsewhere (kube-system)."""
    where: Counter[str] = Counter()
    kinds: dict[str, Counter[str]] = {}
    tenant_set = set(tenants)
    for doc in owner.installed():
        ns = doc["metadata"].get("namespace")
        scope = (
            "cluster"
            if not ns
            else "owner_namespace"
            if ns == owner.namespace
            else "tenant_namespaces"
            if ns in tenant_set
            else "other_namespaces"
        )
        where[scope] += 1
        kinds.setdefault(scope, Counter())[doc["kind"]] += 1
    return {
        "total": sum(where.values()),
        "by_scope": dict(where),
        "by_scope_and_kind": {s: dict(sorted(c.items())) for s, c in sorted(kinds.items())},
    }


def owner_pods(owner: Rendered) -> dict[str, int]:
    """The Pods the owner release runs: each Deployment's replicas."""
    return {
        d["metadata"]["name"]: int(d["spec"].get("replicas", 1))
        for d in owner.installed()
        if d["kind"] == "Deployment"
    }


def runtime_objects(kube: Kube, owner_namespace: str) -> dict[str, int]:
    """What the owner's servers create at run time: Leases in the owner's namespace and the
    extender's room-figure ConfigMaps (one in each tenant namespace)."""
    leases = kube.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{owner_namespace}/leases"
    )["items"]
    rooms = kube.request(
        "GET", "/api/v1/configmaps", query={"fieldSelector": "metadata.name=tmi-binding-room"}
    )["items"]
    return {"leases_in_owner_namespace": len(leases), "room_configmaps": len(rooms)}


# -- the owner's processes ---------------------------------------------------------------------


def owner_processes(stack: TenantStack) -> dict[str, ManagedProcess]:
    assert stack.extender is not None and stack.controller is not None
    found: dict[str, ManagedProcess] = {}
    scheduler = stack.plane.schedulers.get(stack.settings.scheduler_name)
    if scheduler is not None:
        found["scheduler"] = scheduler.process
    if stack.extender.process is not None:
        found["extender"] = stack.extender.process
    for index, replica in enumerate(stack.controller.replicas):
        if replica.process is not None:
            found[f"controller-{index}"] = replica.process
    return found


def context_processes(stack: TenantStack) -> dict[str, int]:
    """Not the owner's, shown beside it: the API server and etcd, and the measured tenant's
    webhook."""
    core = stack.plane.components.core
    pids: dict[str, int] = {
        name: core[name].pid for name in ("kube-apiserver", "etcd") if name in core
    }
    if stack.webhook is not None and stack.webhook.process is not None:
        pids["tenant-webhook"] = stack.webhook.process.pid
    return pids


def owner_servers(stack: TenantStack) -> dict[str, LocalServer]:
    assert stack.extender is not None and stack.controller is not None
    servers: dict[str, LocalServer] = {"extender": stack.extender}
    for index, replica in enumerate(stack.controller.replicas):
        servers[f"controller-{index}"] = replica
    return servers


def sockets(pid: int) -> int:
    """The process's open sockets (its connections to the API server, its listeners)."""
    count = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def readyz(server: LocalServer, ca_file: str) -> str:
    """What the server's /readyz answers, a refusal's reason included."""
    context = ssl.create_default_context(cafile=ca_file) if server.scheme == "https" else None
    try:
        with urllib.request.urlopen(f"{server.url}/readyz", timeout=5, context=context) as resp:
            return f"{resp.status} {resp.read().decode(errors='replace')[:300]}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode(errors='replace')[:300]}"
    except OSError as exc:
        return f"no answer: {exc}"


def log_codes(server: LocalServer, lines: int = 2000) -> dict[str, int]:
    """How often each structured log code appears in the last `lines` lines of its log."""
    found: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for line in server.log_file.read_text(errors="replace").splitlines()[-lines:]:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                found[f"{entry.get('level')} {entry.get('code', '-')}"] += 1
    return dict(found.most_common(8))


def diagnose(stack: TenantStack) -> dict[str, Any]:
    """Each owner server's state when a run could not go on: running, its /readyz, its open
    sockets, its recent log codes."""
    out: dict[str, Any] = {}
    for name, server in owner_servers(stack).items():
        process = server.process
        out[name] = {
            "running": server.running(),
            "readyz": readyz(server, str(stack.plane.ca_file)) if server.running() else None,
            "sockets": sockets(process.pid) if process is not None else None,
            "log_codes": log_codes(server),
        }
    return out


def rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used (its /proc stat)."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return 0.0


def memory(pids: Mapping[str, int], samples: int = 5, interval: float = 1.0) -> dict[str, Any]:
    """Each process's RSS (MiB), the median of `samples` a second apart."""
    seen: dict[str, list[float]] = {name: [] for name in pids}
    for index in range(samples):
        if index:
            time.sleep(interval)
        for name, pid in pids.items():
            seen[name].append(rss_mib(pid))
    return {name: statistics.median(values) for name, values in seen.items()}


def idle_cpu(pids: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU use over `seconds` of nothing asked of it, as a share of one core."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {
        name: round((cpu_seconds(pid) - before[name]) / seconds, 4) for name, pid in pids.items()
    }


# -- the measured tenant's latency ------------------------------------------------------------


def create_latency(
    installer: Kube, namespace: str, request: Mapping[str, Any], creates: int, warmup: int
) -> list[float]:
    """Server-side dry-run creates of engine Pods, one after another, as the tenant's installer:
    each passes the API server's admission (the tenant's webhook, the owner's policies) and
    comes back planned, and none is stored."""
    times: list[float] = []
    for index in range(warmup + creates):
        pod = engine_pod(namespace, request)
        started = time.perf_counter()
        answer = installer.create(pod, dry_run=True)
        elapsed = time.perf_counter() - started
        if not is_planned(answer):
            raise SystemExit(f"a dry-run engine Pod in {namespace} came back unplanned")
        if index >= warmup:
            times.append(elapsed)
    return times


class PodWatch:
    """A watch on one namespace's Pods, on a thread of its own: when each Pod was first seen
    bound to a node and first seen AllocationVerified=True."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.bound: dict[str, float] = {}
        self.verified: dict[str, float] = {}
        self.refused: dict[str, str] = {}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._version = self.kube.request("GET", self.path)["metadata"]["resourceVersion"]
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for event in self.kube.watch(
                    self.path, {"resourceVersion": self._version}, timeout=60
                ):
                    self._seen(event.get("object") or {})
                    if self._stop.is_set():
                        return

    def _seen(self, pod: JSON) -> None:
        now = time.perf_counter()
        metadata = pod.get("metadata") or {}
        self._version = metadata.get("resourceVersion", self._version)
        name = metadata.get("name", "")
        found = condition(pod, CONDITION) or {}
        with self._changed:
            if (pod.get("spec") or {}).get("nodeName") and name not in self.bound:
                self.bound[name] = now
            if found.get("status") == "True" and name not in self.verified:
                self.verified[name] = now
            elif found.get("status") == "False":
                self.refused[name] = str(found.get("reason"))
            self._changed.notify_all()

    def wait(self, name: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        with self._changed:
            while name not in self.verified:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(
                        f"Pod {name} not verified in {timeout:.0f} s "
                        f"(refused: {self.refused.get(name)})"
                    )
                self._changed.wait(left)
            return self.verified[name]

    def stop(self) -> None:
        self._stop.set()


def verified_latency(
    admin: Kube,
    installer: Kube,
    namespace: str,
    request: Mapping[str, Any],
    count: int,
    timeout: float = 120.0,
    progress: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """`count` engine Pods created one after another as the tenant's installer (real creates,
    through the webhook and the policies), each timed from the create request to the watch
    seeing it AllocationVerified=True (and, on the way, bound to a node), then deleted."""
    watch = PodWatch(admin, namespace)
    watch.start()
    out: dict[str, list[float]] = {"create": [], "to_bound": [], "to_verified": []}
    try:
        for index in range(count):
            name = f"measured-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            installer.create(engine_pod(namespace, request, name=name))
            out["create"].append(time.perf_counter() - started)
            verified = watch.wait(name, timeout)
            out["to_verified"].append(verified - started)
            out["to_bound"].append(watch.bound.get(name, verified) - started)
            admin.delete("v1", "Pod", name, namespace, grace_period_seconds=0)
            if progress is not None:
                progress(index + 1)
    finally:
        watch.stop()
    return out


def all_verified(kube: Kube, pods: Mapping[str, str]) -> int:
    """How many of the (namespace -> name) engine Pods are AllocationVerified=True (one list
    of every engine Pod)."""
    listed = kube.request("GET", "/api/v1/pods", query={"labelSelector": ENGINE_LABEL})["items"]
    verified = {
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in listed
        if (condition(p, CONDITION) or {}).get("status") == "True"
    }
    return sum((namespace, name) in verified for namespace, name in pods.items())


__all__ = [
    "PodWatch",
    "all_verified",
    "context_processes",
    "create_latency",
    "diagnose",
    "idle_cpu",
    "memory",
    "object_counts",
    "owner_pods",
    "owner_processes",
    "percentile",
    "runtime_objects",
    "sockets",
    "summary_ms",
    "verified_latency",
]
