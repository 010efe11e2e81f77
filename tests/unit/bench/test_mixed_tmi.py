"""The mixed replay's `(tmi)` policies rank with the product's scorer (bench/research/mixed_tmi.py,
bench_mixed.tmi): on small fleets whose state is written out here in the core's own terms (the
Node objects the extender would be sent, what its ledger would count as used), the replay's choice
is the candidate the core's `score_nodes` ranks first. Each case is built so that FGD's choice is
neither first fit's nor best fit's, so an adapter that dropped the histogram, or scored the wrong
device, would choose otherwise."""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "research"
sys.path.insert(0, str(BENCH))

from bench_mixed import tmi  # noqa: E402
from mixed_fleet import Node, Task, hold  # noqa: E402
from mixed_replay import candidates  # noqa: E402
from mixed_tmi import MIB, WHOLE, Scorer, observe  # noqa: E402
from trace_fleet import VRAM, Demands, Item  # noqa: E402

from inference_policy.placing.fragmentation import RequestMix  # noqa: E402
from inference_policy.placing.nodes import NodeFacts, node_facts  # noqa: E402
from inference_policy.placing.placement import Demand, score_nodes  # noqa: E402
from localcluster.nodes.kwok import FakeNode  # noqa: E402

CPU, MEM = 64000, 256 * 1024  # a node's millicores and MiB


def _task(index: int, cls: str, count: int, milli: int, cpu: int = 1000, mem: int = 1024) -> Task:
    return Task(index, f"t{index}", cls, cpu, mem, count, milli, 0.0, 10.0)


def _gpu_node(name: str, gpus: int) -> NodeFacts:
    spec = FakeNode(
        name, gpus=gpus, cpu=f"{CPU}m", memory=f"{MEM}Mi", extra_resources={VRAM: "1000"}
    )
    return node_facts(spec.manifest())


def _mix(*tasks: Task) -> RequestMix:
    mix = RequestMix()
    for task in tasks:
        observe(mix, task)
    return mix


def _choice(task: Task, nodes: list[Node], mix: RequestMix | None) -> str:
    fit = candidates(task, nodes)
    pick = tmi(random.Random(0), Scorer(), mix, False)(task, nodes, fit, [0] * len(fit))
    return nodes[fit[pick][0]].name


def _core_first(
    demand: Demand,
    facts: Sequence[NodeFacts],
    used: Mapping[str, Mapping[str, int]],
    mix: RequestMix | None,
) -> str:
    scores = score_nodes(demand, facts, used.__getitem__, mix.workload() if mix else None)
    assert all(s > 0 for s in scores), "the core refuses a node the replay says fits"
    top = max(scores)
    (first,) = [f.name for f, s in zip(facts, scores, strict=True) if s == top]
    return first


def test_a_whole_gpu_pod_goes_where_the_core_ranks_first_a_shared_device_counted_as_taken() -> None:
    # n1: 8 GPUs, two taken whole and one holding a share (5 free); n2: 4 GPUs, 2 free; n3: 4
    # GPUs, one holding a share (3 free). Mostly 4-GPU requests: one GPU from n3 leaves 2, which
    # a 2-GPU request can use; from n2 it leaves 1 (best fit's choice), from n1 4 (first fit's).
    nodes = [Node.of("n1", CPU, MEM, 8), Node.of("n2", CPU, MEM, 4), Node.of("n3", CPU, MEM, 4)]
    hold(nodes[0], _task(90, "whole", 2, 1000), (0, 1), 1)
    hold(nodes[0], _task(91, "share", 1, 300), (2,), 1)
    hold(nodes[1], _task(92, "whole", 2, 1000), (0, 1), 1)
    hold(nodes[2], _task(93, "share", 1, 500), (0,), 1)
    seen = [_task(0, "whole", 1, 1000), _task(1, "whole", 2, 1000)]
    seen += [_task(2 + k, "whole", 4, 1000) for k in range(8)]
    mix = _mix(*seen)
    task = _task(20, "whole", 1, 1000)

    facts = [_gpu_node("n1", 8), _gpu_node("n2", 4), _gpu_node("n3", 4)]
    one = {"cpu": 1000, "memory": 1024 * MIB}
    used = {
        "n1": {"cpu": 2000, "memory": 2 * 1024 * MIB, WHOLE: 3},
        "n2": {**one, WHOLE: 2},
        "n3": {**one, WHOLE: 1},
    }
    demand = Demands().get(Item(20, "t20", "whole", WHOLE, 1))

    assert _core_first(demand, facts, used, mix) == "n3"
    assert _choice(task, nodes, mix) == "n3"
    # Without the histogram the same adapter is the extender's best fit.
    assert _core_first(demand, facts, used, None) == "n2"
    assert _choice(task, nodes, None) == "n2"


