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

The fleet and deployments come from `research/trace_fleet.py`, the policies from
`research/placement_policies.py` and the packing tests behind the optimum from
`research/packing.py`, all three shared with the research replay `research/bench_churn.py`.

Run: `.venv/bin/python bench/bench_placement.py`. Writes bench/results/placement.json.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The trace's fleet, the policies and the packing bounds are the research replays' modules.
sys.path.insert(0, str(ROOT / "bench" / "research"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from packing import (  # noqa: E402
    exact_feasible,
    ffd_feasible,
    ffd_placed,
    fitting_prefix,
    l2_bins,
    pow2_feasible,
    pow2_gpus,
)
from placement_policies import (  # noqa: E402
    Chooser,
    FgdChooser,
    exact_best_fit,
    first_fit,
    spread,
    tmi_best_fit,
)
from trace_fleet import (  # noqa: E402
    MIG_SHAPES,
    REPLAYS,
    SHARE_CARD_GIB,
    VRAM,
    Demands,
    Fleet,
    Item,
    build_fleet,
    build_items,
    share_bucket,
)

from inference_policy.placing.nodes import NodeFacts, node_facts  # noqa: E402
from inference_policy.placing.placement import Demand, check_nodes  # noqa: E402

SEEDS = 5
WINDOWS = 50
TARGET = 0.97


# -- the online replay ----------------------------------------------------------------------------


def _fitting(demand: Demand, nodes: list[NodeFacts], used_of: Any) -> list[int]:
    return [
        i for i, v in enumerate(check_nodes(demand, nodes, used_of)) if v is not None and v.fits
    ]


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
            prefix = fitting_prefix(sizes, lambda part, b=bins: pow2_feasible(part, b))  # type: ignore[misc]
            out[cls] = {
                "exact": True,
                "placed_before_first_refusal": prefix,
                "capacity_placed": pow2_gpus(sorted(sizes, reverse=True), bins),
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
            lower = fitting_prefix(sizes, lambda part, c=size, n=count: ffd_feasible(part, c, n))  # type: ignore[misc]
            upper = fitting_prefix(sizes, lambda part, c=size, n=count: l2_bins(part, c) <= n)  # type: ignore[misc]
            out[cls] = {
                "exact": lower == upper,
                "placed_before_first_refusal": upper,
                "placed_before_first_refusal_lower_bound": lower,
                # Offline, choosing which deployments to take, no packing beats every bucket
                # full; first-fit-decreasing over all of them is shown for comparison.
                "capacity_placed": min(sum(sizes), size * count),
                "capacity_placed_offline_ffd": ffd_placed(sizes, size, count),
                "capacity": size * count,
            }
    return out


# -- a small instance, solved exactly -------------------------------------------------------------


def exact_windows(items: Sequence[Item], demands: Demands) -> dict[str, Any]:
    """Consecutive windows of the VRAM deployments on 8 buckets, each solved exactly."""
    buckets, length = 8, 40
    fleet = Fleet()
    for b in range(buckets):
        name = f"small-gpu{b}"
        fleet.specs.append(share_bucket(name))
        fleet.classes.setdefault("vram", []).append(name)
    seq = [item for item in items if item.cls == "vram"]
    windows = [seq[i : i + length] for i in range(0, len(seq) - length + 1, length)][:WINDOWS]
    optimum_total = 0
    placed = dict.fromkeys((label for label, _ in _policies(0)), 0)
    worst = dict.fromkeys(placed, 1.0)
    started = time.perf_counter()
    for window in windows:
        sizes = [item.qty for item in window]
        best = fitting_prefix(sizes, lambda part: exact_feasible(part, SHARE_CARD_GIB, buckets))
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
