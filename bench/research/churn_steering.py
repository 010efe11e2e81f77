"""Research, not a product benchmark (see bench/research/README.md).

CPU steering under churn: the trace's CPU tasks and every task's CPU and memory requests on
the whole-GPU nodes plus CPU-only ones, placed by the extender's CPU score before steering (best
fit over every node) and after (accelerator nodes at the bottom).

What it counts: the CPU Pods that land on GPU nodes, and the GPU Pods that could not be placed
at arrival although a node had their GPUs free, because CPU Pods held its CPU or memory.
"""

from __future__ import annotations

import csv
import heapq
import random
from collections.abc import Sequence
from typing import Any

from churn_trace import FLEET_EVERY, Task
from trace_fleet import DATA, Demands

from inference_policy.placing.nodes import NodeFacts, node_facts
from inference_policy.placing.placement import (
    Demand,
    best_fit_scales,
    check,
    check_nodes,
    demand_for,
    has_accelerator,
    score,
    score_nodes,
)
from inference_policy.planning.plan import parse_plan
from localcluster.nodes.kwok import FakeNode

CPU_NODES = 40


CPU_PLAN = {
    "status": 200,
    "path": "cpu",
    "derived": True,
    "profile": "cpu",
    "bindingId": "cpu-amd64",
    "engine": "llamacpp",
    "variantId": "llamacpp-cpu-amd64",
    "image": "registry.invalid/llamacpp-cpu@sha256:" + "2" * 64,
    "runtimeClassName": None,
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    "deviceCount": 0,
    "engineArgs": {},
    "inferenceResources": {
        "schemaVersion": 1,
        "cpu": {"architecture": "amd64", "requests": {"cpu": "1", "memory": "1Gi"}},
        "runtime": {"selection": "automatic"},
    },
    "bundle": {"version": 1, "sha256": "0" * 64},
}


def steering_fleet(every: int = FLEET_EVERY) -> tuple[list[NodeFacts], int]:
    """One whole-GPU node in `every`, with the trace's CPU and memory, then the CPU-only nodes."""
    with (DATA / "openb_node_list_gpu_node.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["model"] in ("G2", "V100M32", "V100M16")]
    nodes: list[NodeFacts] = []
    for row in rows[::every]:
        spec = FakeNode(
            row["sn"],
            gpus=int(row["gpu"]),
            cpu=f"{int(row['cpu_milli'])}m",
            memory=f"{int(row['memory_mib'])}Mi",
        )
        nodes.append(node_facts(spec.manifest()))
    gpu_nodes = len(nodes)
    for i in range(CPU_NODES):
        spec = FakeNode(f"zz-cpu-{i:03d}", gpus=0, vram_gb=None, cpu="96", memory="384Gi")
        nodes.append(node_facts(spec.manifest()))
    return nodes, gpu_nodes


def steering(tasks: Sequence[Task], demands: Demands, steer: bool, seed: int) -> dict[str, Any]:
    """The mixed replay (whole-GPU and CPU tasks) with the CPU score before or after."""
    rng = random.Random(seed)
    nodes, gpu_nodes = steering_fleet()
    usage: dict[str, dict[str, int]] = {n.name: {} for n in nodes}
    by_cpu: dict[str, dict[str, int]] = {n.name: {} for n in nodes}
    used_of = usage.__getitem__
    cpu_demand = demand_for(parse_plan(CPU_PLAN), None)
    events: list[tuple[float, int, int, str]] = [(t.arrive, 1, i, "") for i, t in enumerate(tasks)]
    heapq.heapify(events)
    counts: dict[str, float] = {
        "cpu_pods": 0,
        "cpu_pods_on_gpu_nodes": 0,
        "cpu_pods_unplaced": 0,
        "gpu_pods": 0,
        "gpu_pods_unplaced": 0,
        "gpu_pods_blocked_by_cpu_pods": 0,
    }

    def cpu_mem_fit(node: NodeFacts, cpu: int, memory: int, held: dict[str, int]) -> bool:
        return (
            held.get("cpu", 0) + cpu <= node.allocatable["cpu"]
            and held.get("memory", 0) + memory <= node.allocatable["memory"]
        )

    def without_cpu_pods(name: str) -> dict[str, int]:
        return {k: usage[name].get(k, 0) - by_cpu[name].get(k, 0) for k in ("cpu", "memory")}

    while events:
        now, kind, index, name = heapq.heappop(events)
        task = tasks[index]
        item = task.item
        if kind == 0:
            held = usage[name]
            for key, value in (("cpu", task.cpu), ("memory", task.memory)):
                held[key] -= value
                if item.cls == "cpu":
                    by_cpu[name][key] -= value
            if item.cls != "cpu":
                held[item.resource] -= item.qty
            continue
        if item.cls == "cpu":
            counts["cpu_pods"] += 1
            requests = {"cpu": task.cpu, "memory": task.memory}
            demand = Demand(
                "cpu", "amd64", None, requests, cpu_demand.checked, cpu_demand.kind, cpu_demand.key
            )
            fit = [n for n in nodes if check(demand, n, used_of(n.name)).fits]
            if not fit:
                counts["cpu_pods_unplaced"] += 1
                continue
            if steer:
                scores = score_nodes(demand, fit, used_of)
            else:
                scales = best_fit_scales(demand, fit)
                scores = [score(demand, n, used_of(n.name), scales) for n in fit]
            top = max(scores)
            best = [n for n, s in zip(fit, scores, strict=True) if s == top]
            node = best[rng.randrange(len(best))]
            if has_accelerator(node):
                counts["cpu_pods_on_gpu_nodes"] += 1
            for key, value in requests.items():
                usage[node.name][key] = usage[node.name].get(key, 0) + value
                by_cpu[node.name][key] = by_cpu[node.name].get(key, 0) + value
            heapq.heappush(events, (now + task.lifetime, 0, index, node.name))
            continue
        if item.cls != "whole":
            continue
        counts["gpu_pods"] += 1
        demand = demands.get(item)
        verdicts = check_nodes(demand, nodes[:gpu_nodes], used_of)
        gpu_room = [
            n for n, v in zip(nodes[:gpu_nodes], verdicts, strict=True) if v is not None and v.fits
        ]
        fit = [n for n in gpu_room if cpu_mem_fit(n, task.cpu, task.memory, usage[n.name])]
        if not fit:
            counts["gpu_pods_unplaced"] += 1
            # Would it have fitted had the CPU Pods not been there?
            if any(
                cpu_mem_fit(n, task.cpu, task.memory, without_cpu_pods(n.name)) for n in gpu_room
            ):
                counts["gpu_pods_blocked_by_cpu_pods"] += 1
            continue
        scores = score_nodes(demand, fit, used_of)
        top = max(scores)
        best = [n for n, s in zip(fit, scores, strict=True) if s == top]
        node = best[rng.randrange(len(best))]
        held = usage[node.name]
        held[item.resource] = held.get(item.resource, 0) + item.qty
        held["cpu"] = held.get("cpu", 0) + task.cpu
        held["memory"] = held.get("memory", 0) + task.memory
        heapq.heappush(events, (now + task.lifetime, 0, index, node.name))
    counts["cpu_pods_on_gpu_nodes_share"] = round(
        counts["cpu_pods_on_gpu_nodes"] / max(counts["cpu_pods"], 1), 4
    )
    return counts


__all__ = ["CPU_NODES", "CPU_PLAN", "steering", "steering_fleet"]
