"""The extender's two verbs, filter and prioritize, answered from the `ClusterView`.

Each takes the scheduler's ExtenderArgs and returns the body with the outcome its metrics and
logs count. The decisions are the core's (`inference_policy.placing.placement` for fit and best fit,
`inference_policy.placing.spread` for keeping one deployment's replicas apart); this module picks
the candidates, the remembered figures (node-cache mode) and the order they are applied in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from extender.args import Candidates, candidates, has_plan, pod_of
from extender.owner_rights import Unconfirmed
from extender.quota import QuotaBoard
from extender.view import ClusterView, FilterOutcome, Outcome, PriorityOutcome
from extender.wire import ExtenderArgs, ExtenderFilterResult, HostPriorityList
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.pod_view import ObjectView
from inference_policy.granting.pod_demand import Unplaceable
from inference_policy.placing.nodes import FITS, Verdict
from inference_policy.placing.placement import check_nodes, score_nodes, scores_from
from inference_policy.placing.spread import deployment_of, spread_replicas


def _unknown(name: str) -> Verdict:
    return Verdict(
        False,
        f"node {name} is not in the extender's node cache yet; it is retried when the cache "
        "catches up",
        False,
        NodeVerdictCode.UNKNOWN_NODE,
    )


def filter_nodes(
    view: ClusterView, args: ExtenderArgs, quota: QuotaBoard | None = None
) -> FilterOutcome:
    """The ExtenderFilterResult for one ExtenderArgs. Raises ArgsError for a malformed body.
    With `quota`, a Pod with a demand must fit its tenant's quota (`extender.quota`)."""
    pod = pod_of(args)
    cands = candidates(args, view.nodes)
    if has_plan(pod) and not view.ready:
        missing = ", ".join(sorted(view.pending))
        body = _filter_body(cands, [], {}, {})
        body["Error"] = f"the extender's caches have not synced yet ({missing}); retry shortly"
        return Outcome(body, "not-ready", nodes=len(cands.names))
    try:
        demand = view.demand(pod)
        if demand is not None and quota is not None:
            quota.check(pod)
    except Unconfirmed as exc:
        # Nothing to rely on about the controller's rights (or the quota): retried, as
        # unsynced caches are.
        body = _filter_body(cands, [], {}, {})
        body["Error"] = f"{exc.reason}; retry shortly"
        return Outcome(body, "not-ready", nodes=len(cands.names))
    except Unplaceable as exc:
        failed = dict.fromkeys(cands.names, exc.reason)
        count = len(cands.names)
        return Outcome(
            _filter_body(cands, [], {}, failed), exc.code, {exc.code: count}, nodes=count
        )
    if demand is None:
        passed = list(range(len(cands.names)))
        return Outcome(_filter_body(cands, passed, {}, {}), "unplanned", nodes=len(cands.names))
    passed_idx: list[int] = []
    failed_nodes: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    codes: dict[str, int] = {}
    node_codes: dict[str, str] = {}
    if cands.cache_mode:
        verdicts = view.verdicts(demand, cands.names, cands.facts)
    else:
        verdicts = check_nodes(demand, cands.facts, view.ledger.used, view.tenancy)
    names = cands.names
    keep = passed_idx.append
    for index, found in enumerate(verdicts):
        if found is FITS:
            keep(index)
            continue
        verdict = _unknown(names[index]) if found is None else found
        if verdict.fits:
            keep(index)
            continue
        target = unresolvable if verdict.unresolvable else failed_nodes
        target[names[index]] = verdict.reason or verdict.code
        node_codes[names[index]] = verdict.code
        codes[verdict.code] = codes.get(verdict.code, 0) + 1
    codes[NodeVerdictCode.FITS] = len(passed_idx)
    if passed_idx and quota is not None:
        quota.passed(pod)
    body = _filter_body(cands, passed_idx, failed_nodes, unresolvable)
    return Outcome(body, "planned", codes, node_codes, len(names))


def _filter_body(
    cands: Candidates,
    passed: list[int],
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> ExtenderFilterResult:
    if cands.cache_mode:
        return {
            "Nodes": None,
            "NodeNames": [cands.names[i] for i in passed],
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }
    # Full-node mode: the scheduler reads Nodes.items only, so the kept Node objects are echoed
    # back exactly as received; replying with names alone would reject every node.
    return {
        "Nodes": {"metadata": cands.list_meta, "items": [cands.items[i] for i in passed]},
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def prioritize_nodes(view: ClusterView, args: ExtenderArgs) -> PriorityOutcome:
    """The HostPriorityList for one ExtenderArgs. Raises ArgsError for a malformed body."""
    pod = pod_of(args)
    cands = candidates(args, view.nodes)
    if has_plan(pod) and not view.ready:
        return Outcome([{"Host": n, "Score": 0} for n in cands.names], "not-ready")
    try:
        demand = view.demand(pod)
    except Unconfirmed:
        return Outcome([{"Host": n, "Score": 0} for n in cands.names], "not-ready")
    except Unplaceable as exc:
        return Outcome([{"Host": n, "Score": 0} for n in cands.names], exc.code)
    if demand is None:
        return Outcome([{"Host": n, "Score": 0} for n in cands.names], "unplanned")
    view.observe(pod, demand)
    workload = view.mix.workload()
    if cands.cache_mode and demand.path == "gpu" and len(demand.kind) == 1:
        frees, scale = view.frees(demand, cands.names, cands.facts)
        scores = scores_from(demand, frees, scale, workload)
    else:
        scores = score_nodes(demand, cands.facts, view.ledger.used, workload)
    siblings = view.replicas.counts(deployment_of(pod))
    if siblings:
        scores = spread_replicas(scores, [siblings.get(name, 0) for name in cands.names])
    body: HostPriorityList = [
        {"Host": name, "Score": value} for name, value in zip(cands.names, scores, strict=True)
    ]
    return Outcome(body, "planned")


def unencodable(body: Any, exc: Exception) -> str:
    """Why an answer cannot be encoded, naming the node when one is the cause.

    Full-node mode echoes the Node objects it keeps, so whatever nesting a Node carries goes
    back out through orjson, which refuses more than 254 levels. Each kept Node is tried alone
    at the depth it has in the answer, which finds the one to name; this runs only after the
    whole answer has failed, so the common path never walks the Nodes.
    """
    nodes = body.get("Nodes") if isinstance(body, Mapping) else None
    if isinstance(nodes, Mapping):
        for item in nodes.get("items") or []:
            try:
                orjson.dumps({"Nodes": {"items": [item]}})
            except orjson.JSONEncodeError as item_exc:
                name = ObjectView(item).metadata.get("name")
                return (
                    f"node {name} in ExtenderArgs.Nodes.items cannot be sent back: {item_exc} "
                    "(a value nests too deeply); no node was filtered"
                )
        try:
            orjson.dumps({"Nodes": {"metadata": nodes.get("metadata")}})
        except orjson.JSONEncodeError as meta_exc:
            return (
                f"ExtenderArgs.Nodes.metadata cannot be sent back: {meta_exc} "
                "(a value nests too deeply); no node was filtered"
            )
    return f"the answer cannot be encoded: {exc}"


__all__ = ["filter_nodes", "prioritize_nodes", "unencodable"]
