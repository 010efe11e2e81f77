"""Research, not a product benchmark (see bench/research/README.md).

The mixed-class replay: one policy's discrete-event run of the whole trace (CPU, whole-GPU and
share tasks on the same nodes, `mixed_fleet.py`'s mapping), with departures or arrivals only.

Queueing is the churn replay's (`churn_replay.py`), the classes sharing one queue as they share
the nodes: a request that fits nowhere waits, every waiting one is retried oldest first at each
departure (so a large request at the head does not block smaller ones), and one still waiting
`MAX_WAIT` seconds after it arrived is refused. With arrivals only nothing departs, so a request
that does not fit on arrival is refused.

`replay` places through a chooser (`Chooser`: given the task, the nodes and the candidates that
fit, the index of the chosen candidate) or, with `oracle`, as the repack references:

- `proven`: keeps a layout; a request that fits it is placed by best fit; one that fits nowhere is
  placed if moving at most `MAX_MOVES` running tasks off one node (each to where best fit puts it
  elsewhere) makes room for it there, trying the `TRIES` nodes nearest to fitting it; at a departure
  at most `REPAIRS_PER_EVENT` such repairs are tried, and a request type whose repair failed is not
  retried until something departs. A scheduler that may move a few Pods per admission could do
  exactly this, so it is an achievable reference, not a bound: a packer moving more could admit
  more. (A full best-fit-decreasing repack from empty nodes, dropped, failed to repack even the
  running set in 1,012 of 1,017 tries at the moderate load.)
- `generous`: no layout; a request is admitted unless an aggregate test proves no layout holds
  the running requests and it (total CPU, memory, GPU share; the GPU tasks' CPU and memory on the
  GPU nodes; whole-GPU tasks of N devices or more on nodes of N or more; one device for every
  whole GPU and every share over half). An upper reference per step (admitting greedily is not
  monotone), with no stranded figure.

Alongside, it integrates its layout's FGD fragmentation and free GPU share over the arrival
period, and counts replicas sharing a node or device (`bench_mixed.py` says what each means).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

from mixed_fleet import (
    CLASSES,
    GPU_MILLI,
    Fragmentation,
    Node,
    Placement,
    Task,
    devices_for,
    distribution,
    hold,
)

MAX_WAIT = 300.0

# (task, nodes, candidates as (node index, devices), replicas of the task's deployment on each
# candidate's node) -> the position of the chosen candidate.
Candidate = tuple[int, tuple[int, ...]]
Chooser = Callable[[Task, list[Node], list[Candidate], list[int]], int]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def best_fit_key(task: Task, node: Node, devices: tuple[int, ...]) -> tuple[int, int, int]:
    """Best fit's leftover: the node's free GPU share after the placement, then its CPU, then
    its memory (so a CPU task goes to a CPU-only node first)."""
    gpu = sum(node.free_gpu) - task.milli * len(devices)
    return (gpu, node.free_cpu - task.cpu, node.free_mem - task.mem)


def candidates(task: Task, nodes: Sequence[Node]) -> list[Candidate]:
    out: list[Candidate] = []
    for i, node in enumerate(nodes):
        devices = devices_for(node, task)
        if devices is not None:
            out.append((i, devices))
    return out


# -- the repack references -------------------------------------------------------------------------

MAX_MOVES = 3  # running tasks the proven oracle may move to admit one request
TRIES = 12  # nodes it tries to make room on, the nearest to fitting first
REPAIRS_PER_EVENT = 2  # repairs it attempts at one departure (the oldest waiting first)


def _deficit(node: Node, task: Task) -> float | None:
    """How far `task` is from fitting on `node` (0: it fits); None when it never could."""
    gpus = node.free_gpu
    if task.cpu > node.cpu or task.mem > node.mem or task.num_gpu > len(gpus):
        return None
    short = max(0, task.cpu - node.free_cpu) / node.cpu
    short += max(0, task.mem - node.free_mem) / node.mem
    if task.cls == "whole":
        short += max(0, task.num_gpu - sum(1 for g in gpus if g == GPU_MILLI)) / len(gpus)
    elif task.cls == "share":
        short += max(0, task.milli - max(gpus)) / GPU_MILLI
    return short


def make_room(
    nodes: list[Node], placements: dict[int, Placement], tasks: Sequence[Task], task: Task
) -> list[tuple[int, Placement]] | None:
    """The proven oracle's repair: on one of the `TRIES` nodes nearest to fitting `task`, move
    up to `MAX_MOVES` running tasks (each to where best fit puts it elsewhere, largest first) so
    that `task` fits there. Applied in place; returns the moves and, last, `task`'s placement
    (None, nothing changed, when no such repair was found)."""
    near = sorted(
        (gap, i) for i, n in enumerate(nodes) if (gap := _deficit(n, task)) is not None and gap > 0
    )
    on: dict[int, list[int]] = {}
    for index, (i, _) in placements.items():
        on.setdefault(i, []).append(index)
    for _, target in near[:TRIES]:
        node = nodes[target]
        evicted: list[int] = []
        residents = list(on.get(target, []))
        while devices_for(node, task) is None and len(evicted) < MAX_MOVES and residents:
            # The resident whose leaving brings `task` nearest to fitting, the smallest first.
            scored = []
            for index in residents:
                hold(node, tasks[index], placements[index][1], -1)
                scored.append((_deficit(node, task) or 0.0, tasks[index].gpus, index))
                hold(node, tasks[index], placements[index][1], 1)
            _, _, out = min(scored)
            residents.remove(out)
            hold(node, tasks[out], placements[out][1], -1)
            evicted.append(out)
        own = devices_for(node, task)
        moves: list[tuple[int, Placement]] = []
        if own is not None:
            hold(node, task, own, 1)
            for index in sorted(evicted, key=lambda k: -tasks[k].gpus):
                moved = tasks[index]
                fit = [
                    (best_fit_key(moved, n, d), i, d)
                    for i, n in enumerate(nodes)
                    if i != target and (d := devices_for(n, moved)) is not None
                ]
                if not fit:
                    break
                _, i, d = min(fit)
                hold(nodes[i], moved, d, 1)
                moves.append((index, (i, d)))
            else:
                return [*moves, (task.index, (target, own))]
            for index, (i, d) in moves:  # undo
                hold(nodes[i], tasks[index], d, -1)
            hold(node, task, own, -1)
        for index in evicted:
            hold(node, tasks[index], placements[index][1], 1)
    return None


class Aggregate:
    """The generous oracle's test: sums of what runs against the fleet's capacity."""

    sizes = (1, 2, 4, 8)

    def __init__(self, nodes: Sequence[Node]) -> None:
        gpu = [n for n in nodes if n.free_gpu]
        self.cap: dict[str, float] = {
            "cpu": sum(n.cpu for n in nodes),
            "mem": sum(n.mem for n in nodes),
            "gcpu": sum(n.cpu for n in gpu),
            "gmem": sum(n.mem for n in gpu),
            "milli": GPU_MILLI * sum(len(n.free_gpu) for n in gpu),
            "devices": sum(len(n.free_gpu) for n in gpu),
        }
        for s in self.sizes:
            self.cap[f"w{s}"] = sum(len(n.free_gpu) for n in gpu if len(n.free_gpu) >= s)
        self.largest = max(len(n.free_gpu) for n in nodes)
        self.held = dict.fromkeys(self.cap, 0.0)

    def _use(self, task: Task) -> dict[str, float]:
        use = {"cpu": float(task.cpu), "mem": float(task.mem)}
        if task.num_gpu:
            use |= {"gcpu": task.cpu, "gmem": task.mem, "milli": task.num_gpu * task.milli}
        if task.cls == "whole":
            use["devices"] = task.num_gpu
            for s in self.sizes:
                if task.num_gpu >= s:
                    use[f"w{s}"] = task.num_gpu
        elif task.cls == "share" and 2 * task.milli > GPU_MILLI:
            use["devices"] = 1
        return use

    def admits(self, task: Task) -> bool:
        if task.num_gpu > self.largest:
            return False
        return all(self.held[k] + v <= self.cap[k] for k, v in self._use(task).items())

    def change(self, task: Task, sign: int) -> None:
        for k, v in self._use(task).items():
            self.held[k] += sign * v


# -- the replay ------------------------------------------------------------------------------------


def _stats() -> dict[str, Any]:
    return {"arrived": 0, "admitted": 0, "gpus_arrived": 0.0, "gpus_admitted": 0.0, "waits": []}


def replay(
    tasks: Sequence[Task],
    fleet: Sequence[Node],
    choose: Chooser | None,
    observe: Callable[[Task], None] | None = None,
    oracle: str | None = None,
    churn: bool = True,
) -> dict[str, Any]:
    """One policy's run; `choose` None needs `oracle` ("proven" or "generous")."""
    nodes = [n.copy_empty() for n in fleet]
    gpu_tasks = [t for t in tasks if t.num_gpu]
    measures = {
        "whole": Fragmentation(distribution(t.kind for t in gpu_tasks if t.cls == "whole")),
        "share": Fragmentation(distribution(t.kind for t in gpu_tasks if t.cls == "share")),
        "total": Fragmentation(distribution(t.kind for t in gpu_tasks)),
    }
    frag = {k: [m.of(n) for n in nodes] for k, m in measures.items()}
    frag["free"] = [float(sum(n.free_gpu)) for n in nodes]
    totals = {k: sum(v) for k, v in frag.items()}
    integral = dict.fromkeys(totals, 0.0)
    capacity = sum(len(n.free_gpu) for n in nodes)
    placements: dict[int, Placement] = {}
    # The generous oracle's admission rule; the proven one's test before trying a repair.
    aggregate = Aggregate(nodes) if oracle is not None else None
    no_repair: set[tuple[int, int, int, int]] = set()  # repair failed since the last departure
    stats = {cls: _stats() for cls in CLASSES}
    # Replicas: per deployment, the running replicas per node and per (node, device).
    on_node: dict[int, dict[int, int]] = {}
    on_device: dict[int, dict[tuple[int, int], int]] = {}
    shared_node: set[int] = set()
    shared_device: set[int] = set()
    admitted_per_deployment: dict[int, int] = {}
    repairs = {"attempted": 0, "admitted": 0, "tasks_moved": 0}  # the proven oracle's
    snapshots: dict[str, Any] = {}
    arrived_gpus = 0.0

    def refresh(i: int) -> None:
        node = nodes[i]
        for k, m in measures.items():
            value = m.of(node)
            totals[k] += value - frag[k][i]
            frag[k][i] = value
        free = float(sum(node.free_gpu))
        totals["free"] += free - frag["free"][i]
        frag["free"][i] = free

    def replicas(task: Task, where: Placement, sign: int) -> None:
        if task.deployment < 0 or choose is None:
            return
        i, devices = where
        per_node = on_node.setdefault(task.deployment, {})
        per_device = on_device.setdefault(task.deployment, {})
        if sign > 0:
            if per_node.get(i, 0):
                shared_node.add(task.deployment)
            if any(per_device.get((i, d), 0) for d in devices):
                shared_device.add(task.deployment)
        per_node[i] = per_node.get(i, 0) + sign
        for d in devices:
            per_device[(i, d)] = per_device.get((i, d), 0) + sign

    def admit(task: Task, where: Placement | None, now: float, held: bool = False) -> None:
        if where is not None:
            placements[task.index] = where
            if not held:  # a repair already placed it
                hold(nodes[where[0]], task, where[1], 1)
                refresh(where[0])
            replicas(task, where, 1)
        if aggregate is not None:
            aggregate.change(task, 1)
        block = stats[task.cls]
        block["admitted"] += 1
        block["gpus_admitted"] += task.gpus
        block["waits"].append(now - task.arrive)
        if task.deployment >= 0:
            admitted_per_deployment[task.deployment] = (
                admitted_per_deployment.get(task.deployment, 0) + 1
            )
        if churn:
            heapq.heappush(events, (now + task.lifetime, 0, task.index))

    def place(task: Task, now: float, allow_repair: bool = True) -> bool:
        if oracle == "generous":
            assert aggregate is not None
            if not aggregate.admits(task):
                return False
            admit(task, None, now)
            return True
        fit = candidates(task, nodes)
        if choose is not None:
            if not fit:
                return False
            per_node = on_node.get(task.deployment, {})
            pick = choose(task, nodes, fit, [per_node.get(i, 0) for i, _ in fit])
            admit(task, fit[pick], now)
            return True
        if fit:
            admit(task, min(fit, key=lambda c: (best_fit_key(task, nodes[c[0]], c[1]), c[0])), now)
            return True
        if not allow_repair:
            return False
        return bool(try_repair([task], now))

    def try_repair(extra: list[Task], now: float) -> set[int]:
        """The proven oracle: make room for each of `extra` in turn (oldest first) by moving
        a few running tasks; the admitted."""
        assert aggregate is not None
        done: set[int] = set()
        budget = REPAIRS_PER_EVENT
        for task in extra:
            if task.kind in no_repair or not aggregate.admits(task):
                continue
            if budget == 0:
                break
            budget -= 1
            repairs["attempted"] += 1
            moves = make_room(nodes, placements, tasks, task)
            if moves is None:
                no_repair.add(task.kind)  # until something departs
                continue
            repairs["admitted"] += 1
            *moved, (_, where) = moves
            touched = {where[0]}
            for index, new in moved:
                touched.update((placements[index][0], new[0]))
                placements[index] = new
                repairs["tasks_moved"] += 1
            for i in touched:
                refresh(i)
            admit(task, where, now, held=True)
            running.add(task.index)
            done.add(task.index)
        return done

    def release(task: Task) -> None:
        if aggregate is not None:
            aggregate.change(task, -1)
            if oracle == "generous":
                return
        where = placements.pop(task.index)
        hold(nodes[where[0]], task, where[1], -1)
        refresh(where[0])
        replicas(task, where, -1)

    running: set[int] = set()
    waiting: list[tuple[float, int]] = []
    events: list[tuple[float, int, int]] = [(t.arrive, 1, t.index) for t in tasks]
    heapq.heapify(events)
    end_of_arrivals = max(t.arrive for t in tasks)
    clock = start = min(t.arrive for t in tasks)

    def retry(now: float) -> None:
        kept: list[tuple[float, int]] = []
        failed: set[tuple[int, int, int, int]] = set()  # placing only shrinks room
        for arrived, index in waiting:
            if arrived + MAX_WAIT < now:
                continue
            task = tasks[index]
            if task.kind in failed or not place(task, now, allow_repair=False):
                failed.add(task.kind)
                kept.append((arrived, index))
            else:
                running.add(index)
        if oracle == "proven" and kept:
            done = try_repair([tasks[i] for _, i in kept], now)
            kept = [(a, i) for a, i in kept if i not in done]
        waiting[:] = kept

    def snapshot(label: str) -> None:
        snapshots[label] = {
            "arrived_gpus_over_capacity": round(arrived_gpus / max(capacity, 1), 4),
            "admitted_gpu_share": round(
                sum(b["gpus_admitted"] for b in stats.values())
                / max(sum(b["gpus_arrived"] for b in stats.values()), 1e-9),
                4,
            ),
            "allocated_gpus": round(
                aggregate.held["milli"] / GPU_MILLI
                if oracle == "generous" and aggregate is not None
                else capacity - totals["free"] / GPU_MILLI,
                2,
            ),
            **(
                {}
                if oracle == "generous"
                else {
                    "unallocated_gpus": round(totals["free"] / GPU_MILLI, 2),
                    "stranded_gpus": round(totals["total"] / GPU_MILLI, 2),
                }
            ),
        }

    while events:
        now, kind, index = heapq.heappop(events)
        if clock < end_of_arrivals:
            span = min(now, end_of_arrivals) - clock
            for k, v in totals.items():
                integral[k] += v * span
        clock = max(clock, now)
        task = tasks[index]
        if kind == 0:
            running.discard(index)
            no_repair.clear()
            release(task)
            if waiting:
                retry(now)
            continue
        block = stats[task.cls]
        block["arrived"] += 1
        block["gpus_arrived"] += task.gpus
        arrived_gpus += task.gpus
        if observe is not None:
            observe(task)
        if place(task, now):
            running.add(index)
        else:
            if not churn and task.num_gpu and "first_refusal" not in snapshots:
                snapshot("first_refusal")
            waiting.append((now, index))
        if not churn and "at_capacity" not in snapshots and arrived_gpus >= capacity:
            snapshot("at_capacity")
    if not churn:
        snapshot("end")
    period = max(end_of_arrivals - start, 1e-9)
    out: dict[str, Any] = {}
    for cls, block in stats.items():
        waits = block["waits"]
        out[cls] = {
            "arrived": block["arrived"],
            "admitted": block["admitted"],
            "admitted_share": round(block["admitted"] / max(block["arrived"], 1), 4),
            "gpus_arrived": round(block["gpus_arrived"], 1),
            "gpus_admitted": round(block["gpus_admitted"], 1),
            "admitted_gpu_share": round(
                block["gpus_admitted"] / block["gpus_arrived"] if block["gpus_arrived"] else 1.0,
                4,
            ),
            "wait_s": {
                "mean": round(sum(waits) / max(len(waits), 1), 1),
                "p50": round(percentile(waits, 0.5), 1),
                "p99": round(percentile(waits, 0.99), 1),
                "waited": sum(1 for w in waits if w > 0),
            },
        }
        if cls in measures and oracle != "generous":
            out[cls]["stranded_gpus_time_avg"] = round(integral[cls] / period / GPU_MILLI, 2)
    arrived = sum(b["arrived"] for b in stats.values())
    admitted = sum(b["admitted"] for b in stats.values())
    gpus_arrived = sum(b["gpus_arrived"] for b in stats.values())
    all_waits = [w for b in stats.values() for w in b["waits"]]
    total: dict[str, Any] = {
        "admitted_share": round(admitted / max(arrived, 1), 4),
        "admitted_gpu_share": round(
            sum(b["gpus_admitted"] for b in stats.values()) / max(gpus_arrived, 1e-9), 4
        ),
        "refused": arrived - admitted,
        "wait_s": {
            "mean": round(sum(all_waits) / max(len(all_waits), 1), 1),
            "p50": round(percentile(all_waits, 0.5), 1),
            "p99": round(percentile(all_waits, 0.99), 1),
        },
    }
    if oracle != "generous":
        total["stranded_gpus_time_avg"] = round(integral["total"] / period / GPU_MILLI, 2)
        total["unallocated_gpus_time_avg"] = round(integral["free"] / period / GPU_MILLI, 2)
    out["total"] = total
    if choose is not None:
        multi = {d for d, n in admitted_per_deployment.items() if n > 1}
        out["replicas"] = {
            "deployments_with_2_or_more_admitted": len(multi),
            "share_with_replicas_on_one_node": round(
                len(shared_node & multi) / max(len(multi), 1), 4
            ),
            "share_with_replicas_on_one_device": round(
                len(shared_device & multi) / max(len(multi), 1), 4
            ),
        }
    if oracle == "proven":
        out["repairs"] = repairs
    if snapshots:
        out["arrival_only"] = snapshots
    return out


__all__ = [
    "MAX_WAIT",
    "Aggregate",
    "Candidate",
    "Chooser",
    "best_fit_key",
    "candidates",
    "make_room",
    "percentile",
    "replay",
]
