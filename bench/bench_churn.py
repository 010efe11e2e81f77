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
and the figures are means. Three diagnostics of fgd's score follow it: `unquantised` (the least
rise in fragmentation itself, not its 0..10 grade, so no ties but the least leftover),
`half-life x10` (a histogram ten times slower to forget) and `whole trace's mix` (fed the
distribution the stranded measure is taken against, which no server knows in advance).

The floor: what no placement could beat. Placement only decides where a request runs, so the
most it can do is what a scheduler could do that moved every running request at every arrival
and departure (`Floor`). The `repack oracle` runs the same queueing with no layout at all: a
request is placed whenever the class's running requests and it can be packed. That is exact for
whole GPUs (sizes 1, 2, 4, 8 on nodes of 8, 4 and 1 GPUs, all powers of two, where nested sums
decide it) and for MIG slices (any free slice of the shape serves, so only each shape's count
matters, and every policy admits alike). For VRAM shares (3-39 GB in 48 GB buckets) it admits
where a packing is proven (first-fit-decreasing finds one); `repack oracle, generous` admits
wherever Martello-Toth L2 does not rule one out, more than any repacking could at that step. The
oracles are a reference, not a bound on every schedule: admitting greedily is not monotone
(placing one more request can crowd out two later ones, which is why the proven oracle can admit
a few more than the generous one), and refusing large requests to admit small ones is admission
control, not placement. The proven oracle's stranded figure is that of the layout it builds
(FGD's rule offline, largest first; for MIG the exact least), the generous one's the lower
bound below.

For every policy the replay also follows the stranded measure's floor for the requests it runs:
`unavoidable` is a lower bound for any layout of them (whole GPUs: the free GPUs split over
nodes in the least stranding way; VRAM: every share over half a bucket has a bucket to itself,
and its gap is stranded unless requests small enough fill it, counted as if they could be
split; MIG: exact, over which shapes each node has run out of), and `repacked` (first fit and
the oracle) the least of its own layout and one a repacker can build, so first fit's stranded
GPUs would fall by at least `1 - repacked / stranded` and at most `1 - unavoidable / stranded`
with every request moved at every event. `refused with room after repacking` counts refused
requests that, on some attempt, would have fitted alone under some layout of what ran then
(most of them could not all have: they wait together).

CPU steering. A second replay adds the trace's CPU tasks (`num_gpu == 0`) and every task's CPU
and memory requests, on the whole-GPU nodes with their real CPU and memory plus `CPU_NODES`
CPU-only nodes (the trace lists GPU nodes only; these are sized like its most common host, 96
cores and 384 GiB). A GPU Pod must fit its GPUs and its CPU and memory (kube-scheduler's
NodeResourcesFit), a CPU Pod its CPU and memory. It compares the extender's CPU score before
(best fit over every node) and after (accelerator nodes at the bottom): the share of CPU Pods
placed on GPU nodes, and the GPU Pods that could not be placed at arrival although a node had
their GPUs free, because CPU Pods held its CPU or memory.

Run: `.venv/bin/python bench/bench_churn.py` (about a minute on 2 cores). Writes
bench/results/churn.json.
"""

from __future__ import annotations

import csv
import heapq
import itertools
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
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from bench_placement import (  # noqa: E402
    DATA,
    MIG_SHAPES,
    SHARE_CARD_GIB,
    VRAM,
    Demands,
    Fleet,
    Item,
    _ffd_feasible,
    _half,
    _l2_bins,
    build_fleet,
)

from inference_policy.fragmentation import (  # noqa: E402
    DEFAULT_HALF_LIFE,
    RequestMix,
    Workload,
    fragment_delta,
)
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


# -- the floor: what perfect repacking would allow -------------------------------------------------


Counts = dict[tuple[str, int], int]  # a class's running requests: (resource, size) -> how many


class Floor:
    """One class as a perfect repacker sees it: every running request may move at every event,
    so only the multiset of running requests matters, not where they run.

    `fits`: can the running requests and one more be packed at all? Exact for whole GPUs and
    MIG slices; for VRAM shares True or False where a test decides it (few enough requests,
    first-fit-decreasing succeeds, or the Martello-Toth L2 bound excludes it) and None where
    none does. `least_stranded`: a lower bound on the stranded measure of every layout of the
    running requests, so also of the repacker's own.
    """

    def __init__(
        self, cls: str, nodes: Sequence[NodeFacts], mix: Sequence[tuple[str, int, float]]
    ) -> None:
        self.cls = cls
        self.mix = list(mix)
        self.resources = tuple(sorted({r for r, _, _ in mix}))
        self.caps = {r: [n.allocatable.get(r, 0) for n in nodes] for r in self.resources}
        self.totals = {r: sum(c) for r, c in self.caps.items()}
        self.memo: dict[tuple[tuple[tuple[str, int], int], ...], tuple[float, float]] = {}
        self.built: dict[tuple[tuple[tuple[str, int], int], ...], tuple[float, float] | None] = {}
        largest = max(max(c) for c in self.caps.values())
        # P(size > f) of the class's request mix, for f = 0..largest (one resource classes).
        self.above = [sum(p for _, q, p in mix if q > f) for f in range(largest + 1)]
        self.nested: dict[int, int] = {}
        if cls == "whole":
            # Sizes and capacities are powers of two: requests of size s or more fit only on
            # nodes of capacity s or more, and placing the largest first never wastes room
            # (every free amount stays a multiple of the next size down), so these nested sums
            # are necessary and sufficient for a packing to exist.
            sizes = {q for _, q, _ in mix}
            (resource,) = self.resources
            if any(v & (v - 1) for v in sizes | set(self.caps[resource]) if v):
                raise ValueError("whole-GPU repacking is exact for powers of two only")
            self.nested = {s: sum(c for c in self.caps[resource] if c >= s) for s in sizes}
            # The least stranded measure of any split of F free GPUs into nodes of at most
            # `largest`: node sizes and the items on them relaxed away.
            self.split = [0.0] * (self.totals[resource] + 1)
            for x in range(1, len(self.split)):
                self.split[x] = min(
                    p * self.above[p] + self.split[x - p] for p in range(1, min(x, largest) + 1)
                )
        elif len(set(self.caps[self.resources[0]])) != 1 or (
            cls == "mig" and any(len(set(c)) != 1 for c in self.caps.values())
        ):
            raise ValueError("VRAM buckets and MIG nodes must be alike")

    def fits(self, running: Counts, resource: str, qty: int) -> bool | None:
        if self.cls == "mig":
            held = sum(q * n for (r, q), n in running.items() if r == resource)
            return held + qty <= self.totals[resource]
        if self.cls == "whole":
            for s, room in self.nested.items():
                held = sum(q * n for (_, q), n in running.items() if q >= s)
                if held + (qty if qty >= s else 0) > room:
                    return False
            return True
        bucket, count = self.caps[resource][0], len(self.caps[resource])
        sizes = [q for (_, q), n in running.items() for _ in range(n)] + [qty]
        if qty > bucket or sum(sizes) > bucket * count or _l2_bins(sizes, bucket) > count:
            return False
        if len(sizes) <= count or _ffd_feasible(sizes, bucket, count):
            return True
        return None

    def least_stranded(self, running: Counts) -> tuple[float, float]:
        """(units, GPUs) that every layout of `running` strands at least."""
        key = tuple(sorted((k, n) for k, n in running.items() if n))
        hit = self.memo.get(key)
        if hit is None:
            if self.cls == "mig":
                hit = self._mig(running)
            elif self.cls == "whole":
                (resource,) = self.resources
                free = self.totals[resource] - sum(q * n for (_, q), n in running.items())
                hit = (self.split[free], self.split[free])
            else:
                hit = self._vram(running)
            self.memo[key] = hit
        return hit

    def repacked(self, running: Counts) -> tuple[float, float] | None:
        """(units, GPUs) stranded by a layout of `running` that a repacker can build, or None
        when none was found: an upper end for the least stranded measure, exact for MIG."""
        key = tuple(sorted((k, n) for k, n in running.items() if n))
        if key in self.built:
            return self.built[key]
        (resource, *_) = self.resources
        caps = sorted(self.caps[resource], reverse=True)
        frees: list[int] | None = None
        if self.cls == "mig":
            hit: tuple[float, float] | None = self.least_stranded(running)
        elif self.cls == "whole":
            # Largest first, node after node: with powers of two every node but the last used
            # is filled exactly.
            left = {q: n for (_, q), n in running.items() if n}
            frees = []
            for cap in caps:
                room = cap
                for q in sorted(left, reverse=True):
                    take = min(left[q], room // q)
                    left[q] -= take
                    room -= take * q
                frees.append(room)
            if any(left.values()):
                frees = None
        else:
            frees = self._least_fragmenting(running, caps) or self._first_fit_decreasing(
                running, caps
            )
        if self.cls != "mig":
            if frees is None:
                hit = None
            else:
                units = sum(f * self.above[f] for f in frees)
                hit = (units, gpu_units(resource, units))
        self.built[key] = hit
        return hit

    def _least_fragmenting(self, running: Counts, caps: Sequence[int]) -> list[int] | None:
        # Largest first, each where the stranded measure rises least (FGD offline, with the
        # whole trace's mix), the least leftover among equals; buckets alike, so by free amount.
        free = {caps[0]: len(caps)}
        sizes = sorted(((q, n) for (_, q), n in running.items() if n), reverse=True)
        for q, n in sizes:
            for _ in range(n):
                options = [f for f, c in free.items() if c and f >= q]
                if not options:
                    return None
                f = min(
                    options,
                    key=lambda f: ((f - q) * self.above[f - q] - f * self.above[f], f - q),
                )
                free[f] -= 1
                free[f - q] = free.get(f - q, 0) + 1
        return [f for f, c in free.items() for _ in range(c)]

    def _first_fit_decreasing(self, running: Counts, caps: Sequence[int]) -> list[int] | None:
        frees = list(caps)
        for q in sorted((q for (_, q), n in running.items() for _ in range(n)), reverse=True):
            i = next((i for i, f in enumerate(frees) if f >= q), -1)
            if i < 0:
                return None
            frees[i] -= q
        return frees

    def _vram(self, running: Counts) -> tuple[float, float]:
        # A share over half the bucket has a bucket of its own; the gap it leaves is stranded
        # unless requests no larger than the gap fill it. A gap of f GB strands at least
        # f * P(size > gap) (P(size > f) only grows as f shrinks), and filling the smallest,
        # costliest gaps first from the requests that fit them is the most any layout can fill
        # (a request that fits a gap fits every larger one), even with requests split.
        (resource,) = self.resources
        bucket = self.caps[resource][0]
        gaps = sorted(
            bucket - q for (_, q), n in running.items() if 2 * q > bucket for _ in range(n)
        )
        small = sorted((q, q * n) for (_, q), n in running.items() if 2 * q <= bucket and n)
        units = 0.0
        pool = 0
        i = 0
        for gap in gaps:
            while i < len(small) and small[i][0] <= gap:
                pool += small[i][1]
                i += 1
            fill = min(gap, pool)
            pool -= fill
            units += (gap - fill) * self.above[gap]
        return units, gpu_units(resource, units)

    def _mig(self, running: Counts) -> tuple[float, float]:
        # Nodes are alike, so a layout is which shapes each node has run out of (a node out of
        # none, or out of all, strands nothing) and how the rest of each shape's slices spread.
        # For each multiset of such patterns the rest goes first to the nodes whose missing
        # shapes are likeliest requested (their free slices are the costly ones), up to one
        # slice short of full; the least over all multisets is exact.
        shapes = self.resources
        per = [self.caps[r][0] for r in shapes]
        prob = [sum(p for r, _, p in self.mix if r == s) for s in shapes]
        weight = [gpu_units(s, 1) for s in shapes]
        used = [sum(q * n for (r, q), n in running.items() if r == s) for s in shapes]
        count = len(self.caps[shapes[0]])
        patterns = range(1 << len(shapes))
        missing = [sum(prob[k] for k in range(len(shapes)) if m >> k & 1) for m in patterns]
        best_units = best_gpus = math.inf
        for layout in itertools.combinations_with_replacement(patterns, count):
            units = gpus = 0.0
            for k, cap in enumerate(per):
                out = sum(1 for m in layout if m >> k & 1)
                rest = used[k] - out * cap
                if rest < 0 or rest > (count - out) * (cap - 1):
                    break
                for miss in sorted((missing[m] for m in layout if not m >> k & 1), reverse=True):
                    take = min(rest, cap - 1)
                    rest -= take
                    units += (cap - take) * miss
                    gpus += (cap - take) * miss * weight[k]
            else:
                best_units, best_gpus = min(best_units, units), min(best_gpus, gpus)
        return best_units, best_gpus


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


ORACLE = "repack oracle"
ORACLE_GENEROUS = "repack oracle, generous"


def unquantised(rng: random.Random, workload: Callable[[], Workload | None]) -> Chooser:
    """FGD without the 0..10 range: the least rise in expected fragmentation, then the least
    leftover, then at random. Whether the extender's quantising and ties cost anything."""

    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        name = demand.kind[0]
        want = demand.requests[name]
        mix = workload()
        sizes = mix.of(name) if mix is not None else None
        keys = []
        for i in fit:
            free = nodes[i].allocatable[name] - used_of(nodes[i].name).get(name, 0)
            delta = fragment_delta(free, want, sizes) if sizes else 0.0
            keys.append((round(delta, 9), free - want))
        top = min(keys)
        best = [fit[k] for k, key in enumerate(keys) if key == top]
        return best[rng.randrange(len(best))]

    return choose


def trace_workload(tasks: Sequence[Task]) -> Workload:
    """The whole trace's request mix, the one the stranded measure is taken against."""
    sizes: dict[str, list[tuple[int, float]]] = {}
    for mix in class_distributions(tasks).values():
        for resource, size, p in mix:
            sizes.setdefault(resource, []).append((size, p))
    return Workload({r: tuple(sorted(v)) for r, v in sizes.items()})


def policies(seed: int, trace: Workload) -> list[tuple[str, Chooser, RequestMix | None]]:
    """(label, chooser, the histogram arrivals feed). After `fgd (tmi)`, diagnostics of its
    score: ties and quantising, the histogram's half-life, and the distribution it is fed."""
    mixes = [RequestMix(), RequestMix(), RequestMix(10 * DEFAULT_HALF_LIFE)]
    return [
        ("first-fit", first_fit, None),
        ("best-fit", extender(random.Random(seed), lambda: None), None),
        ("spread", spread(random.Random(seed)), None),
        ("fgd (tmi)", extender(random.Random(seed), mixes[0].workload), mixes[0]),
        ("fgd, unquantised", unquantised(random.Random(seed), mixes[1].workload), mixes[1]),
        ("fgd, half-life x10", extender(random.Random(seed), mixes[2].workload), mixes[2]),
        ("fgd, whole trace's mix", extender(random.Random(seed), lambda: trace), None),
    ]


# -- the discrete-event replay ---------------------------------------------------------------------


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
        "unavoidable_stranded_gpus_time_avg": round(
            sum(b["unavoidable_stranded_gpus_time_avg"] for b in per_class.values()), 2
        ),
        "refused": round(arrived - admitted, 1),
        **(
            {
                "repacked_stranded_gpus_time_avg": round(
                    sum(b["repacked_stranded_gpus_time_avg"] for b in per_class.values()), 2
                )
            }
            if all("repacked_stranded_gpus_time_avg" in b for b in per_class.values())
            else {}
        ),
        "refused_with_room_after_repacking": round(
            sum(b["refused_with_room_after_repacking"] for b in per_class.values()), 1
        ),
    }


