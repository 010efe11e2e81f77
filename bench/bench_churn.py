"""Placement under churn: the Alibaba trace replayed with its departures, as a discrete-event
simulation, for first fit, best fit, spreading and the extender's fragmentation-aware score.

`bench_placement.py` fills the fleet with arrivals only; in a running cluster deployments also
stop, and the holes they leave are where packing policies differ. This replay keeps each task's
lifetime (`deletion_time - creation_time` of `openb_pod_list_default.csv`) and frees its
capacity when it ends. The fleet and the mapping of tasks onto whole GPUs, MIG slices and
accounted VRAM shares are `bench_placement.py`'s.

Load. At the trace's own pace the whole fleet is about 1% used (at most 66 GPUs of demand run
at once), so nothing would ever wait. Two changes make it contended, both reported with the
figures: arrival times are divided by a compression factor (lifetimes are kept), which
multiplies the offered load by that factor, and the fleet is one node (or VRAM bucket) in
`FLEET_EVERY` of each class. About a tenth of the tasks were created long before the rest and
run to the end of the trace, so they hold a base load the short tasks churn on top of. `LOADS`
are the two settings reported: a moderate load (few requests wait) and a heavy one.

Queueing, chosen to match the platform: a request that fits nowhere waits; every waiting request
is retried, oldest first, whenever a departure frees capacity in its class (kube-scheduler moves
unschedulable Pods back to its active queue on such events, and any of them that fits is placed,
so a large request at the head does not block smaller ones behind it). A request still waiting
`MAX_WAIT` seconds after it arrived is refused: the allocation controller's scheduling deadline
(300 s by default) marks such a deployment failed.

Metrics, per policy and class, and in GPUs over the fleet:

- admitted: the share of arriving requests placed, by count and weighted by GPUs (a whole-GPU
  task weighs its GPU count, a shared one its `gpu_milli / 1000`);
- wait: seconds from arrival to placement of the admitted requests (mean, p50, p99);
- stranded: FGD's fragmentation (Weng et al., ATC '23): the free capacity of each node that a
  request drawn from the class's typical request distribution (all of the class's requests in
  the trace) cannot use, in expectation, summed over the fleet and averaged over time (the
  replay's arrival period). A whole-GPU node's free GPUs are stranded for a request larger than
  them; a VRAM bucket's free GB for a share larger than them; a MIG node's free slices for a
  request whose shape has no free slice there. In GPUs: whole GPUs, MIG slices at their compute
  share (a 3g slice is 3/7 of a GPU), VRAM GB over the 48 GB card.

Policies: `first-fit` (the first node by name where it fits), `best-fit` (the extender's score
before this benchmark existed: `score_nodes` with no workload distribution), `spread` (the most
free capacity left, kube-scheduler's default), and `fgd (tmi)` (the extender's score with the
decayed histogram of the requests seen so far, fed the same way the server feeds it). The
extender's scores break ties at random as kube-scheduler does; those policies run `SEEDS` seeds
and the figures are means.

CPU steering. A second replay adds the trace's CPU tasks (`num_gpu == 0`) and every task's CPU
and memory requests, on the whole-GPU nodes with their real CPU and memory plus `CPU_NODES`
CPU-only nodes (the trace lists GPU nodes only; these are sized like its most common host, 96
cores and 384 GiB). A GPU Pod must fit its GPUs and its CPU and memory (kube-scheduler's
NodeResourcesFit), a CPU Pod its CPU and memory. It compares the extender's CPU score before
(best fit over every node) and after (accelerator nodes at the bottom): the share of CPU Pods
placed on GPU nodes, and the GPU Pods that could not be placed at arrival although a node had
their GPUs free, because CPU Pods held its CPU or memory.

Run: `.venv/bin/python bench/bench_churn.py` (a few minutes on 2 cores). Writes
bench/results/churn.json.
"""

from __future__ import annotations

import csv
import heapq
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench_placement import (  # noqa: E402
    DATA,
    MIG_SHAPES,
    SHARE_CARD_GIB,
    VRAM,
    Demands,
    Fleet,
    Item,
    _half,
    build_fleet,
)

