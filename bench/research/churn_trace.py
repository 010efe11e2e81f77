"""Research, not a product benchmark (see bench/research/README.md).

The churn replay's input: the Alibaba trace's tasks with their lifetimes, the sampled fleet
they run on, and the measure of stranded capacity every policy is judged by.

`bench_churn.py`'s docstring says how tasks become requests (`trace_fleet`'s mapping, plus each
task's lifetime and its CPU and memory), how arrivals are compressed and the fleet sampled to
make the replay contended, and what "stranded" means (FGD's fragmentation against the class's
typical request).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass

from trace_fleet import DATA, MIG_SHAPES, SHARE_CARD_GIB, VRAM, Fleet, Item, asks_mig

from inference_policy.placing.fragmentation import Workload

COMPRESSION = 100
FLEET_EVERY = 8
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
            if asks_mig(name) and shape is not None:
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


def trace_workload(tasks: Sequence[Task]) -> Workload:
    """The whole trace's request mix, the one the stranded measure is taken against."""
    sizes: dict[str, list[tuple[int, float]]] = {}
    for mix in class_distributions(tasks).values():
        for resource, size, p in mix:
            sizes.setdefault(resource, []).append((size, p))
    return Workload({r: tuple(sorted(v)) for r, v in sizes.items()})


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


__all__ = [
    "COMPRESSION",
    "FLEET_EVERY",
    "MIB",
    "MIG_GPU_SHARE",
    "Task",
    "build_tasks",
    "class_distributions",
    "gpu_units",
    "sample_fleet",
    "stranded",
    "trace_workload",
]
