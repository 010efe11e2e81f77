"""Research, not a product benchmark (see bench/research/README.md).

The mixed-class fleet: every node of the Alibaba trace, with the CPU tasks, whole-GPU tasks and
GPU-share tasks competing on the same machines, and the node model and fragmentation measure the
mixed replay (`mixed_replay.py`, `bench_mixed.py`) judges placements by.

The churn replay (`bench_churn.py`) never mixes classes on a node: a node there is whole-GPU only,
MIG only, or one VRAM bucket, so no placement can strand one class's capacity behind another's,
and the fragmentation-aware score has little to work on. FGD's gain (Weng et al., ATC '23) comes
from machines where the three kinds of task meet. This module is that fleet.

The mapping, every figure in trace units:

- Nodes: every row of `openb_node_list_all_node.csv` (1,523 nodes: 310 CPU-only, 1,213 GPU),
  with its real `cpu_milli` and `memory_mib`; a GPU node has `gpu` physical devices of 1000 milli
  each (the trace's own unit: a GPU's compute share in thousandths). `model` is kept but not
  used: every task's `gpu_spec` (allowed models) is empty in the default trace (checked at load).
- Tasks: every row of `openb_pod_list_default.csv` (8,152). A task with `num_gpu == 0` is a CPU
  task (`cpu`); `num_gpu >= 1` with `gpu_milli == 1000` a whole-GPU task (`whole`) needing
  `num_gpu` devices with nothing on them; `num_gpu == 1` with `gpu_milli < 1000` a share task
  (`share`) needing one device whose free share is at least its `gpu_milli` (the trace has no
  multi-GPU share). Every task needs its `cpu_milli` and `memory_mib` free on the node
  (kube-scheduler's NodeResourcesFit). Lifetime: `deletion_time - creation_time` (at least 1 s).
- A device holding a share is not free for a whole-GPU task, and a whole-GPU task's devices hold
  no share: the model of a node whose device layer hands out whole GPUs and shares from the same
  devices (a DRA driver publishing shareable devices, or a sharing device plugin such as HAMi's
  `nvidia.com/gpu` + `gpumem`/`gpucores`). Within the node the device layer picks the device, the
  same way under every policy: a share goes to the fullest device it fits on (HAMi's `binpack`
  device policy), a whole-GPU task to the lowest-numbered free devices (all alike).

Tenants (`bench_tenants_mixed.py`): each task may carry a tenant, and a node built with
`tenants` > 0 keeps one tenant per shared device (`inference_policy.placing.tenancy`'s rule: a share
does not isolate tenants, so a share goes only on a device with no other tenant's share); whole-GPU
and CPU tasks are unaffected (a whole device isolates). With `tenants` 0 shares mix freely, as
above. Under the rule the stranded measure counts a device another tenant's share holds as
usable by a share type with the chance the type's task is that tenant's, 1 / `tenants` (the
tenants are assigned uniformly at random).

Stranded capacity is FGD's fragmentation: a node's free GPU share that a task drawn from the
workload cannot use, in expectation over the workload's task types (cpu, memory, num_gpu,
gpu_milli). For a type the node cannot host at all (too little free CPU or memory, no device
with its share free, too few free devices) every free milli is a fragment; for a share type that
fits, the free share of the devices below its `gpu_milli`; for a whole-GPU type that fits, the
partly used devices. CPU types are left out of the distribution: FGD counts all of a node's free
GPU share as a fragment for them wherever they land, which adds the same amount to every node's
rise for a given placement and so changes no choice (and would only inflate the measure).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trace_fleet import DATA

GPU_MILLI = 1000
NODE_LIST = "openb_node_list_all_node.csv"
POD_LIST = "openb_pod_list_default.csv"
CLASSES = ("cpu", "whole", "share")

# (cpu_milli, memory_mib, num_gpu, gpu_milli): a task type, what FGD's distribution is over.
TaskType = tuple[int, int, int, int]


@dataclass(slots=True)
class Task:
    index: int
    name: str
    cls: str
    cpu: int
    mem: int
    num_gpu: int
    milli: int  # per device
    arrive: float
    lifetime: float
    deployment: int = -1  # the replica group (`group_replicas`), -1 for none
    tenant: int = -1  # whose task it is (`bench_tenants_mixed.py`), -1 for nobody's

    @property
    def gpus(self) -> float:
        """GPU-weighted demand: a whole-GPU task its devices, a share its milli / 1000."""
        return self.num_gpu * self.milli / GPU_MILLI

    @property
    def kind(self) -> TaskType:
        return (self.cpu, self.mem, self.num_gpu, self.milli)


@dataclass(slots=True)
class Node:
    name: str
    cpu: int
    mem: int
    free_cpu: int
    free_mem: int
    free_gpu: list[int] = field(default_factory=list)  # free milli per device
    # One tenant per shared device when above 0 (the tenants there are): `owner` is the tenant
    # whose shares a device holds (-1: none), `sharers` how many shares it holds.
    tenants: int = 0
    owner: list[int] = field(default_factory=list)
    sharers: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, cpu: int, mem: int, gpus: int, tenants: int = 0) -> Node:
        return cls(name, cpu, mem, cpu, mem, [GPU_MILLI] * gpus, tenants, [-1] * gpus, [0] * gpus)

    def copy_empty(self) -> Node:
        return Node.of(self.name, self.cpu, self.mem, len(self.free_gpu), self.tenants)

    def key(self) -> tuple[int, int, tuple[int, ...]]:
        """The state the fragmentation measure depends on (devices are interchangeable)."""
        return (self.free_cpu, self.free_mem, tuple(sorted(self.free_gpu)))

    def owned(self) -> tuple[int, ...]:
        """The free milli of each device a tenant's shares hold, under the rule (else none)."""
        if not self.tenants:
            return ()
        return tuple(sorted(f for f, o in zip(self.free_gpu, self.owner, strict=True) if o >= 0))