from inference_policy.fragmentation import RequestMix, Workload  # noqa: E402
from inference_policy.nodes import NodeFacts, node_facts  # noqa: E402
from inference_policy.placement import (  # noqa: E402
    Demand,
    best_fit_scales,
    check,
    check_nodes,
    demand_for,
    has_accelerator,
    score,
    score_nodes,
)
from inference_policy.plan import parse_plan  # noqa: E402
from localcluster.nodes import FakeNode  # noqa: E402

# (label, arrival-time compression, one node in how many): the same fleet under a moderate
# load, where few requests wait, and a heavy one, where many are refused at the deadline.
LOADS = (("moderate", 100, 8), ("heavy", 400, 8))
COMPRESSION = 100
FLEET_EVERY = 8
MAX_WAIT = 300.0
SEEDS = 3
CPU_NODES = 40
MIB = 1024 * 1024
MIG_GPU_SHARE = {f"nvidia.com/mig-{shape}": int(shape[0]) / 7 for shape, _ in MIG_SHAPES}


# -- the trace, with lifetimes ---------------------------------------------------------------------


@dataclass
class Task:
    item: Item
    arrive: float
    lifetime: float
    gpus: float  # GPU-weighted demand
    cpu: int = 0  # millicores
    memory: int = 0  # bytes


