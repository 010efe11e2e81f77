"""Research, not a product benchmark (see bench/research/README.md).

Packing where classes meet: the Alibaba trace's CPU, whole-GPU and GPU-share tasks on the same
nodes, replayed with churn and with arrivals only, for first fit, best fit, spreading, the
extender's own score (the core's `score_nodes`, with and without the workload histogram), FGD's
rule as its paper states it, and the repack references.

`bench_churn.py` keeps each class on nodes of its own, so nothing a placement does to one class
strands another's capacity; FGD's published gain (Weng et al., ATC '23: up to 49% fewer
unallocated GPUs than best fit) comes from machines where CPU tasks, whole-GPU tasks and shares
compete. This replay is that case. The mapping (every node of the all-node list with its real CPU
and memory; each GPU a physical device that shares and whole-GPU Pods compete for, in the
trace's milli units; every Pod needing its CPU and memory; `gpu_spec` empty throughout and
ignored) is written at the top of `mixed_fleet.py`, the replay and its queueing (the churn
replay's: wait, retry oldest first at departures, refuse at `MAX_WAIT` = 300 s) and the repack
references at the top of `mixed_replay.py`.

Load, as `churn_trace.py` sets it: arrival times divided by a compression factor (lifetimes
kept) and the fleet one node in `FLEET_EVERY` of each (CPU, memory, GPU count) shape. `LOADS`
are a moderate load (few requests wait) and a heavy one (many are refused). The arrival-only
replay, as FGD's paper runs it, fills the same fleet with the trace's tasks in order and never
frees anything; it is reported when the arrived GPU demand reaches the fleet's GPU count
(`at_capacity`), at the first refused GPU request, and after every task has arrived.

Policies (each a chooser over the nodes that fit; ties at random, `SEEDS` seeds, means):

- `first-fit`: the first node by name (the list puts the CPU-only nodes first);
- `best-fit`: the least leftover: the node's free GPU share after placing, then its free CPU,
  then its memory (so CPU tasks fill CPU-only nodes first);
- `spread`: kube-scheduler's LeastAllocated with the GPU share as a third resource: the most
  free, as the mean of the free fractions of CPU, memory and (on a GPU node) GPU share;
- `fgd (tmi)`: the product's score: the core's `score_nodes`, which the extender's prioritize
  calls, with the core's decayed histogram of the GPU requests seen so far, the highest score
  chosen (kube-scheduler's choice among the extender's scores); the replay's nodes and tasks
  reach it through `mixed_tmi.py`'s adapter, which says how each is mapped;
- `best-fit (tmi)`: the same score with no histogram, the extender's best fit;
- `fgd (paper)`: FGD's rule as its paper states it, the benchmark's own: the candidate whose
  expected fragmented GPU share of the whole node (`mixed_fleet.Fragmentation`, over task types
  of CPU, memory and GPU together) rises least, unquantised, against a decayed histogram of the
  GPU task types seen so far (half-life 500 tasks, re-read every 50); `fgd (paper), whole
  trace's mix` is the diagnostic fed the distribution the stranded measure is taken against;
- `repack oracle` and `repack oracle, generous`: `mixed_replay.py`'s references: best fit plus
  a repair that moves up to 3 running tasks to admit a request (achievable, not a bound), and an
  aggregate test that admits whenever no layout is ruled out (an upper reference per step, with
  no layout and so no stranded figure; not a bound over the whole run, since admitting greedily
  is not monotone).

Figures, per class and in total: admitted (count share, and GPU-weighted: a whole-GPU task its
devices, a share its milli / 1000), stranded GPUs (FGD's fragmentation of the layout,
time-averaged over the arrival period: per class against that class's GPU task types, in total
against all of them), unallocated GPUs, and waits (mean, p50, p99 of the admitted).

Replicas. The trace names no deployments; a task is a replica of the deployment of the previous
task of identical (cpu_milli, memory_mib, num_gpu, gpu_milli) if it arrives at most
`REPLICA_WINDOW` seconds of trace time after it (a run of identical tasks is one deployment).
The replica variants are the extender's whole prioritize: `best-fit (tmi)` and `fgd (tmi)` with
`inference_policy.placing.spread.spread_replicas(scores, replicas_per_candidate)` applied last,
highest score chosen, ties at random. Reported: the share of deployments with two or more admitted
replicas of which some replica was placed on a node (or a device) holding another running one.

Run: `.venv/bin/python bench/research/bench_mixed.py` (two to four minutes on 2 cores). Writes
bench/results/mixed.json.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "research"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from bench_churn import _mean_runs  # noqa: E402
from mixed_fleet import (  # noqa: E402
    DecayedMix,
    Fragmentation,
    Node,
    Task,
    distribution,
    group_replicas,
    hold,
    load_nodes,
    load_tasks,
    sample_nodes,
)
from mixed_replay import MAX_WAIT, Candidate, Chooser, best_fit_key, replay  # noqa: E402
from mixed_tmi import Scorer, observe  # noqa: E402

from inference_policy.placing.fragmentation import RequestMix  # noqa: E402
from inference_policy.placing.spread import spread_replicas  # noqa: E402

# (label, arrival-time compression, one node in how many of each shape)
LOADS = (("moderate", 50, 16), ("heavy", 100, 16))
ARRIVAL_ONLY_EVERY = 16
SEEDS = 3
REPLICA_WINDOW = 60.0
ORACLE = "repack oracle"
GENEROUS = "repack oracle, generous"
FGD = "fgd (tmi)"
PAPER = "fgd (paper)"


def _pick(rng: random.Random, keys: Sequence[Any], lowest: bool = True) -> int:
    top = min(keys) if lowest else max(keys)
    best = [i for i, k in enumerate(keys) if k == top]
    return best[rng.randrange(len(best))] if len(best) > 1 else best[0]


def first_fit(task: Task, nodes: list[Node], fit: list[Candidate], replicas: list[int]) -> int:
    return 0


def best_fit(rng: random.Random) -> Chooser:
    def choose(task: Task, nodes: list[Node], fit: list[Candidate], replicas: list[int]) -> int:
        return _pick(rng, [best_fit_key(task, nodes[i], d) for i, d in fit])

    return choose


def free_fraction(task: Task, node: Node, devices: tuple[int, ...]) -> float:
    """LeastAllocated's view after placing: the mean free fraction of the node's resources."""
    parts = [(node.free_cpu - task.cpu) / node.cpu, (node.free_mem - task.mem) / node.mem]
    if node.free_gpu:
        left = sum(node.free_gpu) - task.milli * len(devices)
        parts.append(left / (1000 * len(node.free_gpu)))
    return sum(parts) / len(parts)


def spread(rng: random.Random) -> Chooser:
    def choose(task: Task, nodes: list[Node], fit: list[Candidate], replicas: list[int]) -> int:
        return _pick(rng, [round(free_fraction(task, nodes[i], d), 9) for i, d in fit], False)

    return choose


def rises(
    task: Task, nodes: list[Node], fit: list[Candidate], measure: Fragmentation
) -> list[float]:
    """FGD's rise in expected fragmentation at each candidate."""
    out = []
    for i, devices in fit:
        node = nodes[i]
        before = measure.of(node)
        hold(node, task, devices, 1)
        out.append(round(measure.of(node) - before, 6))
        hold(node, task, devices, -1)
    return out