Placement = tuple[int, tuple[int, ...]]  # (node index, the devices it holds)


def devices_for(node: Node, task: Task) -> tuple[int, ...] | None:
    """The devices the device layer gives `task` on `node`, or None when it does not fit there
    (CPU and memory included). An empty tuple for a CPU task that fits."""
    if task.cpu > node.free_cpu or task.mem > node.free_mem:
        return None
    if task.num_gpu == 0:
        return ()
    free = node.free_gpu
    if task.milli >= GPU_MILLI:
        whole = [d for d, f in enumerate(free) if f == GPU_MILLI]
        return tuple(whole[: task.num_gpu]) if len(whole) >= task.num_gpu else None
    apart = node.tenants > 0
    best = -1
    for d, f in enumerate(free):
        if apart and node.owner[d] not in (-1, task.tenant):
            continue  # another tenant's share is on it
        if f >= task.milli and (best < 0 or f < free[best]):
            best = d
    return (best,) if best >= 0 else None


def hold(node: Node, task: Task, devices: Iterable[int], sign: int) -> None:
    """Take (`sign` 1) or give back (-1) the task's CPU, memory and device shares."""
    node.free_cpu -= sign * task.cpu
    node.free_mem -= sign * task.mem
    share = node.tenants > 0 and 0 < task.milli < GPU_MILLI
    for d in devices:
        node.free_gpu[d] -= sign * task.milli
        if share:
            node.sharers[d] += sign
            node.owner[d] = task.tenant if node.sharers[d] > 0 else -1


# -- the fleet and the tasks ----------------------------------------------------------------------


