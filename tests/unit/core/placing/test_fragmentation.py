"""The fragmentation measure, its decayed histogram, and the scores built on them: hand-computed
small cases, and the CPU score that keeps CPU engines off accelerator nodes."""

from __future__ import annotations

import pytest

from inference_policy.placing.fragmentation import (
    RequestMix,
    Workload,
    expected_fragment,
    fragment_delta,
    tail,
)
from inference_policy.placing.nodes import NodeFacts, node_facts
from inference_policy.placing.placement import demand_for, has_accelerator, score_nodes
from inference_policy.planning.plan import parse_plan
from kits.fleetkit import l40s
from localcluster.nodes.kwok import FakeNode
from tests.unit.core.placing.test_placement import GI, cpu_plan, plan, vram, whole

GPU = "nvidia.com/gpu"
VRAM = "kamiwaza.ai/vram-gb-gpu-0"
ONLY_PAIRS = ((2, 1.0),)
# A whole-GPU workload: 70% one GPU, 10% each two, four and eight.
MIXED = ((1, 0.7), (2, 0.1), (4, 0.1), (8, 0.1))


def test_one_free_gpu_is_stranded_under_a_workload_of_only_two_gpu_requests() -> None:
    assert expected_fragment(1, ONLY_PAIRS) == 1.0
    assert expected_fragment(2, ONLY_PAIRS) == 0.0
    assert expected_fragment(3, ONLY_PAIRS) == 0.0
    assert expected_fragment(0, ONLY_PAIRS) == 0.0
    # Taking one GPU of three strands nothing (two remain for a pair); of two strands one.
    assert fragment_delta(3, 1, ONLY_PAIRS) == 0.0
    assert fragment_delta(2, 1, ONLY_PAIRS) == 1.0
    # Filling the stranded GPU removes the fragment.
    assert fragment_delta(1, 1, ONLY_PAIRS) == -1.0


def test_expected_fragment_weighs_each_size_by_its_share() -> None:
    assert tail(MIXED, 3) == pytest.approx(0.2)
    assert expected_fragment(3, MIXED) == pytest.approx(0.6)  # 3 GPUs x P(size > 3)
    assert expected_fragment(7, MIXED) == pytest.approx(0.7)
    assert expected_fragment(8, MIXED) == 0.0
    # Breaking a free block of four costs more than taking one GPU of three.
    assert fragment_delta(4, 1, MIXED) == pytest.approx(0.2)
    assert fragment_delta(3, 1, MIXED) == pytest.approx(-0.2)


def test_request_mix_decays_old_requests_and_normalises_per_resource() -> None:
    mix = RequestMix(half_life=1)
    mix.observe(GPU, 8)
    mix.observe(GPU, 1)
    sizes = mix.workload().of(GPU)
    assert sizes is not None
    # The newer request weighs twice the older one.
    assert [q for q, _ in sizes] == [1, 8]
    assert [p for _, p in sizes] == pytest.approx([2 / 3, 1 / 3])
    mix.observe(VRAM, 12)
    assert mix.workload().of(VRAM) == ((12, 1.0),)
    assert mix.workload().of("nvidia.com/mig-1g.10gb") is None
    mix.observe(GPU, 0)
    assert mix.seen == 3


def test_request_mix_rescales_without_losing_the_distribution() -> None:
    mix = RequestMix(half_life=1)
    for _ in range(400):  # 2**400 would overflow the weights without rescaling
        mix.observe(GPU, 2)
    mix.observe(GPU, 1)
    sizes = mix.workload().of(GPU)
    assert sizes is not None
    # The newest request weighs as much as all the older ones together (a geometric series).
    assert dict(sizes)[1] == pytest.approx(0.5, rel=1e-6)
    assert sum(p for _, p in sizes) == pytest.approx(1.0)


def _facts(spec: FakeNode) -> NodeFacts:
    return node_facts(spec.manifest())


def test_fragmentation_score_keeps_a_pair_free_where_best_fit_would_strand_a_gpu() -> None:
    """Three free GPUs on one node, two on the other, a 1-GPU Pod, and a workload of pairs:
    best fit takes the node with two (leaving one, stranded); FGD takes the node with three
    (leaving a pair)."""
    binding = whole()
    demand = demand_for(parse_plan(plan(binding)), binding)
    nodes: list[NodeFacts | None] = [
        _facts(FakeNode("three-free", gpus=4)),
        _facts(FakeNode("two-free", gpus=4)),
    ]
    used = {"three-free": {GPU: 1}, "two-free": {GPU: 2}}
    best_fit = score_nodes(demand, nodes, used.__getitem__)
    assert best_fit[1] > best_fit[0]
    fgd = score_nodes(demand, nodes, used.__getitem__, Workload({GPU: ONLY_PAIRS}))
    assert fgd == [10, 1]