def fgd_paper(rng: random.Random, measure: Callable[[], Fragmentation]) -> Chooser:
    def choose(task: Task, nodes: list[Node], fit: list[Candidate], replicas: list[int]) -> int:
        return _pick(rng, rises(task, nodes, fit, measure()))

    return choose


def tmi(rng: random.Random, scorer: Scorer, mix: RequestMix | None, apart: bool) -> Chooser:
    """kube-scheduler's choice among the extender's scores (the core's `score_nodes`, then
    `spread_replicas` when `apart`, as prioritize does): the highest, ties at random."""

    def choose(task: Task, nodes: list[Node], fit: list[Candidate], replicas: list[int]) -> int:
        values = scorer.scores(task, nodes, fit, mix.workload() if mix is not None else None)
        if apart:
            values = spread_replicas(values, replicas)
        return _pick(rng, values, False)

    return choose


# -- the policies compared -------------------------------------------------------------------------

Policy = tuple[str, Chooser, Callable[[Task], None] | None]


def policies(seed: int, trace: Fragmentation, apart: bool) -> list[Policy]:
    """(label, chooser, what each arrival is fed to). `apart`: add the replica variants."""
    paper = DecayedMix()
    mixes = [RequestMix(), RequestMix()]
    scorer = Scorer()

    def fed(mix: RequestMix) -> Callable[[Task], None]:
        return lambda task: observe(mix, task)

    out: list[Policy] = [
        ("first-fit", first_fit, None),
        ("best-fit", best_fit(random.Random(seed)), None),
        ("spread", spread(random.Random(seed)), None),
        (FGD, tmi(random.Random(seed), scorer, mixes[0], False), fed(mixes[0])),
        ("best-fit (tmi)", tmi(random.Random(seed), scorer, None, False), None),
        (
            PAPER,
            fgd_paper(random.Random(seed), lambda: paper.measure),
            lambda task: paper.observe(task.kind),
        ),
        (PAPER + ", whole trace's mix", fgd_paper(random.Random(seed), lambda: trace), None),
    ]
    if apart:
        out += [
            (
                "best-fit (tmi) + spread_replicas",
                tmi(random.Random(seed), scorer, None, True),
                None,
            ),
            (
                FGD + " + spread_replicas",
                tmi(random.Random(seed), scorer, mixes[1], True),
                fed(mixes[1]),
            ),
        ]
    return out


# -- driver ----------------------------------------------------------------------------------------


