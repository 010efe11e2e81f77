"""Research, not a product benchmark (see bench/research/README.md).

Placement under churn: the Alibaba trace replayed with its departures, as a discrete-event
simulation, for first fit, best fit, spreading and the extender's fragmentation-aware score.

`bench_placement.py` fills the fleet with arrivals only; in a running cluster deployments also
stop, and the holes they leave are where packing policies differ. This replay keeps each task's
lifetime (`deletion_time - creation_time` of `openb_pod_list_default.csv`) and frees its
capacity when it ends. The fleet and the mapping of tasks onto whole GPUs, MIG slices and
accounted VRAM shares are `bench_placement.py`'s (`trace_fleet.py`), and so are the policies
(`placement_policies.py`).

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

The replay is split by job: `churn_trace.py` (tasks, the sampled fleet, the stranded measure),
`churn_floor.py` (the repack oracle and the floors, on `packing.py`'s bounds), `churn_replay.py`
(the discrete-event run) and `churn_steering.py` (CPU steering); this script compares the
policies and writes the results.

Run: `.venv/bin/python bench/research/bench_churn.py` (about a minute on 2 cores). Writes
bench/results/churn.json.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "research"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from churn_replay import MAX_WAIT, floors, offered_load, replay  # noqa: E402
from churn_steering import CPU_NODES, steering, steering_fleet  # noqa: E402
from churn_trace import COMPRESSION, build_tasks, sample_fleet, trace_workload  # noqa: E402
from placement_policies import Chooser, extender, first_fit, spread, unquantised  # noqa: E402
from trace_fleet import Demands, build_fleet  # noqa: E402

from inference_policy.placing.fragmentation import DEFAULT_HALF_LIFE, RequestMix, Workload  # noqa: E402

# (label, arrival-time compression, one node in how many): the same fleet under a moderate
# load, where few requests wait, and a heavy one, where many are refused at the deadline.
LOADS = (("moderate", 100, 8), ("heavy", 400, 8))
SEEDS = 3

ORACLE = "repack oracle"
ORACLE_GENEROUS = "repack oracle, generous"


# -- the policies compared -------------------------------------------------------------------------


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
        "kind": "research",
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