def _summary(runs: list[dict[str, Any]], started: float) -> dict[str, Any]:
    summary = _mean_runs(runs)
    summary["fleet"] = _fleet_totals(summary)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    return summary


def _against(ours: dict[str, Any], first: dict[str, Any]) -> dict[str, float]:
    return {
        "admitted_share_gain": round(ours["admitted_share"] / first["admitted_share"] - 1, 4),
        "admitted_gpu_share_gain": round(
            ours["admitted_gpu_share"] / first["admitted_gpu_share"] - 1, 4
        ),
        "stranded_gpus_reduction": round(
            1 - ours["stranded_gpus_time_avg"] / max(first["stranded_gpus_time_avg"], 1e-9), 4
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
        floor = floors(tasks, fleet)
        block: dict[str, Any] = {
            "compression": compression,
            "fleet_one_node_in": every,
            "offered": offered_load(tasks, fleet),
            "policies": {},
        }
        trace = trace_workload(tasks)
        for label, _, _ in policies(0, trace):
            randomised = label != "first-fit"
            runs = []
            run_started = time.perf_counter()
            for seed in range(SEEDS if randomised else 1):
                chooser, feed = next((c, f) for lab, c, f in policies(seed, trace) if lab == label)
                runs.append(
                    replay(tasks, fleet, demands, chooser, feed, floor, bracket=not randomised)
                )
            block["policies"][label] = _summary(runs, run_started)
            print(
                f"{load} {label}: {json.dumps(block['policies'][label]['fleet'])}", file=sys.stderr
            )
        for label, generous in ((ORACLE, False), (ORACLE_GENEROUS, True)):
            run_started = time.perf_counter()
            run = replay(tasks, fleet, demands, None, None, floor, generous, bracket=not generous)
            block["policies"][label] = _summary([run], run_started)
            print(
                f"{load} {label}: {json.dumps(block['policies'][label]['fleet'])}", file=sys.stderr
            )
        first = block["policies"]["first-fit"]["fleet"]
        gain = _against(block["policies"]["fgd (tmi)"]["fleet"], first)
        block["fgd_vs_first_fit"] = gain
        block["oracle_vs_first_fit"] = _against(block["policies"][ORACLE]["fleet"], first)
        block["generous_oracle_vs_first_fit"] = _against(
            block["policies"][ORACLE_GENEROUS]["fleet"], first
        )
        # How much of first fit's stranded measure moving its requests could remove at most
        # (down to the floor) and does remove (with the layout the repacker builds).
        block["first_fit_stranded_kept_after_repacking"] = {
            "at_least": round(
                first["unavoidable_stranded_gpus_time_avg"] / first["stranded_gpus_time_avg"], 4
            ),
            "with_the_layout_built": round(
                first["repacked_stranded_gpus_time_avg"] / first["stranded_gpus_time_avg"], 4
            ),
        }
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