def _gap(block: dict[str, Any], key: str, policy: str) -> dict[str, Any]:
    """How much of the distance from first fit to the proven oracle `policy` covers, on `key`."""
    first = block["first-fit"]["total"][key]
    ours = block[policy]["total"][key]
    best = block[ORACLE]["total"][key]
    gap = best - first
    return {
        "first_fit": first,
        policy: ours,
        "oracle": best,
        "share_of_gap_closed": round((ours - first) / gap, 3) if abs(gap) > 1e-9 else None,
    }


def run_load(
    tasks: list[Task], nodes: list[Node], churn: bool, apart: bool
) -> dict[str, dict[str, Any]]:
    trace = Fragmentation(distribution(t.kind for t in tasks))
    out: dict[str, dict[str, Any]] = {}
    for label, _, _ in policies(0, trace, apart):
        started = time.perf_counter()
        runs = []
        for seed in range(1 if label == "first-fit" else SEEDS):
            _, chooser, feed = next(p for p in policies(seed, trace, apart) if p[0] == label)
            runs.append(replay(tasks, nodes, chooser, feed, churn=churn))
        out[label] = _mean_runs(runs)
        out[label]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"  {label}: {json.dumps(out[label]['total'])}", file=sys.stderr)
    for label, kind in ((ORACLE, "proven"), (GENEROUS, "generous")):
        started = time.perf_counter()
        out[label] = replay(tasks, nodes, None, None, oracle=kind, churn=churn)
        out[label]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"  {label}: {json.dumps(out[label]['total'])}", file=sys.stderr)
    return out


def offered(tasks: Sequence[Task], nodes: Sequence[Node]) -> dict[str, float]:
    start, end = min(t.arrive for t in tasks), max(t.arrive for t in tasks)

    def busy(weight: Callable[[Task], float]) -> float:
        total = sum(weight(t) * max(0.0, min(t.arrive + t.lifetime, end) - t.arrive) for t in tasks)
        return round(total / (end - start), 1)

    return {
        "gpus": sum(len(n.free_gpu) for n in nodes),
        "offered_gpus_time_avg": busy(lambda t: t.gpus),
        "cores": sum(n.cpu for n in nodes) // 1000,
        "offered_cores_time_avg": busy(lambda t: t.cpu / 1000),
    }


def main() -> None:
    started = time.perf_counter()
    full = load_nodes()
    results: dict[str, Any] = {
        "kind": "research",
        "trace": "alibaba cluster-trace-gpu-v2023: openb_node_list_all_node.csv, "
        "openb_pod_list_default.csv (bench/data)",
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs",
        "max_wait_s": MAX_WAIT,
        "seeds": SEEDS,
        "replica_window_s": REPLICA_WINDOW,
        "units": "GPUs (1000 milli); stranded: FGD's expected fragmented GPU share",
        "loads": {},
    }
    for label, compression, every in (*LOADS, ("arrival-only", 1, ARRIVAL_ONLY_EVERY)):
        churn = label != "arrival-only"
        nodes = sample_nodes(full, every)
        tasks = load_tasks(compression)
        deployments = group_replicas(tasks, REPLICA_WINDOW / compression)  # in trace time
        print(f"{label}: {len(nodes)} nodes", file=sys.stderr)
        block: dict[str, Any] = {
            "compression": compression,
            "fleet_one_node_in": every,
            "nodes": len(nodes),
            "cpu_only_nodes": sum(1 for n in nodes if not n.free_gpu),
            "offered": offered(tasks, nodes) if churn else None,
            "multi_replica_deployments_in_trace": deployments,
        }
        block["policies"] = run_load(tasks, nodes, churn, apart=True)
        key = "admitted_gpu_share"
        block["gap_closed"] = {
            policy: {k: _gap(block["policies"], k, policy) for k in (key, "admitted_share")}
            for policy in (FGD, PAPER)
        }
        results["loads"][label] = block
    arrival = results["loads"]["arrival-only"]["policies"]
    # Arrivals only: the GPU-weighted share admitted when the arrived demand reaches capacity.
    filled = {p: v["arrival_only"]["at_capacity"][key] for p, v in arrival.items()}
    verdict: dict[str, Any] = {"arrival_only_admitted_gpu_share_at_capacity": filled}
    for policy in (FGD, PAPER):
        closed = [results["loads"][label]["gap_closed"][policy][key] for label, *_ in LOADS]
        verdict[policy] = {
            "share_of_gap_closed_on_churn": [g["share_of_gap_closed"] for g in closed],
            "closes_half_the_gap_on_churn": all(
                (g["share_of_gap_closed"] or 0) >= 0.5 for g in closed
            ),
            "no_loss_on_arrival_only": filled[policy]
            >= max(filled["first-fit"], filled["best-fit"], filled["best-fit (tmi)"]),
        }
    results["verdict"] = verdict
    results["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(results, indent=2)
    out = ROOT / "bench" / "results" / "mixed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    print(json.dumps(results["verdict"]), f"{results['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
