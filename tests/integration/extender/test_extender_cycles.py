"""The extender redoes per scheduling cycle only what changed, and answers exactly as if it had
redone everything.

Consecutive replicas of a deployment reach the extender with the same nodes and one node's
load changed (where the last replica went). `ClusterView.cycle` keeps, per demand and node, the
verdicts and free capacities found, and judges again only the nodes whose facts or accounted
load changed. kube-scheduler sends the filter its feasible nodes in an order that moves from
cycle to cycle and prioritize only the nodes the filter kept, so the tests call it that way.
They drive random sequences of binds, deletions and node updates and compare every answer with
the core's full computation on the same state.
"""

from __future__ import annotations

import random
from typing import Any

from pytest_aiohttp import AiohttpClient

from extender.view import ClusterView
from inference_policy.placing.placement import check_nodes, score_nodes
from kits.extenderkit import (
    block,
    bound,
    cache_args,
    extender_app,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from kits.fleetkit import FLEET, h100
from kits.memory_sources import ExtenderMemorySource as MemorySource
from kits.profilekit import Owner
from tests.integration.extender.test_extender import post

KINDS = {"whole": "nvidia-whole", "mig": "nvidia-mig-3g40gb", "share": "nvidia-vram-share"}


def _expected(view: ClusterView, pod: dict[str, Any], names: list[str]) -> tuple[Any, Any]:
    demand = view.demand(pod)
    assert demand is not None
    facts = [view.nodes.get(n) for n in names]
    verdicts = check_nodes(demand, facts, view.ledger.used)
    passed = [n for n, v in zip(names, verdicts, strict=True) if v is not None and v.fits]
    scores = score_nodes(demand, facts, view.ledger.used, view.mix.workload())
    return passed, [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]


async def test_incremental_cycles_answer_as_full_ones(
    aiohttp_client: AiohttpClient,
) -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    plans = {
        kind: plan_for(owner, envelope, request(inferenceResources=block(profile)))
        for kind, profile in KINDS.items()
    }
    app, source = extender_app(owner, nodes=FLEET)
    client = await aiohttp_client(app)
    view = source.view
    assert isinstance(view, ClusterView) and isinstance(source, MemorySource)
    names = [n.name for n in FLEET]
    rng = random.Random(7)
    bound_pods: list[dict[str, Any]] = []
    for step in range(240):
        kind = rng.choice(list(plans))
        pod = planned_pod(plans[kind])
        candidates = rng.sample(names, len(names) - (1 if step % 5 == 0 else 0))
        passed, _ = _expected(view, pod, candidates)
        result = await post(client, "filter", cache_args(pod, candidates))
        assert result["NodeNames"] == passed, step
        # Prioritize is asked about the kept nodes (or, as a scheduler may, about them all).
        asked = passed if step % 3 else candidates
        _, scores = _expected(view, pod, asked)
        assert await post(client, "prioritize", cache_args(pod, asked)) == scores, step
        # The cluster moves on: the Pod is bound where the extender would send it, an earlier
        # one goes, or a node's object is replaced (a heartbeat, a label change).
        action = rng.random()
        if passed and action < 0.6:
            best = max(scores, key=lambda s: s["Score"] if s["Host"] in passed else -1)
            placed = bound(pod, best["Host"])
            source.put_pod(placed)
            bound_pods.append(placed)
        elif bound_pods and action < 0.8:
            gone = bound_pods.pop(rng.randrange(len(bound_pods)))
            meta = gone["metadata"]
            source.delete_pod(f"{meta['namespace']}/{meta['name']}")
        elif action < 0.85:
            # A node leaves (drained, deleted) and comes back at a later step's replacement.
            source.delete_node(rng.choice(FLEET).name)
        else:
            node = rng.choice(FLEET).manifest()
            node["metadata"]["resourceVersion"] = str(step)
            source.put_node(node)


async def test_a_replica_burst_redoes_only_the_node_that_changed(
    aiohttp_client: AiohttpClient,
) -> None:
    owner = Owner()
    envelope = fleet_envelope(owner)
    plan = plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole")))
    fleet = [h100(f"h100-{i:02d}") for i in range(64)]
    app, source = extender_app(owner, nodes=fleet)
    client = await aiohttp_client(app)
    view = source.view
    assert isinstance(view, ClusterView)
    names = [n.name for n in fleet]
    rng = random.Random(11)
    counts = []
    expected = []
    best = None
    for _ in range(20):
        pod = planned_pod(plan)
        before = view.recomputed
        # The scheduler's order moves from cycle to cycle.
        candidates = rng.sample(names, len(names))
        result = await post(client, "filter", cache_args(pod, candidates))
        kept = result["NodeNames"]
        scores = await post(client, "prioritize", cache_args(pod, kept))
        counts.append(view.recomputed - before)
        # After the first: the node the previous replica went to, judged again, and its free
        # capacity found again unless it is now full and so not asked about.
        expected.append(len(names) + len(kept) if best is None else 1 + (best in kept))
        assert set(kept) | set(result["FailedNodes"]) == set(names)
        best = max(scores, key=lambda s: s["Score"])["Host"]
        source.put_pod(bound(pod, best))
    # The first replica judges every candidate (its verdict) and every kept one (its free
    # capacity), all of them on an empty fleet.
    assert expected[0] == 2 * len(names)
    assert counts == expected
    assert 1 in counts and 2 in counts