def load_nodes() -> list[Node]:
    with (DATA / NODE_LIST).open() as handle:
        rows = list(csv.DictReader(handle))
    return [
        Node.of(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"])) for r in rows
    ]


def sample_nodes(nodes: Sequence[Node], every: int) -> list[Node]:
    """One node in `every` of each (CPU, memory, GPU count) shape, in the list's order, so the
    sample keeps the fleet's mix; the result is sorted by name (first fit's order)."""
    seen: dict[tuple[int, int, int], int] = {}
    kept: list[Node] = []
    for node in nodes:
        shape = (node.cpu, node.mem, len(node.free_gpu))
        count = seen.get(shape, 0)
        seen[shape] = count + 1
        if count % every == 0:
            kept.append(node.copy_empty())
    return sorted(kept, key=lambda n: n.name)


def load_tasks(compression: float = 1.0) -> list[Task]:
    """The trace's tasks by creation time, arrivals divided by `compression` (lifetimes kept)."""
    with (DATA / POD_LIST).open() as handle:
        rows = list(csv.DictReader(handle))
    if any(r["gpu_spec"] for r in rows):
        raise ValueError("a task names GPU models: the mapping ignores gpu_spec")
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    tasks: list[Task] = []
    for row in rows:
        count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        if count == 0:
            cls, milli = "cpu", 0
        elif milli >= GPU_MILLI:
            cls, milli = "whole", GPU_MILLI
        elif count == 1:
            cls = "share"
        else:
            raise ValueError(f"{row['name']}: a share of several GPUs is not in the mapping")
        created, deleted = int(row["creation_time"]), int(row["deletion_time"])
        tasks.append(
            Task(
                len(tasks),
                row["name"],
                cls,
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                count,
                milli,
                created / compression,
                float(max(deleted - created, 1)),
            )
        )
    return tasks


def group_replicas(tasks: Sequence[Task], window: float) -> int:
    """Mark replicas: a task with the same type as one that arrived at most `window` seconds
    (trace time) before it, in the same run of such arrivals, joins its deployment. The trace
    names no deployments; this is the grouping the replica figures rest on. Returns how many
    deployments have two replicas or more."""
    last: dict[TaskType, tuple[float, int]] = {}
    sizes: dict[int, int] = {}
    for task in tasks:
        seen = last.get(task.kind)
        group = seen[1] if seen is not None and task.arrive - seen[0] <= window else task.index
        task.deployment = group
        last[task.kind] = (task.arrive, group)
        sizes[group] = sizes.get(group, 0) + 1
    return sum(1 for n in sizes.values() if n > 1)


# -- FGD's fragmentation ---------------------------------------------------------------------------


def distribution(kinds: Iterable[TaskType]) -> dict[TaskType, float]:
    """The share of each GPU task type among `kinds` (CPU types dropped: see the docstring)."""
    counts: dict[TaskType, int] = {}
    for kind in kinds:
        if kind[2] > 0:
            counts[kind] = counts.get(kind, 0) + 1
    total = sum(counts.values())
    return {k: n / total for k, n in counts.items()} if total else {}


class Fragmentation:
    """FGD's expected fragmented GPU share of a node (milli) against one task distribution.

    F(node) = sum over types m of p_m * (free GPU milli the node cannot give m), computed per
    GPU shape: F = free - sum_s usable_s * P(type of shape s and its CPU and memory fit), with
    usable_s the free milli a type of shape s can use when it fits (under one tenant per shared
    device, the free milli of a device another tenant may hold counting 1 / `tenants` of it for a
    share type). Memoised by node state."""

    def __init__(self, dist: dict[TaskType, float]) -> None:
        shapes: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
        for (cpu, mem, count, milli), p in dist.items():
            shapes.setdefault((count, milli), []).append((cpu, mem, p))
        self.shapes = [(count, milli, tuple(sorted(t))) for (count, milli), t in shapes.items()]
        self.memo: dict[tuple[object, ...], float] = {}

    def of(self, node: Node) -> float:
        if not node.free_gpu:
            return 0.0
        state = node.key()
        owned = node.owned()
        key = (*state, owned, node.tenants) if owned else state
        hit = self.memo.get(key)
        if hit is None:
            hit = self._compute(node.free_cpu, node.free_mem, state[2], owned, node.tenants)
            self.memo[key] = hit
        return hit

    def _compute(
        self,
        cpu: int,
        mem: int,
        gpus: tuple[int, ...],
        owned: tuple[int, ...] = (),
        tenants: int = 0,
    ) -> float:
        free = sum(gpus)
        if free <= 0:
            return 0.0
        whole = sum(1 for g in gpus if g == GPU_MILLI)
        used = 0.0
        for count, milli, types in self.shapes:
            usable: float
            if milli >= GPU_MILLI:
                usable = whole * GPU_MILLI if whole >= count else 0
            else:
                usable = sum(g for g in gpus if g >= milli)
                if owned:
                    # Held by a tenant's shares: usable only by a task of that tenant.
                    usable -= (1 - 1 / tenants) * sum(g for g in owned if g >= milli)
            if not usable:
                continue
            weight = 0.0
            for t_cpu, t_mem, p in types:
                if t_cpu > cpu:
                    break
                if t_mem <= mem:
                    weight += p
            used += usable * weight
        return max(free - used, 0.0)


class DecayedMix:
    """The task types seen so far, each weighing half as much `half_life` GPU tasks later (the
    idea of `inference_policy.placing.fragmentation.RequestMix`, over whole task types instead of
    one resource's sizes). `measure` is re-taken every `refresh` observations, so its memo of node
    states lasts that long: a lag of at most `refresh` tasks behind the histogram."""

    def __init__(self, half_life: int = 500, refresh: int = 50) -> None:
        self.growth = 2.0 ** (1.0 / half_life)
        self.increment = 1.0
        self.weights: dict[TaskType, float] = {}
        self.refresh = refresh
        self.pending = 0
        self.measure = Fragmentation({})

    def observe(self, kind: TaskType) -> None:
        if kind[2] == 0:
            return
        self.increment *= self.growth
        self.weights[kind] = self.weights.get(kind, 0.0) + self.increment
        if self.increment > 1e100:
            self.weights = {k: w / self.increment for k, w in self.weights.items()}
            self.increment = 1.0
        self.pending += 1
        if self.pending >= self.refresh or not self.measure.shapes:
            total = sum(self.weights.values())
            kept = {k: w / total for k, w in self.weights.items() if w > 1e-4 * total}
            norm = sum(kept.values())
            self.measure = Fragmentation({k: w / norm for k, w in kept.items()})
            self.pending = 0


__all__ = [
    "CLASSES",
    "GPU_MILLI",
    "DecayedMix",
    "Fragmentation",
    "Node",
    "Placement",
    "Task",
    "TaskType",
    "devices_for",
    "distribution",
    "group_replicas",
    "hold",
    "load_nodes",
    "load_tasks",
    "sample_nodes",
]
