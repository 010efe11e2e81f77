"""Placement quality on a replayed production trace: the extender's best fit against first fit,
kube-scheduler's default spreading, and the offline optimum.

The fleet and the deployments come from the Alibaba GPU trace (bench/data, see its README):

- Nodes, by trace model. `G2` and the V100 nodes become whole-GPU nodes (H100 80GB, the same
  number of GPUs: `nvidia.com/gpu`); `G3` nodes become A100 80GB nodes in MIG mixed mode, each
  GPU cut as 3g.40gb + 2g.20gb + 2 x 1g.10gb; `T4`, `P100` and `A10` nodes become L40S 48GB
  nodes with the VRAM plugin. A VRAM binding names one bucket (`kamiwaza.ai/vram-gb-gpu-0`), so
  each such GPU is modelled as a bucket of its own (48 GB).
- Deployments, in trace order. A task with `gpu_milli == 1000` asks for `num_gpu` whole GPUs
  (1, 2, 4 or 8, tensor parallel). A shared task (`gpu_milli < 1000`) needs
  `ceil(gpu_milli / 1000 * 48)` GiB: half of them (by a hash of the task name) ask for an
  accounted VRAM share of that many GB, the other half for the smallest MIG slice that holds it
  (1g.10gb: 9Gi, 2g.20gb: 19Gi, 3g.40gb: 38Gi usable; larger ones take a VRAM share). CPU tasks
  are left out. The trace is replayed twice (arrivals only, no departures) so that every class
  is over-subscribed, as in the trace paper's fill-up experiments.

Policies, each placing every deployment as it arrives on a node where it fits, or refusing it:

- `best-fit (tmi)`: the extender's own code (`check_nodes`, `score_nodes`), the highest score
  winning and ties broken at random as kube-scheduler's selectHost does (mean of 5 seeds);
- `fgd (tmi)`: the extender's fragmentation-aware score (`score_nodes` with the decayed histogram
  of the requests that arrived so far, as the server keeps it), ties at random (mean of 5 seeds);
- `best-fit exact`: the least leftover capacity, unquantised (what the 0..10 scale approximates);
- `first-fit`: the first node (by name) where it fits;
- `spread`: the most free capacity, as kube-scheduler's default LeastAllocated scoring does.

Metrics, per class: deployments placed before the first refusal (the packing measure: an online
policy cannot choose which deployments arrive, so this is where it meets the optimum on equal
terms), capacity placed in total (GPUs, slices, GB; deployments that arrive after a refusal are
still placed where they fit) and deployments placed in total.

The optimum is exact for whole GPUs (item and node sizes are powers of two, so placing largest
first is optimal) and for MIG slices (unit items per shape). For VRAM shares the largest prefix
that fits is bracketed between first-fit-decreasing (a packing that exists) and the
Martello-Toth L2 bound, and ratios are taken against the upper end, so they understate the
policy; capacity in total is compared with every bucket full. Fifty windows of 40 consecutive
VRAM deployments on 8 buckets are also solved exactly, by branch and bound.

Run: `.venv/bin/python bench/bench_placement.py`. Writes bench/results/placement.json.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from inference_policy.fragmentation import RequestMix  # noqa: E402
from inference_policy.nodes import NodeFacts, node_facts  # noqa: E402
from inference_policy.placement import Demand, check_nodes, demand_for, score_nodes  # noqa: E402
from inference_policy.plan import parse_plan  # noqa: E402
from inference_policy.profile import ExtendedResourceBinding, VramPluginBinding  # noqa: E402
from localcluster.nodes import FakeNode  # noqa: E402
from tests.profilekit import gpu_binding  # noqa: E402

DATA = ROOT / "bench" / "data"
SHARE_CARD_GIB = 48
REPLAYS = 2
SEEDS = 5
WINDOWS = 50
TARGET = 0.97
MIG_SHAPES = (("1g.10gb", 9), ("2g.20gb", 19), ("3g.40gb", 38))
MIG_LAYOUT = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}  # per A100 80GB GPU
VRAM = "kamiwaza.ai/vram-gb-gpu-0"
WHOLE_MODELS = {"G2", "V100M32", "V100M16"}
MIG_MODELS = {"G3"}
SHARE_MODELS = {"T4", "P100", "A10"}


# -- fleet and deployments ------------------------------------------------------------------------


@dataclass
class Item:
    index: int
    name: str
    cls: str
    resource: str
    qty: int


@dataclass
class Fleet:
    specs: list[FakeNode] = field(default_factory=list)
    classes: dict[str, list[str]] = field(default_factory=dict)


def build_fleet(limit: int | None = None) -> Fleet:
    fleet = Fleet()
    with (DATA / "openb_node_list_gpu_node.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows[:limit]:
        name, gpus, model = row["sn"], int(row["gpu"]), row["model"]
        if model in WHOLE_MODELS:
            fleet.specs.append(FakeNode(name, gpus=gpus))
            fleet.classes.setdefault("whole", []).append(name)
        elif model in MIG_MODELS:
            mig = {shape: count * gpus for shape, count in MIG_LAYOUT.items()}
            fleet.specs.append(
                FakeNode(
                    name,
                    gpu_product="NVIDIA-A100-SXM4-80GB",
                    compute_capability="8.0",
                    gpus=gpus,
                    mig=mig,
                    whole_gpus=0,
                )
            )
            fleet.classes.setdefault("mig", []).append(name)
        elif model in SHARE_MODELS:
            for gpu in range(gpus):
                bucket = f"{name}-gpu{gpu}"
                fleet.specs.append(
                    FakeNode(
                        bucket,
                        gpu_product="NVIDIA-L40S",
                        compute_capability="8.9",
                        cuda_driver_major=12,
                        vram_gb=SHARE_CARD_GIB,
                        vram_budget=True,
                    )
                )
                fleet.classes.setdefault("vram", []).append(bucket)
    return fleet


def _half(name: str) -> bool:
    return hashlib.sha256(name.encode()).digest()[0] % 2 == 0


def build_items(replays: int = REPLAYS) -> list[Item]:
    with (DATA / "openb_pod_list_default.gpu.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    items: list[Item] = []
    for replay in range(replays):
        for row in rows:
            name = f"{row['name']}-r{replay}"
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if milli >= 1000:
                items.append(Item(len(items), name, "whole", "nvidia.com/gpu", count))
                continue
            need = math.ceil(milli * SHARE_CARD_GIB / 1000)
            shape = next((s for s, usable in MIG_SHAPES if usable >= need), None)
            if _half(row["name"]) and shape is not None:
                items.append(Item(len(items), name, "mig", f"nvidia.com/mig-{shape}", 1))
            else:
                items.append(Item(len(items), name, "vram", VRAM, need))
    return items


# -- the extender's view of a deployment ----------------------------------------------------------


def _binding(resource: str) -> Any:
    if resource == VRAM:
        return VramPluginBinding.model_validate(
            gpu_binding(
                "share", allocator="vram-plugin", resource=VRAM, cc="8.9", cuda=12, memory="44Gi"
            )
        )
    memory = {"nvidia.com/gpu": "79Gi"}.get(resource)
    if memory is None:
        shape = resource.removeprefix("nvidia.com/mig-")
        memory = f"{dict(MIG_SHAPES)[shape]}Gi"
    return ExtendedResourceBinding.model_validate(
        gpu_binding(resource.replace("/", "-").replace(".", "-"), resource=resource, memory=memory)
    )


def gpu_plan(binding: Any, quantity: int) -> dict[str, Any]:
    """A plan as the planner writes one for `quantity` units of the binding's resource."""
    name = binding.resource.name
    return {
        "status": 200,
        "path": "gpu",
        "derived": True,
        "profile": "bench",
        "bindingId": binding.id,
        "engine": "llamacpp",
        "variantId": "llamacpp-nvidia-amd64",
        "image": "registry.invalid/llamacpp@sha256:" + "1" * 64,
        "runtimeClassName": "nvidia",
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "resources": {"requests": {name: str(quantity)}, "limits": {name: str(quantity)}},
        "deviceCount": quantity if name == "nvidia.com/gpu" else 1,
        "engineArgs": {},
        "inferenceResources": {
            "schemaVersion": 1,
            "accelerator": {"capability": "gpu", "count": 1, "memory": {"minimum": "1Gi"}},
            "runtime": {"selection": "automatic"},
        },
        "bundle": {"version": 1, "sha256": "0" * 64},
    }


