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
repeats that rotate which goes first (three by default, `--repeats 11` for the longer run); the
figure is the median of the repeats' paired
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

The machinery (the run, the extender processes, the figures read beside the rate) is
`scheduling_run.py`, shared with `bench_dra.py` and `bench_peer.py`.

Needs the control-plane binaries (`make controlplane`). Run:
`.venv/bin/python bench/bench_scheduling.py [--repeats 3]` (about five minutes). Writes
bench/results/scheduling.json after each repeat, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path
sys.path.insert(0, str(ROOT / "bench"))

from scheduling_run import (  # noqa: E402
    APISERVER_ARGS,
    PROFILE_CONFIGMAP,
    clear,
    grant_extender,
    run,
    start_constant_extender,
    start_extender,
)

from inference_policy.base.wire import ENGINE_LABEL as DEPLOYMENT_LABEL  # noqa: E402
from inference_policy.placing.schedconfig import render_scheduler_config  # noqa: E402
from kits.extenderkit import (  # noqa: E402
    block,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from kits.fleetkit import a100_mig, cpu_only, h100, l40s, no_gfd, t4  # noqa: E402
from kits.profilekit import NAMESPACE, Owner  # noqa: E402
from localcluster import ControlPlane, FakeNode, create_fake_nodes  # noqa: E402
from localcluster.plane.process import free_port  # noqa: E402
from localcluster.servers.webhook import apply_runtime_class  # noqa: E402

SCHEDULER = "kamiwaza-inference-scheduler"
PODS = {"whole": 480, "mig": 160, "share": 160}
# Three repeats of the three modes schedule 7,200 Pods, about five minutes here (a repeat took
# about a minute and a half on 2 cores under a load of 3.6); `--repeats 11` is the longer run
# the earlier figures came from.
REPEATS = 3
RESULTS = ROOT / "bench" / "results" / "scheduling.json"


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


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


class _Record:
    """Every figure of the runs so far, rewritten to scheduling.json after each repeat, so a
    run stopped early keeps its completed repeats."""

    def __init__(self, results: dict[str, Any], labels: list[str]) -> None:
        self.results = results
        self.runs: dict[str, Any] = {}
        self.paired: list[float] = []
        self.paired_constant: list[float] = []
        self.cpu: dict[str, list[float]] = {label: [] for label in labels}
        self.extender_cpu: dict[str, list[float]] = {"with_extender": [], "constant_extender": []}
        self.components: dict[str, dict[str, list[float]]] = {label: {} for label in labels}
        self.apiserver: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
        self.cycles: dict[str, list[dict[str, float]]] = {label: [] for label in labels}

    def add(self, label: str, run_: dict[str, Any]) -> float:
        """Keep one run's figures; its rate."""
        self.cpu[label].append(run_.pop("machine_cpu_ms_per_pod"))
        for name, value in run_.pop("component_cpu_ms_per_pod").items():
            self.components[label].setdefault(name, []).append(value)
        self.cycles[label].append(run_.pop("scheduler_cycle"))
        self.apiserver[label].append(
            {
                **run_.pop("apiserver"),
                "benchmark_watch_resumed": run_.pop("benchmark_watch_resumed"),
            }
        )
        spent = run_.pop("extender_cpu_ms_per_pod")
        if label in self.extender_cpu:
            self.extender_cpu[label].append(spent)
        best = self.runs.get(label) or {}
        rates = [*best.get("pods_per_second_runs", []), run_["pods_per_second"]]
        run_["pods_per_second_runs"] = rates
        run_["bound_before_readiness_seen"] = [
            *best.get("bound_before_readiness_seen", []),
            run_["bound_before_readiness_seen"],
        ]
        run_["pods_per_second"] = _median(rates)
        self.runs[label] = run_
        return float(rates[-1])

    def write(self) -> None:
        results = self.results
        results["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
        results["repeats_done"] = len(self.paired)
        results["load_average_1m_after_repeat"] = [
            *results.get("load_average_1m_after_repeat", []),
            round(os.getloadavg()[0], 2),
        ]
        results["runs"] = self.runs
        results["paired_throughput_ratios"] = [round(r, 3) for r in self.paired]
        results["median_paired_throughput_ratio"] = round(_median(self.paired), 3)
        results["median_paired_throughput_ratio_constant_vs_without"] = round(
            _median(self.paired_constant), 3
        )
        # CPU per Pod: the median of the repeats, and the rate ratio it implies when the machine
        # is CPU-bound (without / with: the extender's CPU is what it adds).
        median_cpu = {label: _median(v) for label, v in self.cpu.items()}
        results["machine_cpu_ms_per_pod"] = {
            label: {"median": median_cpu[label], "runs": values}
            for label, values in self.cpu.items()
        }
        results["extender_cpu_ms_per_pod"] = {
            label: {"median": _median(values), "runs": values}
            for label, values in self.extender_cpu.items()
        }
        results["component_cpu_ms_per_pod"] = {
            label: {name: {"median": _median(v), "runs": v} for name, v in sorted(by.items())}
            for label, by in self.components.items()
        }
        # Per run: what the API server did beyond the benchmark's calls (see
        # `apiserver_counters`), the figures behind its CPU per Pod.
        results["apiserver_per_run"] = self.apiserver
        results["scheduler_cycle_per_run"] = self.cycles
        results["scheduler_cycle_median_ms"] = {
            label: {"algorithm_ms": _median([c["algorithm_ms"] for c in cycles])}
            for label, cycles in self.cycles.items()
            if cycles and all("algorithm_ms" in c for c in cycles)
        }
        for name, (numerator, denominator) in {
            "with_vs_without": ("without_extender", "with_extender"),
            "constant_vs_without": ("without_extender", "constant_extender"),
            "with_vs_constant": ("constant_extender", "with_extender"),
        }.items():
            results[f"cpu_throughput_ratio_{name}"] = round(
                median_cpu[numerator] / median_cpu[denominator], 3
            )
        rate = {label: run_["pods_per_second"] for label, run_ in self.runs.items()}
        results["throughput_ratio_with_vs_without"] = round(
            rate["with_extender"] / rate["without_extender"], 3
        )
        results["throughput_ratio_constant_vs_without"] = round(
            rate["constant_extender"] / rate["without_extender"], 3
        )
        results["throughput_ratio_with_vs_constant"] = round(
            rate["with_extender"] / rate["constant_extender"], 3
        )
        results["extender_kept_pods_off_contradicted_nodes"] = (
            self.runs["with_extender"]["pods_on_contradicted_nodes"] == 0
        )
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="rounds of the three modes")
    args = parser.parse_args()
    owner = Owner()
    envelope = fleet_envelope(owner)
    configmap = owner.sign(envelope, name=PROFILE_CONFIGMAP)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "nodes": len(fleet()),
        "workload": PODS,
        "repeats": args.repeats,
        "load_average_1m_before": round(os.getloadavg()[0], 2),
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
        grant_extender(plane)
        create_fake_nodes(plane.kube("admin"), fleet())
        port = free_port()
        extender = start_extender(plane, owner, port)
        config = render_scheduler_config(extender_url=f"http://127.0.0.1:{port}")
        config["leaderElection"] = {"leaderElect": False}
        # The default client rate limit (50 QPS) would cap both runs at the bind rate and hide
        # the extender's cost; lift it so the scheduling cycle itself is measured.
        config["clientConnection"] = {"qps": 1000, "burst": 2000}
        results["scheduler_config_extender"] = config["extenders"][0]
        constant_port = free_port()
        constant = start_constant_extender(plane, constant_port)
        constant_config = {
            **config,
            "extenders": [
                {**config["extenders"][0], "urlPrefix": f"http://127.0.0.1:{constant_port}"}
            ],
        }
        modes = (
            ("with_extender", config, extender.pid),
            ("constant_extender", constant_config, constant.pid),
            ("without_extender", {k: v for k, v in config.items() if k != "extenders"}, None),
        )
        record = _Record(results, [label for label, _, _ in modes])
        for repeat in range(args.repeats):
            # Rotate which mode goes first, and compare the runs of each repeat: a neighbour's
            # load on a shared machine then hits the modes of a repeat alike.
            rates_now: dict[str, float] = {}
            shift = repeat % len(modes)
            for label, cfg, pid in modes[shift:] + modes[:shift]:
                namespace = NAMESPACE if label == "with_extender" else OTHER_NAMESPACE
                pods = _pods(owner, envelope, f"{label.replace('_', '')}{repeat}", namespace)
                run_ = run(plane, pods, label, cfg, pid, contradicted=CONTRADICTED)
                clear(plane, pods)
                rates_now[label] = record.add(label, run_)
            record.paired.append(rates_now["with_extender"] / rates_now["without_extender"])
            record.paired_constant.append(
                rates_now["constant_extender"] / rates_now["without_extender"]
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
            record.write()
            print(f"repeat {repeat + 1}/{args.repeats} written", file=sys.stderr)
    finally:
        for process in (extender, constant):
            if process is not None:
                process.terminate()
                process.wait(15)
        plane.stop()
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