def build_tasks(compression: float = COMPRESSION, cpu_tasks: bool = False) -> list[Task]:
    with (DATA / "openb_pod_list_default.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    tasks: list[Task] = []
    for row in rows:
        count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        created, deleted = int(row["creation_time"]), int(row["deletion_time"])
        cpu, memory = int(row["cpu_milli"]), int(row["memory_mib"]) * MIB
        index, name = len(tasks), row["name"]
        if count == 0:
            if not cpu_tasks:
                continue
            item, gpus = Item(index, name, "cpu", "cpu", 0), 0.0
        elif milli >= 1000:
            item, gpus = Item(index, name, "whole", "nvidia.com/gpu", count), float(count)
        else:
            need = math.ceil(milli * SHARE_CARD_GIB / 1000)
            shape = next((s for s, usable in MIG_SHAPES if usable >= need), None)
            if _half(name) and shape is not None:
                item = Item(index, name, "mig", f"nvidia.com/mig-{shape}", 1)
            else:
                item = Item(index, name, "vram", VRAM, need)
            gpus = milli / 1000
        lifetime = max(deleted - created, 1)
        tasks.append(Task(item, created / compression, lifetime, gpus, cpu, memory))
    return tasks


def sample_fleet(fleet: Fleet, every: int = FLEET_EVERY) -> Fleet:
    """Every `every`-th node (or VRAM bucket) of each class, in the trace's order."""
    kept = {
        cls: [name for i, name in enumerate(names) if i % every == 0]
        for cls, names in fleet.classes.items()
    }
    names = {name for group in kept.values() for name in group}
    return Fleet([spec for spec in fleet.specs if spec.name in names], kept)


# -- fragmentation against the class's typical request ---------------------------------------------


def class_distributions(tasks: Sequence[Task]) -> dict[str, list[tuple[str, int, float]]]:
    """Per class: (resource, size, probability) over all of the class's requests in the trace."""
    counts: dict[str, dict[tuple[str, int], int]] = {}
    for task in tasks:
        per = counts.setdefault(task.item.cls, {})
        key = (task.item.resource, task.item.qty)
        per[key] = per.get(key, 0) + 1
    out: dict[str, list[tuple[str, int, float]]] = {}
    for cls, per in counts.items():
        total = sum(per.values())
        out[cls] = [(r, q, n / total) for (r, q), n in sorted(per.items())]
    return out


def gpu_units(resource: str, amount: float) -> float:
    """Free capacity in GPUs: a MIG slice at its compute share, VRAM GB over the card."""
    if resource == VRAM:
        return amount / SHARE_CARD_GIB
    return amount * MIG_GPU_SHARE.get(resource, 1.0)


def stranded(free: dict[str, int], mix: Sequence[tuple[str, int, float]]) -> tuple[float, float]:
    """(stranded units of the class, stranded GPUs) for a node with `free` per resource."""
    units = sum(free.values())
    gpus = sum(gpu_units(r, v) for r, v in free.items())
    if units <= 0:
        return 0.0, 0.0
    miss = sum(p for resource, size, p in mix if free.get(resource, 0) < size)
    return units * miss, gpus * miss


# -- policies --------------------------------------------------------------------------------------

Chooser = Callable[[Demand, list[NodeFacts], list[int], Callable[[str], dict[str, int]]], int]


def _left(demand: Demand, node: NodeFacts, used_of: Callable[[str], dict[str, int]]) -> int:
    name = demand.checked[0]
    return node.allocatable[name] - used_of(node.name).get(name, 0) - demand.requests[name]


def first_fit(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
    return fit[0]


def spread(rng: random.Random) -> Chooser:
    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        lefts = [_left(demand, nodes[i], used_of) for i in fit]
        top = max(lefts)
        best = [fit[i] for i, v in enumerate(lefts) if v == top]
        return best[rng.randrange(len(best))]

    return choose


def extender(rng: random.Random, workload: Callable[[], Workload | None]) -> Chooser:
    """kube-scheduler's choice among the extender's scores: the highest, ties at random."""

    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        scores = score_nodes(demand, [nodes[i] for i in fit], used_of, workload())
        top = max(scores)
        best = [fit[i] for i, s in enumerate(scores) if s == top]
        return best[rng.randrange(len(best))] if len(best) > 1 else best[0]

    return choose


def policies(seed: int, mix: RequestMix) -> list[tuple[str, Chooser, bool]]:
    """(label, chooser, whether arrivals feed the histogram)."""
    return [
        ("first-fit", first_fit, False),
        ("best-fit", extender(random.Random(seed), lambda: None), False),
        ("spread", spread(random.Random(seed)), False),
        ("fgd (tmi)", extender(random.Random(seed), mix.workload), True),
    ]


# -- the discrete-event replay ---------------------------------------------------------------------


@dataclass
class ClassState:
    nodes: list[NodeFacts]
    resources: tuple[str, ...]
    mix: list[tuple[str, int, float]]
    frag_units: list[float] = field(default_factory=list)
    frag_gpus: list[float] = field(default_factory=list)


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def replay(
    tasks: Sequence[Task], fleet: Fleet, demands: Demands, choose: Chooser, feed: RequestMix | None
) -> dict[str, Any]:
    specs = {spec.name: spec for spec in fleet.specs}
    dists = class_distributions(tasks)
    classes: dict[str, ClassState] = {}
    for cls, names in fleet.classes.items():
        nodes = [node_facts(specs[name].manifest()) for name in sorted(names)]
        resources = tuple(sorted({r for r, _, _ in dists[cls]}))
        state = ClassState(nodes, resources, dists[cls])
        for node in nodes:
            free = {r: node.allocatable.get(r, 0) for r in resources}
            units, gpus = stranded(free, state.mix)
            state.frag_units.append(units)
            state.frag_gpus.append(gpus)
        classes[cls] = state
    usage: dict[str, dict[str, int]] = {n.name: {} for s in classes.values() for n in s.nodes}
    used_of = usage.__getitem__
    position = {n.name: i for s in classes.values() for i, n in enumerate(s.nodes)}
    totals = {cls: [sum(s.frag_units), sum(s.frag_gpus)] for cls, s in classes.items()}
    integral = {cls: [0.0, 0.0] for cls in classes}
    waiting: dict[str, list[tuple[float, int]]] = {cls: [] for cls in classes}
    stats = {
        cls: {"arrived": 0, "admitted": 0, "gpus_arrived": 0.0, "gpus_admitted": 0.0, "waits": []}
        for cls in classes
    }
    events: list[tuple[float, int, int, str]] = []  # (time, 0 departure / 1 arrival, task, node)
    for index, task in enumerate(tasks):
        events.append((task.arrive, 1, index, ""))
    heapq.heapify(events)
    end_of_arrivals = max(t.arrive for t in tasks)
    clock = min(t.arrive for t in tasks)
    start = clock

    def refresh(cls: str, node: NodeFacts) -> None:
        state = classes[cls]
        i = position[node.name]
        held = usage[node.name]
        free = {r: node.allocatable.get(r, 0) - held.get(r, 0) for r in state.resources}
        units, gpus = stranded(free, state.mix)
        totals[cls][0] += units - state.frag_units[i]
        totals[cls][1] += gpus - state.frag_gpus[i]
        state.frag_units[i], state.frag_gpus[i] = units, gpus

    def place(index: int, now: float) -> bool:
        task = tasks[index]
        item = task.item
        state = classes[item.cls]
        demand = demands.get(item)
        fit = [
            i
            for i, v in enumerate(check_nodes(demand, state.nodes, used_of))
            if v is not None and v.fits
        ]
        if not fit:
            return False
        node = state.nodes[choose(demand, state.nodes, fit, used_of)]
        held = usage[node.name]
        held[item.resource] = held.get(item.resource, 0) + item.qty
        refresh(item.cls, node)
        heapq.heappush(events, (now + task.lifetime, 0, index, node.name))
        block = stats[item.cls]
        block["admitted"] += 1
        block["gpus_admitted"] += task.gpus
        block["waits"].append(now - task.arrive)
        return True

    def retry(cls: str, now: float) -> None:
        queue = waiting[cls]
        kept: list[tuple[float, int]] = []
        state = classes[cls]
        room = {
            r: max(n.allocatable.get(r, 0) - usage[n.name].get(r, 0) for n in state.nodes)
            for r in state.resources
        }
        for arrived, index in queue:
            if arrived + MAX_WAIT < now:
                continue  # refused at its deadline
            item = tasks[index].item
            if item.qty > room.get(item.resource, 0) or not place(index, now):
                kept.append((arrived, index))
                continue
            room = {
                r: max(n.allocatable.get(r, 0) - usage[n.name].get(r, 0) for n in state.nodes)
                for r in state.resources
            }
        waiting[cls] = kept

    while events:
        now, kind, index, node_name = heapq.heappop(events)
        if clock < end_of_arrivals:
            span = min(now, end_of_arrivals) - clock
            for cls, (units, gpus) in totals.items():
                integral[cls][0] += units * span
                integral[cls][1] += gpus * span
        clock = max(clock, now)
        task = tasks[index]
        cls = task.item.cls
        if kind == 0:
            held = usage[node_name]
            held[task.item.resource] -= task.item.qty
            state = classes[cls]
            refresh(cls, state.nodes[position[node_name]])
            if waiting[cls]:
                retry(cls, now)
            continue
        block = stats[cls]
        block["arrived"] += 1
        block["gpus_arrived"] += task.gpus
        if feed is not None:
            feed.observe(task.item.resource, task.item.qty)
        if not place(index, now):
            waiting[cls].append((now, index))
    period = max(end_of_arrivals - start, 1e-9)
    out: dict[str, Any] = {}
    for cls, block in stats.items():
        waits = block.pop("waits")
        out[cls] = {
            "arrived": block["arrived"],
            "admitted": block["admitted"],
            "admitted_share": round(block["admitted"] / max(block["arrived"], 1), 4),
            "gpus_arrived": round(block["gpus_arrived"], 1),
            "gpus_admitted": round(block["gpus_admitted"], 1),
            "admitted_gpu_share": round(block["gpus_admitted"] / max(block["gpus_arrived"], 1), 4),
            "wait_s": {
                "mean": round(sum(waits) / max(len(waits), 1), 1),
                "p50": round(_percentile(waits, 0.5), 1),
                "p99": round(_percentile(waits, 0.99), 1),
                "waited": sum(1 for w in waits if w > 0),
            },
            "stranded_units_time_avg": round(integral[cls][0] / period, 1),
            "stranded_gpus_time_avg": round(integral[cls][1] / period, 2),
        }
    return out


def offered_load(tasks: Sequence[Task], fleet: Fleet) -> dict[str, Any]:
    """Mean units of each class requested by running tasks over the arrival period, if all ran
    on arrival, against the class's capacity."""
    specs = {spec.name: spec for spec in fleet.specs}
    start, end = min(t.arrive for t in tasks), max(t.arrive for t in tasks)
    resources = {cls: {r for r, _, _ in mix} for cls, mix in class_distributions(tasks).items()}
    out: dict[str, Any] = {}
    for cls, names in fleet.classes.items():
        capacity = 0.0
        for name in names:
            allocatable = node_facts(specs[name].manifest()).allocatable
            # Only the class's own resource: a VRAM bucket's node also lists its one GPU.
            capacity += sum(gpu_units(r, v) for r, v in allocatable.items() if r in resources[cls])
        busy = sum(
            t.gpus * max(0.0, min(t.arrive + t.lifetime, end) - t.arrive)
            for t in tasks
            if t.item.cls == cls
        )
        out[cls] = {
            "capacity_gpus": round(capacity, 1),
            "offered_gpus_time_avg": round(busy / (end - start), 1),
        }
    return out


# -- CPU steering ----------------------------------------------------------------------------------


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
    counts = {
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


# -- driver ----------------------------------------------------------------------------------------


def _mean_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = _mean_runs([run[key] for run in runs])
        elif isinstance(value, int | float):
            out[key] = round(sum(run[key] for run in runs) / len(runs), 4)
        else:
            out[key] = value
    return out


def _fleet_totals(per_class: dict[str, Any]) -> dict[str, Any]:
    arrived = sum(b["arrived"] for b in per_class.values())
    admitted = sum(b["admitted"] for b in per_class.values())
    gpus_arrived = sum(b["gpus_arrived"] for b in per_class.values())
    gpus_admitted = sum(b["gpus_admitted"] for b in per_class.values())
    return {
        "admitted_share": round(admitted / max(arrived, 1), 4),
        "admitted_gpu_share": round(gpus_admitted / max(gpus_arrived, 1), 4),
        "stranded_gpus_time_avg": round(
            sum(b["stranded_gpus_time_avg"] for b in per_class.values()), 2
        ),
    }


def main() -> None:
    started = time.perf_counter()
    full = build_fleet()
    demands = Demands()
    results: dict[str, Any] = {
        "trace": "alibaba cluster-trace-gpu-v2023 (openb_pod_list_default.csv), bench/data",
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs",
        "max_wait_s": MAX_WAIT,
        "seeds": SEEDS,
        "units": {"whole": "GPUs", "mig": "slices", "vram": "GB"},
        "loads": {},
    }
    for load, compression, every in LOADS:
        fleet = sample_fleet(full, every)
        tasks = build_tasks(compression)
        block: dict[str, Any] = {
            "compression": compression,
            "fleet_one_node_in": every,
            "offered": offered_load(tasks, fleet),
            "policies": {},
        }
        for label, _, _ in policies(0, RequestMix()):
            randomised = label != "first-fit"
            runs = []
            run_started = time.perf_counter()
            for seed in range(SEEDS if randomised else 1):
                mix = RequestMix()
                chooser, feeds = next((c, f) for lab, c, f in policies(seed, mix) if lab == label)
                runs.append(replay(tasks, fleet, demands, chooser, mix if feeds else None))
            summary = _mean_runs(runs)
            summary["fleet"] = _fleet_totals(summary)
            summary["seconds"] = round(time.perf_counter() - run_started, 1)
            block["policies"][label] = summary
            print(f"{load} {label}: {json.dumps(summary['fleet'])}", file=sys.stderr)
        first = block["policies"]["first-fit"]["fleet"]
        ours = block["policies"]["fgd (tmi)"]["fleet"]
        gain = {
            "admitted_share_gain": round(ours["admitted_share"] / first["admitted_share"] - 1, 4),
            "admitted_gpu_share_gain": round(
                ours["admitted_gpu_share"] / first["admitted_gpu_share"] - 1, 4
            ),
            "stranded_gpus_reduction": round(
                1 - ours["stranded_gpus_time_avg"] / max(first["stranded_gpus_time_avg"], 1e-9), 4
            ),
        }
        block["fgd_vs_first_fit"] = gain
        block["meets_target"] = (
            gain["admitted_gpu_share_gain"] >= 0.10 or gain["stranded_gpus_reduction"] >= 0.40
        )
        results["loads"][load] = block
    mixed = build_tasks(COMPRESSION, cpu_tasks=True)
    mixed = [t for t in mixed if t.item.cls in ("whole", "cpu")]
    results["cpu_steering"] = {
        "fleet": f"{steering_fleet()[1]} whole-GPU nodes with the "
        f"trace's CPU and memory, {CPU_NODES} CPU-only nodes (96 cores, 384 GiB)",
        "before": _mean_runs([steering(mixed, demands, False, s) for s in range(SEEDS)]),
        "after": _mean_runs([steering(mixed, demands, True, s) for s in range(SEEDS)]),
    }
    results["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(results, indent=2)
    print(text)
    out = ROOT / "bench" / "results" / "churn.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