class Demands:
    """One `Demand` per (resource, quantity), built through the real plan parser."""

    def __init__(self) -> None:
        self.bindings: dict[str, Any] = {}
        self.cache: dict[tuple[str, int], Demand] = {}

    def get(self, item: Item) -> Demand:
        key = (item.resource, item.qty)
        demand = self.cache.get(key)
        if demand is None:
            binding = self.bindings.get(item.resource) or _binding(item.resource)
            self.bindings[item.resource] = binding
            demand = demand_for(parse_plan(gpu_plan(binding, item.qty)), binding, None, "bench")
            self.cache[key] = demand
        return demand


# -- policies -------------------------------------------------------------------------------------

Chooser = Callable[[Demand, list[NodeFacts], list[int], Callable[[str], dict[str, int]]], int]


def _fitting(demand: Demand, nodes: list[NodeFacts], used_of: Any) -> list[int]:
    return [
        i for i, v in enumerate(check_nodes(demand, nodes, used_of)) if v is not None and v.fits
    ]


def _leftover(demand: Demand, node: NodeFacts, used_of: Callable[[str], dict[str, int]]) -> int:
    name = demand.checked[0]
    return node.allocatable[name] - used_of(node.name).get(name, 0) - demand.requests[name]


def tmi_best_fit(rng: random.Random) -> Chooser:
    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        scores = score_nodes(demand, [nodes[i] for i in fit], used_of)
        top = max(scores)
        best = [fit[i] for i, s in enumerate(scores) if s == top]
        return best[rng.randrange(len(best))] if len(best) > 1 else best[0]

    return choose


