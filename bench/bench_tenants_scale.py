"""What the owner's side costs for N tenant namespaces against one: its objects, its Pods, each
of its processes' memory, and one tenant's Pod-create and create-to-verified latency.

Why: one owner release serves every tenant namespace (`owner.tenants`): one scheduler, one
extender, one allocation controller Deployment under one Lease, the admission policies bound
once with per-tenant parameters. What should grow with tenants is only their parameters and
the Roles the owner holds in each namespace; the Pods, a tenant's latency and each process's
memory should stay flat (the target: N tenants within 1.1x of one).

Each count is a run of its own on a fresh local control plane (`localcluster`: etcd,
kube-apiserver, kube-controller-manager, the default kube-scheduler, KWOK), first 1 tenant, then
each N (`--tenants`, default 100). Every run has the same fleet: ceil(largest N / 8) + 1 KWOK
nodes of 8 H100s each (`FakeNode(..., gpus=8)`). In each:

1. the measured tenant (the first) and the owner side are installed from the chart as users
   install them (`localcluster.install.stack.deploy_stack`): the tenant part by its namespace's
   installer, its webhook a local process under its ServiceAccount; the owner part by the
   cluster admin, the extender, the owner's kube-scheduler and two allocation-controller
   replicas local processes under theirs;
2. the N - 1 further tenants (`tenants_scale_setup.install_further`): each its namespace, its
   installer, its profile signed for its namespace by the same owner key, its `owner.tenants`
   entry; the owner part rendered once with every entry and applied, and the extender and the
   controller rolled once, a replica at a time, as `helm upgrade` rolls them (the 1-tenant run
   does the same upgrade with no entries, so both runs' processes have the same history);
3. one engine Pod (a 72B model on one whole H100) in every tenant namespace, all
   AllocationVerified=True before anything is measured;
4. the owner's rendered objects and Pods counted; after `SETTLE_SECONDS`, each owner process's
   RSS (VmRSS, the median of five samples a second apart: the extender, each controller
   replica, the owner's kube-scheduler; the API server, etcd and the tenant's webhook beside
   them, not the owner's), its open sockets (its connections to the API server), its CPU over
   `IDLE_SECONDS` with nothing asked of it, and what the owner's servers ask of the API server
   meanwhile (room-figure ConfigMap writes, rights reviews, from its request counters);
5. the measured tenant's latency: `--creates` server-side dry-run creates of engine Pods as its
   installer, one after another, after `--warmup` (each through the API server's admission:
   the tenant's webhook and the owner's policies; planned, not stored), and `--verified` real
   creates, one after another, each timed from the create request to a watch seeing it
   AllocationVerified=True (scheduled by the owner's scheduler and extender, run by KWOK,
   verified by the controller) and then deleted.

Simulated, and why: the further tenants' webhooks. A tenant's webhook is the tenant's own
process, not the owner's, and 99 more Python servers would take this 2-core machine's CPU from
what is measured. So each further tenant's engine Pod is planned in this process by the
webhook's own code (`webhook.admission.Reviewer`, with the settings the tenant part's Deployment
runs with and the ConfigMaps its informers read: the tenant's profile and the room figures the
extender wrote into its namespace), created so planned through the API server as the tenant's
installer (the owner's policies check it), and only then is the tenant's
MutatingWebhookConfiguration applied, exactly as the chart renders it (pointing at the address
the tenant's webhook would have, where nothing listens: applied first, it would make the API
server refuse the create). The measured tenant's webhook process and the code here answer the
same review alike (`in_process_check` in the results), and the further tenants' stored Pods
differ from the measured tenant's only where their profiles do (`stored_difference`: the plan's
bundle digest, since each profile is signed for its own namespace). The controller verifies
every one of them (step 3). The tenant parts of the further tenants are not installed (their
webhooks' Deployments, Roles and Services are the tenants', not the owner's).

A run whose owner side cannot serve N tenants (a server not ready within a minute of its
roll, the engine Pods not all verified within five minutes) is recorded as `failed`, with each
owner server's /readyz, open sockets and recent log codes, and the script goes on and exits 0:
that is a measurement too.

Figures (`summary`, one for each N): owner Pods at 1 and N, owner objects per added tenant
(by where and kind), each owner process's RSS at 1 and N with (RSS at N - RSS at 1) / (N - 1)
per tenant and its open sockets, the create p99 and the create-to-verified p50/p99 at 1 and N,
each ratio N/1 against 1.1 (with a 90% bootstrap interval for the p99 ratios). The 1-minute
load average is recorded before each run; a run waits (at most `LOAD_WAIT_SECONDS` in all)
for it to fall under `MAX_LOAD`.

Run: `.venv/bin/python bench/bench_tenants_scale.py [--tenants 100 [N ...]] [--creates 2000]
[--warmup 20] [--verified 200]`; needs the control-plane binaries (`make controlplane`). The
default run takes about four minutes on 2 cores (five when the 100-tenant run gets that
far). Writes bench/results/tenants_scale.json as it goes (a killed run keeps what it
measured). It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from bench_pod_create import p99_ratio_interval  # noqa: E402
from bench_tenant_junk import build  # noqa: E402
from tenants_scale_measure import (  # noqa: E402
    all_verified,
    context_processes,
    create_latency,
    diagnose,
    idle_cpu,
    memory,
    object_counts,
    owner_pods,
    owner_processes,
    runtime_objects,
    sockets,
    summary_ms,
    verified_latency,
)
from tenants_scale_setup import check_in_process, install_further, stored_difference  # noqa: E402

from kits.profilekit import CLUSTER, Owner  # noqa: E402
from kits.stackkit import LARGE, whole_h100_envelope  # noqa: E402
from localcluster import ControlPlane, FakeNode, Kube, create_fake_nodes, versions  # noqa: E402
from localcluster.install.install import INSTALLER  # noqa: E402
from localcluster.install.stack import StackSettings, TenantStack, deploy_stack  # noqa: E402
from localcluster.plane.metrics import metric, parse_metrics  # noqa: E402
from localcluster.plane.process import ComponentError, wait_until  # noqa: E402
from localcluster.servers.engine_pods import engine_pod  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "tenants_scale.json"
TARGET = 1.1
GPUS_PER_NODE = 8
SETTLE_SECONDS = 10.0
IDLE_SECONDS = 20.0
MAX_LOAD = 2.0
LOAD_WAIT_SECONDS = 600.0
PROCESSES = ("scheduler", "extender", "controller-0", "controller-1")


class Record:
    """The results, written out whole after every step."""

    def __init__(self, args: argparse.Namespace, nodes: int) -> None:
        self.started = time.monotonic()
        self.load_waited = 0.0
        self.results: dict[str, Any] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "build": build(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "python": platform.python_version(),
            "kubernetes": versions().kubernetes,
            "tenants": [1, *args.tenants],
            "fleet": f"{nodes} KWOK nodes x {GPUS_PER_NODE} NVIDIA-H100-80GB-HBM3",
            "creates": args.creates,
            "warmup": args.warmup,
            "verified_pods": args.verified,
            "target_ratio": TARGET,
            "simulated": (
                "the further tenants' webhooks: each further tenant's engine Pod planned in "
                "the benchmark's process by the webhook's code with that tenant's settings and "
                "ConfigMaps, created through the API server (owner policies acting), and the "
                "tenant's MutatingWebhookConfiguration applied after it; the further tenants' "
                "own chart parts are not installed"
            ),
            "runs": {},
        }

    def write(self) -> None:
        self.results["seconds"] = round(time.monotonic() - self.started, 1)
        self.results["load_waited_seconds"] = round(self.load_waited, 1)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(self.results, indent=1) + "\n")

    def step(self, run: dict[str, Any], what: str) -> None:
        run.setdefault("steps", []).append(
            [what, round(time.monotonic() - self.started, 1), round(os.getloadavg()[0], 2)]
        )
        print(f"[{run['tenants']} tenants] {what}", file=sys.stderr, flush=True)
        self.write()


def wait_for_quiet(record: Record) -> float:
    """The 1-minute load average, once under MAX_LOAD or the waiting allowance is spent."""
    while (load := os.getloadavg()[0]) > MAX_LOAD and record.load_waited < LOAD_WAIT_SECONDS:
        print(f"load {load:.2f} > {MAX_LOAD}: waiting", file=sys.stderr, flush=True)
        time.sleep(30)
        record.load_waited += 30
    return round(load, 2)


def apiserver_counts(kube: Kube) -> dict[str, float]:
    """The API server's request counters for what the owner's servers ask of it steadily: the
    room figures (ConfigMap PUTs), the rights reviews (SubjectAccessReviews by the extender,
    SelfSubjectAccessReviews by the controller) and the verdicts (Pod status patches)."""
    text = str(kube.request("GET", "/metrics").get("raw", ""))
    samples = parse_metrics(text)
    total = "apiserver_request_total"
    return {
        "configmap_puts": metric(samples, total, resource="configmaps", verb="PUT"),
        "subject_access_reviews": metric(samples, total, resource="subjectaccessreviews"),
        "self_subject_access_reviews": metric(samples, total, resource="selfsubjectaccessreviews"),
        "pod_status_patches": metric(
            samples, total, resource="pods", subresource="status", verb="PATCH"
        ),
    }


def measure(
    stack: TenantStack,
    owner: Owner,
    names: list[str],
    args: argparse.Namespace,
    nodes: int,
    record: Record,
    run: dict[str, Any],
) -> None:
    plane = stack.plane
    assert stack.extender is not None
    admin, installer = plane.kube("admin"), plane.kube(INSTALLER)
    fleet = [FakeNode(f"scale-h100-{i:02d}", gpus=GPUS_PER_NODE, vram_gb=80) for i in range(nodes)]
    create_fake_nodes(admin, fleet)
    stack.extender.wait_nodes([n.name for n in fleet])
    record.step(run, "stack deployed, nodes created")

    further = install_further(stack, owner, names[1:], LARGE)
    record.step(run, f"{len(names) - 1} further tenants installed, owner upgraded and rolled")
    first = f"engine-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(names[0], LARGE, name=first))
    pods = {names[0]: first, **further.pods}
    wait_until(
        lambda: all_verified(admin, pods) == len(pods),
        timeout=300,
        what=f"{len(pods)} engine Pods AllocationVerified=True",
        interval=1.0,
    )
    run["engine_pods_verified"] = all_verified(admin, pods)
    record.step(run, "every tenant's engine Pod verified")

    run["in_process_check"] = check_in_process(stack, engine_pod(names[0], LARGE, name="check"))
    if further.namespaces:
        second = further.namespaces[0]
        run["stored_difference"] = stored_difference(
            admin.get("v1", "Pod", first, names[0]),
            admin.get("v1", "Pod", further.pods[second], second),
        )
    assert stack.owner is not None
    run["owner_objects"] = object_counts(stack.owner, names)
    run["owner_pods"] = owner_pods(stack.owner)
    processes = owner_processes(stack)
    run["owner_processes_run"] = sorted(processes)
    run["runtime_objects"] = runtime_objects(admin, stack.settings.scheduler_namespace)
    time.sleep(SETTLE_SECONDS)
    pids = {name: process.pid for name, process in processes.items()}
    context = context_processes(stack)
    run["rss_mib"] = memory(pids)
    run["sockets"] = {name: sockets(pid) for name, pid in pids.items()}
    run["context_rss_mib"] = memory(context)
    before = apiserver_counts(admin)
    run["idle_cpu_share_of_one_core"] = idle_cpu({**pids, **context}, IDLE_SECONDS)
    after = apiserver_counts(admin)
    run["idle_api_calls_per_second"] = {
        k: round((after[k] - before[k]) / IDLE_SECONDS, 2) for k in after
    }
    record.step(run, "objects, memory and idle CPU measured")

    creates = create_latency(installer, names[0], LARGE, args.creates, args.warmup)
    run["create"] = summary_ms(creates)
    run["create_samples_ms"] = [round(t * 1000, 2) for t in creates]
    record.step(run, f"{args.creates} dry-run creates")
    before = apiserver_counts(admin)
    started = time.monotonic()
    timed = verified_latency(admin, installer, names[0], LARGE, args.verified)
    elapsed = time.monotonic() - started
    after = apiserver_counts(admin)
    run["verified"] = {k: summary_ms(v) for k, v in timed.items()}
    run["to_verified_samples_ms"] = [round(t * 1000, 1) for t in timed["to_verified"]]
    run["api_calls_per_verified_pod"] = {
        k: round((after[k] - before[k]) / args.verified, 1) for k in after
    }
    run["verified_phase_seconds"] = round(elapsed, 1)
    run["rss_mib_after_latency"] = memory(pids)
    run["load_average_after"] = round(os.getloadavg()[0], 2)
    record.step(run, f"{args.verified} Pods created to verified")


def one_run(tenants: int, args: argparse.Namespace, nodes: int, record: Record) -> bool:
    """One run on a fresh control plane; False, with the error and each owner server's state
    in the results, when the owner side could not serve this many tenants."""
    run: dict[str, Any] = {"tenants": tenants, "load_average_before": wait_for_quiet(record)}
    record.results["runs"][str(tenants)] = run
    owner = Owner()
    prefix = f"tmi-scale-{uuid.uuid4().hex[:4]}"
    names = [f"{prefix}-{i:03d}" for i in range(tenants)]
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=names[0],
        scheduling_timeout_seconds=120,
    )
    plane = ControlPlane.start()
    try:
        profile = owner.sign(whole_h100_envelope(owner, names[0]), name=settings.bundle_configmap)
        stack = deploy_stack(plane, settings, profile)
        try:
            measure(stack, owner, names, args, nodes, record, run)
        except (ComponentError, TimeoutError, SystemExit) as exc:
            run["failed"] = str(exc).split("; log ")[0][:1500]
            run["owner_servers_at_failure"] = diagnose(stack)
            if stack.owner is not None:
                run["owner_objects"] = object_counts(stack.owner, names)
                run["owner_pods"] = owner_pods(stack.owner)
            record.step(run, f"failed: {run['failed'][:200]}")
            return False
        finally:
            # The plane goes with everything on it: nothing to delete object by object.
            stack.applied.clear()
            stack.stop()
    finally:
        plane.stop()
    record.step(run, "done")
    return True


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def compare(results: dict[str, Any], tenants: int) -> dict[str, Any]:
    """The figures at 1 and at N side by side, and whether each meets the target."""
    one, many = results["runs"].get("1"), results["runs"].get(str(tenants))
    if not one or "verified" not in one or not many:
        return {}
    if "verified" not in many:
        servers = many.get("owner_servers_at_failure") or {}
        return {
            "failed": many.get("failed", "the run did not finish"),
            "unready": {
                name: state["readyz"]
                for name, state in servers.items()
                if not str(state.get("readyz")).startswith("200")
            },
            "sockets": {name: state.get("sockets") for name, state in servers.items()},
            "owner_pods": {
                "at_1": sum(one["owner_pods"].values()),
                f"at_{tenants}": sum((many.get("owner_pods") or {}).values()),
            },
            "meets_target": False,
        }
    added = tenants - 1
    pods_1, pods_n = sum(one["owner_pods"].values()), sum(many["owner_pods"].values())
    objects_1, objects_n = one["owner_objects"], many["owner_objects"]
    per_kind: dict[str, float] = {}
    for scope, kinds in objects_n["by_scope_and_kind"].items():
        for kind, count in kinds.items():
            before = objects_1["by_scope_and_kind"].get(scope, {}).get(kind, 0)
            if count != before:
                per_kind[f"{scope}/{kind}"] = round((count - before) / added, 2)
    rss: dict[str, Any] = {}
    for name in PROCESSES:
        a, b = one["rss_mib"].get(name), many["rss_mib"].get(name)
        if a and b:
            rss[name] = {
                "at_1_mib": a,
                f"at_{tenants}_mib": b,
                "per_tenant_mib": round((b - a) / added, 3),
                "ratio": _ratio(b, a),
                "within_target": b / a <= TARGET,
                "sockets_at_1": one["sockets"].get(name),
                f"sockets_at_{tenants}": many["sockets"].get(name),
            }
    create_1, create_n = one["create"]["p99_ms"], many["create"]["p99_ms"]
    to_1, to_n = one["verified"]["to_verified"], many["verified"]["to_verified"]
    seconds = (
        [t / 1000 for t in one["create_samples_ms"]],
        [t / 1000 for t in many["create_samples_ms"]],
    )
    verified = (
        [t / 1000 for t in one["to_verified_samples_ms"]],
        [t / 1000 for t in many["to_verified_samples_ms"]],
    )
    out: dict[str, Any] = {
        "owner_pods": {"at_1": pods_1, f"at_{tenants}": pods_n, "ratio": _ratio(pods_n, pods_1)},
        "owner_objects": {
            "at_1": objects_1["total"],
            f"at_{tenants}": objects_n["total"],
            "per_added_tenant": round((objects_n["total"] - objects_1["total"]) / added, 2),
            "per_added_tenant_by_scope_and_kind": per_kind,
        },
        "rss": rss,
        "create_p99": {
            "at_1_ms": create_1,
            f"at_{tenants}_ms": create_n,
            "ratio": _ratio(create_n, create_1),
            "ratio_90pct_interval": p99_ratio_interval(seconds[1], seconds[0]),
        },
        "to_verified": {
            "p50_at_1_ms": to_1["p50_ms"],
            f"p50_at_{tenants}_ms": to_n["p50_ms"],
            "p50_ratio": _ratio(to_n["p50_ms"], to_1["p50_ms"]),
            "p99_at_1_ms": to_1["p99_ms"],
            f"p99_at_{tenants}_ms": to_n["p99_ms"],
            "p99_ratio": _ratio(to_n["p99_ms"], to_1["p99_ms"]),
            "p99_ratio_90pct_interval": p99_ratio_interval(verified[1], verified[0]),
        },
    }
    out["meets_target"] = {
        "owner_pods": pods_n <= TARGET * pods_1,
        "create_p99": create_n <= TARGET * create_1,
        "to_verified_p99": to_n["p99_ms"] <= TARGET * to_1["p99_ms"],
        "memory": all(r["within_target"] for r in rss.values()),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--tenants",
        type=int,
        nargs="+",
        default=[100],
        help="tenant namespace counts to compare with one (each a run of its own)",
    )
    parser.add_argument("--creates", type=int, default=2000, help="timed dry-run creates")
    parser.add_argument("--warmup", type=int, default=20, help="untimed creates first")
    parser.add_argument("--verified", type=int, default=200, help="Pods timed to verified")
    args = parser.parse_args()
    if min(args.tenants) < 2:
        parser.error("--tenants: each count must be at least 2")
    nodes = math.ceil(max(args.tenants) / GPUS_PER_NODE) + 1
    record = Record(args, nodes)
    try:
        if not one_run(1, args, nodes, record):
            raise SystemExit("the 1-tenant run failed: see bench/results/tenants_scale.json")
        for tenants in args.tenants:
            one_run(tenants, args, nodes, record)
            record.results["summary"] = {str(n): compare(record.results, n) for n in args.tenants}
            record.write()
    finally:
        record.write()
    print(json.dumps(record.results.get("summary"), indent=1))


if __name__ == "__main__":
    main()
