"""Research, not a product benchmark (see bench/research/README.md).

The product's own score on the mixed fleet: the `(tmi)` policies of `bench_mixed.py` rank the
candidates with the core's `score_nodes`, the function the extender's prioritize calls, so their
figures are those of the scorer `tmi` ships rather than of a model of it. This module adapts the
replay's node state (`mixed_fleet.Node`: CPU, memory and devices in the trace's milli units) into
the core's inputs, the same way for every task:

- A node is the `NodeFacts` the extender would parse from its Node object, built once by name:
  `FakeNode`'s manifest (amd64, GPU Feature Discovery's labels) with the node's CPU, memory and
  GPU count, and on a GPU node one accounted VRAM bucket of `GPU_MILLI` units.
- A whole-GPU task of N devices is the device plugin's `nvidia.com/gpu` demand of N, planned and
  parsed as the planner writes it (`trace_fleet.Demands`); the node holds a GPU of it for every
  device with anything on it, since a device holding a share is not free to a whole-GPU Pod.
- A share of m milli is an accounted VRAM share of m units; its bucket on a candidate is the
  device the device layer gives the task there (`mixed_fleet.devices_for`: the fullest it fits
  on), since a VRAM binding names one bucket and the device plugin, not the extender, picks the
  device. Counting in milli, not GB, keeps the core's fit and the replay's the same.
- A CPU task is a CPU engine Pod's demand with the task's CPU and memory; the core scores every
  node with an accelerator 0 and CPU-only nodes by best fit over both.
- The candidates are the replay's fitting nodes only, as prioritize is given what the filter
  passed; the workload histogram is the core's `RequestMix`, fed each GPU task's resource and
  quantity on arrival (`observe`), once a Pod as the extender feeds it.

What the core does not see is what the product does not see: it scores a GPU Pod by one
resource, so what a share takes of its node's whole-GPU room, or any task of a GPU node's CPU and
memory, moves no score of the other kind; `fgd (paper)` in `bench_mixed.py` (the node-level rule
of FGD's paper over every task type, `mixed_fleet.Fragmentation`) is the comparison that sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from churn_steering import CPU_PLAN
from mixed_fleet import GPU_MILLI, Node, Task
from mixed_replay import Candidate
from trace_fleet import VRAM, Demands, Item

from inference_policy.placing.fragmentation import RequestMix, Workload
from inference_policy.placing.nodes import NodeFacts, node_facts
from inference_policy.placing.placement import Demand, demand_for, score_nodes
from inference_policy.planning.plan import parse_plan
from localcluster.nodes.kwok import FakeNode

WHOLE = "nvidia.com/gpu"
MIB = 1 << 20


def facts_of(node: Node) -> NodeFacts:
    """The Node object the extender would be sent for `node`, parsed as the extender parses it."""
    gpus = len(node.free_gpu)
    spec = FakeNode(
        node.name,
        gpus=gpus,
        vram_gb=80 if gpus else None,
        cpu=f"{node.cpu}m",
        memory=f"{node.mem}Mi",
        extra_resources={VRAM: str(GPU_MILLI)} if gpus else {},
    )
    return node_facts(spec.manifest())


def resource_of(task: Task) -> tuple[str, int] | None:
    """The resource and quantity a GPU task's demand is on (what the histogram is fed)."""
    if task.cls == "whole":
        return WHOLE, task.num_gpu
    if task.cls == "share":
        return VRAM, task.milli
    return None


def held_on(task: Task, node: Node, devices: tuple[int, ...]) -> dict[str, int]:
    """What the ledger would count as used on `node`, in the core's units, for `task`'s demand
    placed on `devices` there."""
    used = {"cpu": node.cpu - node.free_cpu, "memory": (node.mem - node.free_mem) * MIB}
    if node.free_gpu:
        used[WHOLE] = sum(1 for free in node.free_gpu if free < GPU_MILLI)
        if task.cls == "share":
            used[VRAM] = GPU_MILLI - node.free_gpu[devices[0]]
    return used


class Scorer:
    """The core's inputs for one fleet, kept across tasks: each node's facts (which memoise the
    core's identity verdicts) and one demand per task shape."""

    def __init__(self) -> None:
        self.demands = Demands()
        self.cpu = demand_for(parse_plan(CPU_PLAN), None)
        self.facts: dict[str, NodeFacts] = {}
        self.cpu_demands: dict[tuple[int, int], Demand] = {}

    def node(self, node: Node) -> NodeFacts:
        facts = self.facts.get(node.name)
        if facts is None:
            facts = self.facts[node.name] = facts_of(node)
        return facts

    def demand(self, task: Task) -> Demand:
        gpu = resource_of(task)
        if gpu is not None:
            resource, quantity = gpu
            return self.demands.get(Item(task.index, task.name, task.cls, resource, quantity))
        key = (task.cpu, task.mem)
        demand = self.cpu_demands.get(key)
        if demand is None:
            demand = replace(self.cpu, requests={"cpu": task.cpu, "memory": task.mem * MIB})
            self.cpu_demands[key] = demand
        return demand

    def scores(
        self, task: Task, nodes: Sequence[Node], fit: Sequence[Candidate], mix: Workload | None
    ) -> list[int]:
        """The extender's 0..10 score of each candidate, in `fit`'s order."""
        facts = [self.node(nodes[i]) for i, _ in fit]
        used: Mapping[str, dict[str, int]] = {
            f.name: held_on(task, nodes[i], devices)
            for f, (i, devices) in zip(facts, fit, strict=True)
        }
        return score_nodes(self.demand(task), facts, used.__getitem__, mix)


def observe(mix: RequestMix, task: Task) -> None:
    """Feed the histogram as the extender does: a GPU Pod's resource and quantity."""
    gpu = resource_of(task)
    if gpu is not None:
        mix.observe(*gpu)


__all__ = ["MIB", "WHOLE", "Scorer", "facts_of", "held_on", "observe", "resource_of"]