class FgdChooser:
    """The extender's score with the workload histogram `simulate` feeds every arrival into."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.mix = RequestMix()

    def __call__(self, demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        scores = score_nodes(demand, [nodes[i] for i in fit], used_of, self.mix.workload())
        top = max(scores)
        best = [fit[i] for i, s in enumerate(scores) if s == top]
        return best[self.rng.randrange(len(best))] if len(best) > 1 else best[0]


def exact_best_fit(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
    return min(fit, key=lambda i: (_leftover(demand, nodes[i], used_of), i))


def first_fit(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
    return fit[0]


def spread(rng: random.Random) -> Chooser:
    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        lefts = [_leftover(demand, nodes[i], used_of) for i in fit]
        top = max(lefts)
        best = [fit[i] for i, v in enumerate(lefts) if v == top]
        return best[rng.randrange(len(best))]

    return choose


def simulate(
    items: Sequence[Item], fleet: Fleet, demands: Demands, choose: Chooser
) -> dict[str, dict[str, int]]:
    specs = {spec.name: spec for spec in fleet.specs}
    facts = {
        cls: [node_facts(specs[name].manifest()) for name in sorted(names)]
        for cls, names in fleet.classes.items()
    }
    usage: dict[str, dict[str, int]] = {spec.name: {} for spec in fleet.specs}
    used_of = usage.__getitem__
    out = {
        cls: {"placed": 0, "placed_before_first_refusal": -1, "capacity_placed": 0, "seen": 0}
        for cls in fleet.classes
    }
    feed = getattr(choose, "mix", None)
    for item in items:
        stats = out[item.cls]
        stats["seen"] += 1
        demand = demands.get(item)
        if feed is not None:
            feed.observe(item.resource, item.qty)
        nodes = facts[item.cls]
        fit = _fitting(demand, nodes, used_of)
        if not fit:
            if stats["placed_before_first_refusal"] < 0:
                stats["placed_before_first_refusal"] = stats["placed"]
            continue
        node = nodes[choose(demand, nodes, fit, used_of)]
        held = usage[node.name]
        held[item.resource] = held.get(item.resource, 0) + item.qty
        stats["placed"] += 1
        stats["capacity_placed"] += item.qty
    for stats in out.values():
        if stats["placed_before_first_refusal"] < 0:
            stats["placed_before_first_refusal"] = stats["placed"]
    return out


# -- the offline optimum --------------------------------------------------------------------------


CLASS_RESOURCES = {
    "whole": ("nvidia.com/gpu",),
    "mig": tuple(f"nvidia.com/mig-{shape}" for shape, _ in MIG_SHAPES),
    "vram": (VRAM,),
}


def _capacities(fleet: Fleet, cls: str) -> dict[str, list[int]]:
    specs = {spec.name: spec for spec in fleet.specs}
    caps: dict[str, list[int]] = {}
    for name in fleet.classes[cls]:
        facts = node_facts(specs[name].manifest())
        for resource in CLASS_RESOURCES[cls]:
            if facts.allocatable.get(resource):
                caps.setdefault(resource, []).append(facts.allocatable[resource])
    return caps


def _pow2_feasible(sizes: Sequence[int], bins: Sequence[int]) -> bool:
    """Exact when every size and capacity is a power of two: largest first, anywhere with room."""
    free = sorted(bins, reverse=True)
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                break
        else:
            return False
    return True


def _ffd_feasible(sizes: Sequence[int], capacity: int, count: int) -> bool:
    free: list[int] = []
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                break
        else:
            if len(free) == count or size > capacity:
                return False
            free.append(capacity - size)
    return True


def _l2_bins(sizes: Sequence[int], capacity: int) -> int:
    """Martello-Toth L2: a lower bound on the identical bins needed to hold `sizes`."""
    best = math.ceil(sum(sizes) / capacity)
    candidates = {0} | {s for s in sizes if s <= capacity // 2}
    for alpha in candidates:
        j1 = [s for s in sizes if s > capacity - alpha]
        j2 = [s for s in sizes if capacity - alpha >= s > capacity / 2]
        j3 = [s for s in sizes if capacity / 2 >= s >= alpha]
        spare = len(j2) * capacity - sum(j2)
        bound = len(j1) + len(j2) + max(0, math.ceil((sum(j3) - spare) / capacity))
        best = max(best, bound)
    return best


def _largest_prefix(n: int, feasible: Callable[[int], bool]) -> int:
    low, high = 0, n
    while low < high:
        mid = (low + high + 1) // 2
        if feasible(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _prefix(sizes: Sequence[int], feasible: Callable[[Sequence[int]], bool]) -> int:
    return _largest_prefix(len(sizes), lambda k: feasible(sizes[:k]))


def optimum(items: Sequence[Item], fleet: Fleet) -> dict[str, dict[str, Any]]:
    """Per class: the most deployments an omniscient packer places before the first refusal,
    and the most capacity it can place in total (exact, or bracketed)."""
    out: dict[str, dict[str, Any]] = {}
    for cls in fleet.classes:
        seq = [item for item in items if item.cls == cls]
        caps = _capacities(fleet, cls)
        sizes = [item.qty for item in seq]
        if cls == "whole":
            bins = caps["nvidia.com/gpu"]
            prefix = _prefix(sizes, lambda part, b=bins: _pow2_feasible(part, b))  # type: ignore[misc]
            out[cls] = {
                "exact": True,
                "placed_before_first_refusal": prefix,
                "capacity_placed": _pow2_gpus(sorted(sizes, reverse=True), bins),
                "capacity": sum(bins),
            }
        elif cls == "mig":
            per_shape = {r: sum(v) for r, v in caps.items()}
            seen: dict[str, int] = {}
            prefix = len(seq)
            for position, item in enumerate(seq):
                seen[item.resource] = seen.get(item.resource, 0) + 1
                if seen[item.resource] > per_shape.get(item.resource, 0):
                    prefix = position
                    break
            asked = {r: sum(1 for i in seq if i.resource == r) for r in per_shape}
            out[cls] = {
                "exact": True,
                "placed_before_first_refusal": prefix,
                "capacity_placed": sum(min(asked[r], per_shape[r]) for r in per_shape),
                "capacity": sum(per_shape.values()),
            }
        else:
            bins = caps[VRAM]
            size, count = max(bins), len(bins)
            lower = _prefix(sizes, lambda part, c=size, n=count: _ffd_feasible(part, c, n))  # type: ignore[misc]
            upper = _prefix(sizes, lambda part, c=size, n=count: _l2_bins(part, c) <= n)  # type: ignore[misc]
            out[cls] = {
                "exact": lower == upper,
                "placed_before_first_refusal": upper,
                "placed_before_first_refusal_lower_bound": lower,
                # Offline, choosing which deployments to take, no packing beats every bucket
                # full; first-fit-decreasing over all of them is shown for comparison.
                "capacity_placed": min(sum(sizes), size * count),
                "capacity_placed_offline_ffd": _ffd_placed(sizes, size, count),
                "capacity": size * count,
            }
    return out


def _ffd_placed(sizes: Sequence[int], capacity: int, count: int) -> int:
    free = [capacity] * count
    placed = 0
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                placed += size
                break
    return placed


def _pow2_gpus(sizes_desc: Sequence[int], bins: Sequence[int]) -> int:
    free = sorted(bins, reverse=True)
    placed = 0
    for size in sizes_desc:
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                placed += size
                break
    return placed


# -- a small instance, solved exactly -------------------------------------------------------------


def _exact_feasible(sizes: Sequence[int], capacity: int, count: int) -> bool:
    """Branch and bound: can `sizes` go into `count` bins of `capacity`?"""
    order = sorted(sizes, reverse=True)
    if sum(order) > capacity * count or (order and order[0] > capacity):
        return False
    free = [capacity] * count

    def place(k: int) -> bool:
        if k == len(order):
            return True
        size = order[k]
        tried: set[int] = set()
        for i in range(count):
            room = free[i]
            if room < size or room in tried:
                continue
            tried.add(room)  # bins with the same room are interchangeable
            free[i] = room - size
            if place(k + 1):
                return True
            free[i] = room
        return False

    return place(0)


def exact_windows(items: Sequence[Item], demands: Demands) -> dict[str, Any]:
    """Consecutive windows of the VRAM deployments on 8 buckets, each solved exactly."""
    buckets, length = 8, 40
    fleet = Fleet()
    for b in range(buckets):
        name = f"small-gpu{b}"
        fleet.specs.append(
            FakeNode(
                name,
                gpu_product="NVIDIA-L40S",
                compute_capability="8.9",
                cuda_driver_major=12,
                vram_gb=SHARE_CARD_GIB,
                vram_budget=True,
            )
        )
        fleet.classes.setdefault("vram", []).append(name)
    seq = [item for item in items if item.cls == "vram"]
    windows = [seq[i : i + length] for i in range(0, len(seq) - length + 1, length)][:WINDOWS]
    optimum_total = 0
    placed = dict.fromkeys((label for label, _ in _policies(0)), 0)
    worst = dict.fromkeys(placed, 1.0)
    started = time.perf_counter()
    for window in windows:
        sizes = [item.qty for item in window]
        best = _prefix(sizes, lambda part: _exact_feasible(part, SHARE_CARD_GIB, buckets))
        optimum_total += best
        for label, chooser in _policies(window[0].index):
            got = simulate(window, fleet, demands, chooser)["vram"]["placed_before_first_refusal"]
            placed[label] += got
            worst[label] = min(worst[label], got / best if best else 1.0)
    return {
        "windows": len(windows),
        "buckets": buckets,
        "bucket_gb": SHARE_CARD_GIB,
        "deployments_per_window": length,
        "optimum_placed_before_first_refusal": optimum_total,
        "seconds": round(time.perf_counter() - started, 1),
        "policies": {
            label: {
                "placed_before_first_refusal": placed[label],
                "of_optimum": round(placed[label] / optimum_total, 4),
                "worst_window": round(worst[label], 4),
            }
            for label in placed
        },
    }


# -- driver ---------------------------------------------------------------------------------------


def _policies(seed: int) -> list[tuple[str, Chooser]]:
    return [
        ("best-fit (tmi)", tmi_best_fit(random.Random(seed))),
        ("fgd (tmi)", FgdChooser(random.Random(seed))),
        ("best-fit exact", exact_best_fit),
        ("first-fit", first_fit),
        ("spread", spread(random.Random(seed))),
    ]


def main() -> None:
    fleet = build_fleet()
    items = build_items()
    demands = Demands()
    started = time.perf_counter()
    opt = optimum(items, fleet)
    opt_s = time.perf_counter() - started
    policies: dict[str, Any] = {}
    for label, _ in _policies(0):
        seeds = range(SEEDS) if label in ("best-fit (tmi)", "fgd (tmi)", "spread") else range(1)
        runs = []
        run_started = time.perf_counter()
        for seed in seeds:
            chooser = dict(_policies(seed))[label]
            runs.append(simulate(items, fleet, demands, chooser))
        elapsed = time.perf_counter() - run_started
        summary: dict[str, Any] = {"seeds": len(runs), "seconds": round(elapsed, 1)}
        for cls in fleet.classes:
            block: dict[str, Any] = {}
            for metric in ("placed_before_first_refusal", "capacity_placed", "placed"):
                values = [run[cls][metric] for run in runs]
                mean = sum(values) / len(values)
                entry: dict[str, Any] = {"mean": round(mean, 1), "min": min(values)}
                ref = opt[cls].get(metric)
                if ref:
                    entry["of_optimum"] = round(mean / ref, 4)
                low = opt[cls].get(f"{metric}_lower_bound")
                if low and low != ref:
                    entry["of_optimum_at_most"] = round(mean / low, 4)
                block[metric] = entry
            summary[cls] = block
        policies[label] = summary
    fleet_summary = {
        cls: {"nodes_or_buckets": len(names), "capacity": opt[cls]["capacity"]}
        for cls, names in fleet.classes.items()
    }
    demand_summary = {
        cls: {
            "deployments": sum(1 for i in items if i.cls == cls),
            "capacity_asked": sum(i.qty for i in items if i.cls == cls),
        }
        for cls in fleet.classes
    }
    ours = policies["best-fit (tmi)"]
    windows = exact_windows(items, demands)
    worst = min(
        *(ours[cls]["placed_before_first_refusal"]["of_optimum"] for cls in fleet.classes),
        windows["policies"]["best-fit (tmi)"]["of_optimum"],
    )
    results = {
        "trace": "alibaba cluster-trace-gpu-v2023 (openb), bench/data",
        "replays": REPLAYS,
        "units": {"whole": "GPUs", "mig": "slices", "vram": "GB"},
        "fleet": fleet_summary,
        "demand": demand_summary,
        "optimum": opt,
        "optimum_seconds": round(opt_s, 1),
        "policies": policies,
        "exact_windows": windows,
        "target_of_optimum": TARGET,
        "tmi_worst_ratio": worst,
        "meets_target": worst >= TARGET,
    }
    text = json.dumps(results, indent=2)
    print(text)
    out = ROOT / "bench" / "results" / "placement.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
