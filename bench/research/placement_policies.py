"""Research, not a product benchmark (see bench/research/README.md).

The online placement policies both placement benchmarks compare, as choosers.

A chooser gets a deployment's `Demand`, the class's nodes, the indexes of those where it fits
and what each node already holds, and returns the index of the node it is placed on. The
extender's policies run its own scoring (`score_nodes`), with ties broken at random as
kube-scheduler's selectHost does; the others are the references it is measured against: first
fit, kube-scheduler's default spreading, and unquantised versions of the extender's scores.
`bench_placement.py` replays arrivals only and `bench_churn.py` arrivals and departures, both
through these same functions, so their figures describe one set of policies.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from inference_policy.placing.fragmentation import RequestMix, Workload, fragment_delta
from inference_policy.placing.nodes import NodeFacts
from inference_policy.placing.placement import Demand, score_nodes

Chooser = Callable[[Demand, list[NodeFacts], list[int], Callable[[str], dict[str, int]]], int]


def leftover(demand: Demand, node: NodeFacts, used_of: Callable[[str], dict[str, int]]) -> int:
    """What the demand's first resource leaves free on `node` once the demand is placed."""
    name = demand.checked[0]
    return node.allocatable[name] - used_of(node.name).get(name, 0) - demand.requests[name]


def first_fit(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
    return fit[0]


def spread(rng: random.Random) -> Chooser:
    """The most free capacity left, as kube-scheduler's default LeastAllocated scoring does."""

    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        lefts = [leftover(demand, nodes[i], used_of) for i in fit]
        top = max(lefts)
        best = [fit[i] for i, v in enumerate(lefts) if v == top]
        return best[rng.randrange(len(best))]

    return choose


def exact_best_fit(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
    """The least leftover capacity, unquantised (what the 0..10 scale approximates)."""
    return min(fit, key=lambda i: (leftover(demand, nodes[i], used_of), i))


def extender(rng: random.Random, workload: Callable[[], Workload | None]) -> Chooser:
    """kube-scheduler's choice among the extender's scores: the highest, ties at random."""

    def choose(demand: Demand, nodes: list[NodeFacts], fit: list[int], used_of: Any) -> int:
        scores = score_nodes(demand, [nodes[i] for i in fit], used_of, workload())
        top = max(scores)
        best = [fit[i] for i, s in enumerate(scores) if s == top]
        return best[rng.randrange(len(best))] if len(best) > 1 else best[0]

    return choose


def tmi_best_fit(rng: random.Random) -> Chooser:
    """The extender's score with no workload distribution: best fit on its 0..10 scale."""
    return extender(rng, lambda: None)


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


__all__ = [
    "Chooser",
    "FgdChooser",
    "exact_best_fit",
    "extender",
    "first_fit",
    "leftover",
    "spread",
    "tmi_best_fit",
    "unquantised",
]
