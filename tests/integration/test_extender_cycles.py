"""The extender redoes per scheduling cycle only what changed, and answers exactly as if it had
redone everything.

Consecutive replicas of a deployment reach the extender with the same candidates and one node's
load changed (where the last replica went). `ClusterView.cycle` keeps the last cycle's verdicts
and free capacities per demand and candidate list and judges again only the nodes whose facts
or accounted load changed. These tests drive random sequences of binds, deletions and node
updates and compare every answer with the core's full computation on the same state.
"""

from __future__ import annotations

import random
from typing import Any

from pytest_aiohttp import AiohttpClient

from extender.sources import MemorySource
from extender.view import ClusterView
from inference_policy.placement import check_nodes, score_nodes
from localcluster.nodes import FakeNode
from tests.integration.extenderkit import (
    block,
    bound,
    cache_args,
    extender_app,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from tests.integration.test_extender import FLEET, post
from tests.profilekit import Owner

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
        candidates = names if step % 5 else rng.sample(names, len(names) - 1)
        passed, scores = _expected(view, pod, candidates)
        result = await post(client, "filter", cache_args(pod, candidates))
        assert result["NodeNames"] == passed, step
        assert await post(client, "prioritize", cache_args(pod, candidates)) == scores, step
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
    fleet = [FakeNode(f"h100-{i:02d}", gpus=8) for i in range(64)]
    app, source = extender_app(owner, nodes=fleet)
    client = await aiohttp_client(app)
    view = source.view
    assert isinstance(view, ClusterView)
    names = [n.name for n in fleet]
    counts = []
    for _ in range(20):
        pod = planned_pod(plan)
        before = view.recomputed
        result = await post(client, "filter", cache_args(pod, names))
        scores = await post(client, "prioritize", cache_args(pod, names))
        counts.append(view.recomputed - before)
        assert set(result["NodeNames"]) | set(result["FailedNodes"]) == set(names)
        best = max(scores, key=lambda s: s["Score"] if s["Host"] in result["NodeNames"] else -1)
        best = best["Host"]
        source.put_pod(bound(pod, best))
    # The first replica judges every candidate twice (verdicts, free capacity); each later one
    # only the node the previous replica was bound to (verdict and free capacity at once).
    assert counts[0] == 2 * len(names)
    assert counts[1:] == [1] * 19