def test_a_share_is_scored_on_the_device_it_would_get_and_goes_where_the_core_ranks_first() -> None:
    # Shares of 250 and 500 milli. n1: two empty devices; n2: one device with 500 free (the one a
    # share gets there, the fullest it fits on) and one empty; n3: one device with 600 free. A
    # 250 share on n1 leaves 750, which both sizes can use; on n2 it leaves 250 (best fit's
    # choice), which half the requests cannot; on n3 350, which half cannot either.
    nodes = [Node.of("n1", CPU, MEM, 2), Node.of("n2", CPU, MEM, 2), Node.of("n3", CPU, MEM, 1)]
    hold(nodes[1], _task(90, "share", 1, 500), (0,), 1)
    hold(nodes[2], _task(91, "share", 1, 400), (0,), 1)
    mix = _mix(*(_task(k, "share", 1, 250 if k % 2 else 500) for k in range(10)))
    task = _task(20, "share", 1, 250)

    facts = [_gpu_node("n1", 2), _gpu_node("n2", 2), _gpu_node("n3", 1)]
    one = {"cpu": 1000, "memory": 1024 * MIB}
    used = {
        "n1": {"cpu": 0, "memory": 0, WHOLE: 0, VRAM: 0},
        "n2": {**one, WHOLE: 1, VRAM: 500},
        "n3": {**one, WHOLE: 1, VRAM: 400},
    }
    demand = Demands().get(Item(20, "t20", "vram", VRAM, 250))

    assert _core_first(demand, facts, used, mix) == "n1"
    assert _choice(task, nodes, mix) == "n1"
    assert _core_first(demand, facts, used, None) == "n2"
    assert _choice(task, nodes, None) == "n2"


def test_a_cpu_pod_goes_to_the_cpu_only_node_the_core_ranks_first() -> None:
    # The GPU node comes first by name and has the most room left after the Pod; the core puts
    # it at the bottom and packs the CPU-only nodes by best fit.
    nodes = [Node.of("a-gpu", CPU, MEM, 1), Node.of("c1", CPU, MEM, 0), Node.of("c2", CPU, MEM, 0)]
    hold(nodes[1], _task(90, "cpu", 0, 0, cpu=8000, mem=8 * 1024), (), 1)
    hold(nodes[2], _task(91, "cpu", 0, 0, cpu=48000, mem=128 * 1024), (), 1)
    task = _task(20, "cpu", 0, 0, cpu=4000, mem=4 * 1024)

    cpu_only = [
        node_facts(FakeNode(n, gpus=0, vram_gb=None, cpu=f"{CPU}m", memory=f"{MEM}Mi").manifest())
        for n in ("c1", "c2")
    ]
    facts = [_gpu_node("a-gpu", 1), *cpu_only]
    used = {
        "a-gpu": {"cpu": 0, "memory": 0, WHOLE: 0},
        "c1": {"cpu": 8000, "memory": 8 * 1024 * MIB},
        "c2": {"cpu": 48000, "memory": 128 * 1024 * MIB},
    }
    demand = Scorer().demand(task)
    assert dict(demand.requests) == {"cpu": 4000, "memory": 4 * 1024 * MIB}
    scores = score_nodes(demand, facts, used.__getitem__)
    assert scores[0] == 0 < scores[1] < scores[2]
    assert _choice(task, nodes, None) == "c2"


def test_replicas_are_spread_last_as_prioritize_does() -> None:
    # The same fleet as the share case: the core ranks n1 first, but n1 holds a replica of the
    # Pod's deployment, so the whole prioritize (score, then spread_replicas) prefers another.
    nodes = [Node.of("n1", CPU, MEM, 2), Node.of("n2", CPU, MEM, 2), Node.of("n3", CPU, MEM, 1)]
    hold(nodes[1], _task(90, "share", 1, 500), (0,), 1)
    hold(nodes[2], _task(91, "share", 1, 400), (0,), 1)
    mix = _mix(*(_task(k, "share", 1, 250 if k % 2 else 500) for k in range(10)))
    task = _task(20, "share", 1, 250)
    fit = candidates(task, nodes)
    replicas = [1 if nodes[i].name == "n1" else 0 for i, _ in fit]
    apart = tmi(random.Random(0), Scorer(), mix, True)(task, nodes, fit, replicas)
    assert nodes[fit[apart][0]].name != "n1"
    alone = tmi(random.Random(0), Scorer(), mix, False)(task, nodes, fit, replicas)
    assert nodes[fit[alone][0]].name == "n1"
