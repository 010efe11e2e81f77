"""Research, not a product benchmark (see bench/research/README.md).

What keeping tenants apart on shared GPUs costs: the mixed-class replay (`bench_mixed.py`'s
fleet, trace, loads and queueing) with every task given a tenant, run with shares of different
tenants mixing freely on a device, and with one tenant per shared device
(`inference_policy.placing.tenancy`'s rule, modelled in `mixed_fleet.py`: a share goes only on a
device no other tenant's share holds; whole-GPU and CPU tasks are unaffected).

Tenants, stated and seeded: the trace names none, so each deployment (a replica group,
`mixed_fleet.group_replicas` with `bench_mixed.REPLICA_WINDOW`; a task outside any group is its
own) is given a tenant drawn uniformly from `TENANTS` with `random.Random("tenants-<K>-<seed>")`
in the order deployments first arrive, and every replica of it is that tenant's. `K` = 4 is the
headline; 2 and 8 are run with best fit to see how the cost grows with the number of tenants.

Figures per load (moderate and heavy churn, arrivals only), policy (`best-fit` and `fgd (paper)`,
the benchmark's own models in `bench_mixed.py`) and mode, the mean of `SEEDS` seeds (tie-breaking
and the tenant draw): admitted demand (count share and GPU-weighted, in total and for the share
class), stranded GPUs (FGD's fragmentation, time-averaged over the arrival period; under the rule a
device another tenant holds counts as usable by a share type with chance 1 / K) and unallocated
GPUs; arrivals only, the GPU-weighted admission when the arrived demand reaches the fleet's GPU
count and the stranded GPUs once every task has arrived.

Run: `.venv/bin/python bench/research/bench_tenants_mixed.py` (about two minutes on 2 cores).
Writes bench/results/tenants_mixed.json.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "research"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from bench_churn import _mean_runs  # noqa: E402
from bench_mixed import (  # noqa: E402
    ARRIVAL_ONLY_EVERY,
    LOADS,
    PAPER,
    REPLICA_WINDOW,
    SEEDS,
    best_fit,
    fgd_paper,
)
from mixed_fleet import (  # noqa: E402
    DecayedMix,
    Node,
    Task,
    group_replicas,
    load_nodes,
    load_tasks,
    sample_nodes,
)
from mixed_replay import Chooser, replay  # noqa: E402

TENANTS = 4
MORE_TENANTS = (2, 8)
MODES = ("sharing freely", "one tenant per shared GPU")


def assign_tenants(tasks: Sequence[Task], tenants: int, seed: int) -> None:
    """Each deployment a tenant drawn uniformly, in order of first arrival; replicas alike."""
    rng = random.Random(f"tenants-{tenants}-{seed}")
    drawn: dict[int, int] = {}
    for task in tasks:
        group = task.deployment if task.deployment >= 0 else -1 - task.index
        if group not in drawn:
            drawn[group] = rng.randrange(tenants)
        task.tenant = drawn[group]


def _fleet(nodes: Sequence[Node], tenants: int) -> list[Node]:
    return [Node.of(n.name, n.cpu, n.mem, len(n.free_gpu), tenants) for n in nodes]


def _chooser(policy: str, seed: int) -> tuple[Chooser, Any]:
    if policy == "best-fit":
        return best_fit(random.Random(seed)), None
    mix = DecayedMix()
    return fgd_paper(random.Random(seed), lambda: mix.measure), lambda task: mix.observe(task.kind)


def _figures(run: dict[str, Any], churn: bool) -> dict[str, Any]:
    total, share = run["total"], run["share"]
    out: dict[str, Any] = {
        "admitted_share": total["admitted_share"],
        "admitted_gpu_share": total["admitted_gpu_share"],
        "share_class_admitted_gpu_share": share["admitted_gpu_share"],
    }
    if churn:
        out["stranded_gpus_time_avg"] = total["stranded_gpus_time_avg"]
        out["unallocated_gpus_time_avg"] = total["unallocated_gpus_time_avg"]
    else:
        snaps = run["arrival_only"]
        out["at_capacity_admitted_gpu_share"] = snaps["at_capacity"]["admitted_gpu_share"]
        out["end_stranded_gpus"] = snaps["end"]["stranded_gpus"]
        out["end_unallocated_gpus"] = snaps["end"]["unallocated_gpus"]
    return out


def run(
    tasks: list[Task], nodes: list[Node], policy: str, tenants: int, apart: bool, churn: bool
) -> dict[str, Any]:
    runs = []
    for seed in range(SEEDS):
        assign_tenants(tasks, tenants, seed)
        choose, feed = _chooser(policy, seed)
        fleet = _fleet(nodes, tenants if apart else 0)
        runs.append(_figures(replay(tasks, fleet, choose, feed, churn=churn), churn))
    return _mean_runs(runs)


def _cost(free: dict[str, Any], apart: dict[str, Any]) -> dict[str, float]:
    return {k: round(apart[k] - free[k], 4) for k in free}


def main() -> None:
    started = time.perf_counter()
    full = load_nodes()
    results: dict[str, Any] = {
        "kind": "research",
        "trace": "alibaba cluster-trace-gpu-v2023 (bench/data), bench_mixed.py's mapping",
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs",
        "seeds": SEEDS,
        "tenants": TENANTS,
        "assignment": "each deployment (replica group) a tenant uniformly at random, "
        "random.Random('tenants-<K>-<seed>'), in order of first arrival",
        "units": "GPUs (1000 milli); stranded: FGD's expected fragmented GPU share",
        "loads": {},
    }
    for label, compression, every in (*LOADS, ("arrival-only", 1, ARRIVAL_ONLY_EVERY)):
        churn = label != "arrival-only"
        nodes = sample_nodes(full, every)
        tasks = load_tasks(compression)
        group_replicas(tasks, REPLICA_WINDOW / compression)
        shares = sum(1 for t in tasks if t.cls == "share")
        block: dict[str, Any] = {"nodes": len(nodes), "share_tasks": shares, "policies": {}}
        for policy in ("best-fit", PAPER):
            free = run(tasks, nodes, policy, TENANTS, False, churn)
            apart = run(tasks, nodes, policy, TENANTS, True, churn)
            entry: dict[str, Any] = {MODES[0]: free, MODES[1]: apart, "cost": _cost(free, apart)}
            if policy == "best-fit":
                entry["cost_by_tenants"] = {
                    str(k): _cost(free, run(tasks, nodes, policy, k, True, churn))
                    for k in MORE_TENANTS
                }
            block["policies"][policy] = entry
            print(f"{label} {policy}: {json.dumps(entry['cost'])}", file=sys.stderr)
        results["loads"][label] = block
    results["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(results, indent=2)
    out = ROOT / "bench" / "results" / "tenants_mixed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    print(f"{results['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
