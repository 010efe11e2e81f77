"""Research, not a product benchmark (see bench/research/README.md).

The churn replay itself: one policy's discrete-event run of the trace, arrivals and
departures, with the platform's queueing (a request that fits nowhere waits, is retried as
departures free capacity in its class, and is refused at the scheduling deadline), and the
offered load it runs under.

`replay` with a chooser places through the extender's own `check_nodes` and that chooser; with
none it is the repack oracle (`churn_floor.Floor`). Alongside, it integrates over time the
stranded measure of the layout it builds and the floor of the requests it runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from churn_floor import Counts, Floor
from churn_trace import Task, class_distributions, gpu_units, stranded
from placement_policies import Chooser
from trace_fleet import Demands, Fleet, Item

from inference_policy.placing.fragmentation import RequestMix
from inference_policy.placing.nodes import NodeFacts, node_facts
from inference_policy.placing.placement import check_nodes

MAX_WAIT = 300.0


class ReplayStats(TypedDict):
    """One class's running tallies in a replay."""

    arrived: int
    admitted: int
    gpus_arrived: float
    gpus_admitted: float
    waits: list[float]


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


def class_nodes(fleet: Fleet) -> dict[str, list[NodeFacts]]:
    specs = {spec.name: spec for spec in fleet.specs}
    return {
        cls: [node_facts(specs[name].manifest()) for name in sorted(names)]
        for cls, names in fleet.classes.items()
    }


def floors(tasks: Sequence[Task], fleet: Fleet) -> dict[str, Floor]:
    dists = class_distributions(tasks)
    return {cls: Floor(cls, nodes, dists[cls]) for cls, nodes in class_nodes(fleet).items()}


def replay(
    tasks: Sequence[Task],
    fleet: Fleet,
    demands: Demands,
    choose: Chooser | None,
    feed: RequestMix | None,
    floor: dict[str, Floor],
    generous: bool = False,
    bracket: bool = False,
) -> dict[str, Any]:
    """One policy's run. `choose` None is the repacking oracle: no layout, a request is placed
    when `Floor.fits` proves a packing exists (`generous`: unless it proves none does).
    `bracket` also follows the stranded measure of a layout a repacker could build."""
    dists = class_distributions(tasks)
    classes: dict[str, ClassState] = {}
    for cls, nodes in class_nodes(fleet).items():
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
    # The running requests per class, what the floor is judged on: the least stranded measure
    # any layout of them has, and whether a refused request had room under some layout.
    running: dict[str, Counts] = {cls: {} for cls in classes}
    least = {cls: floor[cls].least_stranded({}) for cls in classes}
    floor_integral = {cls: [0.0, 0.0] for cls in classes}
    built = {cls: floor[cls].repacked({}) if bracket else None for cls in classes}
    built_integral = {cls: [0.0, 0.0] for cls in classes}
    layout_blocked: set[int] = set()
    admitted_tasks: set[int] = set()
    undecided = {cls: 0 for cls in classes}
    # Floor.fits for (class, resource, size) since the class's running requests last changed.
    verdicts: dict[tuple[str, str, int], bool | None] = {}
    waiting: dict[str, list[tuple[float, int]]] = {cls: [] for cls in classes}
    stats: dict[str, ReplayStats] = {
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

    def repackable(index: int) -> bool | None:
        item = tasks[index].item
        key = (item.cls, item.resource, item.qty)
        if key not in verdicts:
            verdicts[key] = floor[item.cls].fits(running[item.cls], item.resource, item.qty)
        return verdicts[key]

    def hold(item: Item, sign: int) -> None:
        held = running[item.cls]
        key = (item.resource, item.qty)
        held[key] = held.get(key, 0) + sign
        least[item.cls] = floor[item.cls].least_stranded(held)
        if bracket:
            built[item.cls] = floor[item.cls].repacked(held)
        for key3 in [k for k in verdicts if k[0] == item.cls]:
            del verdicts[key3]

    def refused_here(index: int) -> None:
        # Would a perfect repacking of what runs now have made room? Undecided counts as yes.
        if choose is not None and index not in layout_blocked and repackable(index) is not False:
            layout_blocked.add(index)

    def place(index: int, now: float) -> bool:
        task = tasks[index]
        item = task.item
        if choose is None:
            verdict = repackable(index)
            if verdict is False or (verdict is None and not generous):
                return False
            if verdict is None:
                undecided[item.cls] += 1
            hold(item, 1)
            heapq.heappush(events, (now + task.lifetime, 0, index, ""))
        else:
            state = classes[item.cls]
            demand = demands.get(item)
            fit = [
                i
                for i, v in enumerate(check_nodes(demand, state.nodes, used_of))
                if v is not None and v.fits
            ]
            if not fit:
                refused_here(index)
                return False
            node = state.nodes[choose(demand, state.nodes, fit, used_of)]
            held = usage[node.name]
            held[item.resource] = held.get(item.resource, 0) + item.qty
            refresh(item.cls, node)
            hold(item, 1)
            heapq.heappush(events, (now + task.lifetime, 0, index, node.name))
        admitted_tasks.add(index)
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
            if choose is not None and item.qty > room.get(item.resource, 0):
                refused_here(index)
                kept.append((arrived, index))
                continue
            if not place(index, now):
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
                floor_integral[cls][0] += least[cls][0] * span
                floor_integral[cls][1] += least[cls][1] * span
                if bracket:
                    # A policy's own layout is one a repacker could keep; with none, the floor.
                    own = None if choose is None else (units, gpus)
                    options = [x for x in (built[cls], own) if x is not None] or [least[cls]]
                    built_integral[cls][0] += min(x[0] for x in options) * span
                    built_integral[cls][1] += min(x[1] for x in options) * span
        clock = max(clock, now)
        task = tasks[index]
        cls = task.item.cls
        if kind == 0:
            hold(task.item, -1)
            if node_name:
                held = usage[node_name]
                held[task.item.resource] -= task.item.qty
                refresh(cls, classes[cls].nodes[position[node_name]])
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
    if choose is None:
        # The oracle has no layout of its own: it strands what the best layout it can build
        # strands, or (generous, or no layout found) at least the floor.
        integral = built_integral if bracket else floor_integral
    out: dict[str, Any] = {}
    for cls, block in stats.items():
        waits = block["waits"]
        refused = {i for i, t in enumerate(tasks) if t.item.cls == cls} - admitted_tasks
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
            "unavoidable_stranded_units_time_avg": round(floor_integral[cls][0] / period, 1),
            "unavoidable_stranded_gpus_time_avg": round(floor_integral[cls][1] / period, 2),
            "refused_with_room_after_repacking": len(refused & layout_blocked),
            "oracle_undecided_admissions": undecided[cls],
        }
        if bracket:
            out[cls]["repacked_stranded_gpus_time_avg"] = round(built_integral[cls][1] / period, 2)
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


__all__ = ["MAX_WAIT", "class_nodes", "floors", "offered_load", "replay"]