def test_fragmentation_score_falls_back_to_best_fit_when_every_node_changes_alike() -> None:
    binding = whole()
    demand = demand_for(parse_plan(plan(binding)), binding)
    nodes: list[NodeFacts | None] = [
        _facts(FakeNode("a", gpus=8)),
        _facts(FakeNode("b", gpus=8)),
        None,
    ]
    used = {"a": {GPU: 1}, "b": {GPU: 4}}
    # Under a workload of 8-GPU requests neither partly used node can serve one before or
    # after, and both lose one stranded GPU: the same delta, so best fit decides.
    workload = Workload({GPU: ((8, 1.0),)})
    assert score_nodes(demand, nodes, used.__getitem__, workload) == score_nodes(
        demand, nodes, used.__getitem__
    )
    # A workload that does not know the resource is best fit too.
    assert score_nodes(demand, nodes, used.__getitem__, Workload({})) == score_nodes(
        demand, nodes, used.__getitem__
    )


def test_fragmentation_score_ranks_worse_nodes_below_the_best_and_refuses_full_ones() -> None:
    binding = vram()
    demand = demand_for(parse_plan(plan(binding, 12)), binding)
    specs = [l40s(f"l40s-{i}") for i in range(4)]
    nodes: list[NodeFacts | None] = [_facts(s) for s in specs]
    # Free: 48, 24, 12 (exactly fits), 6 (does not fit).
    used = {"l40s-0": {}, "l40s-1": {VRAM: 24}, "l40s-2": {VRAM: 36}, "l40s-3": {VRAM: 42}}
    workload = Workload({VRAM: ((12, 0.5), (24, 0.5))})
    scores = score_nodes(demand, nodes, used.__getitem__, workload)
    # Exactly filling removes 12 GB stranded for the 24 GB requests: the best move.
    assert scores[2] == 10
    assert scores[3] == 0
    # 48 -> 36 strands nothing (delta 0); 24 -> 12 strands 12 GB for half the requests (+6).
    assert 1 <= scores[1] < scores[0] < 10


def test_cpu_pod_scores_accelerator_nodes_at_the_bottom_and_cpu_nodes_by_best_fit() -> None:
    demand = demand_for(parse_plan(cpu_plan("4", "16Gi")), None)
    gpu_node = _facts(FakeNode("gpu", gpus=1))
    roomy = _facts(FakeNode("cpu-roomy", gpus=0, vram_gb=None, cpu="64", memory="256Gi"))
    snug = _facts(FakeNode("cpu-snug", gpus=0, vram_gb=None, cpu="8", memory="32Gi"))
    full = _facts(FakeNode("cpu-full", gpus=0, vram_gb=None, cpu="4", memory="16Gi"))
    assert has_accelerator(gpu_node) and not has_accelerator(roomy)
    used = {"gpu": {}, "cpu-roomy": {}, "cpu-snug": {}, "cpu-full": {"cpu": 1000}}
    nodes: list[NodeFacts | None] = [gpu_node, roomy, snug, full, None]
    scores = score_nodes(demand, nodes, used.__getitem__)
    assert scores[0] == 0  # a GPU node, though it has room
    assert scores[2] > scores[1] >= 1  # best fit among CPU nodes, above every GPU node
    assert scores[3] == 0 and scores[4] == 0  # does not fit; unknown
    # With no CPU node that fits, the GPU node is still a candidate: the filter keeps it.
    only_gpu = score_nodes(demand, [gpu_node, full], used.__getitem__)
    assert only_gpu == [0, 0]


def test_a_node_advertising_zero_accelerators_counts_as_a_cpu_node() -> None:
    facts = _facts(FakeNode("cpu", gpus=0, vram_gb=None, extra_resources={GPU: "0"}))
    assert not has_accelerator(facts)
    demand = demand_for(parse_plan(cpu_plan("1", "1Gi")), None)
    assert score_nodes(demand, [facts], lambda _: {})[0] >= 1
    assert GI > 0
