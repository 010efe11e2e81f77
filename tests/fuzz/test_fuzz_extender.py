"""Fuzzing `POST /filter` and `POST /prioritize`: ExtenderArgs in both wire forms (NodeNames for
node-cache mode, Nodes for full-node mode), Pods with real, bent and forged plans, a ledger of
bound Pods that changes with every input, against the real extender app.

Oracles: the status is 200 for a structurally valid ExtenderArgs and 400 otherwise, never a
5xx; no node passes a filter unless the pure placement check (`placement.check`, on the
Pod's plan joined with the verified profile's binding, the node's facts and the node's bound
requests, all computed here) says the Pod fits there; a Pod whose plan cannot be read or joined
passes nowhere; passed nodes are input nodes, every input node is accounted for once; a
prioritize answer scores each input node, in order, within 0..10.

A forgery here is a Pod whose plan or requests are not what the planner made (a bent plan,
requests raised past the grant); each is counted, and a node passed that the check refuses
is a forged placement and fails the target.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_policy.ledger import UsageLedger, accounted_pod, pod_key
from inference_policy.nodes import node_facts
from inference_policy.placement import check, demand_for
from inference_policy.plan import PlanError, parse_plan
from inference_policy.signing import verify_configmap
from inference_policy.wire import PLAN_ANNOTATION
from tests.fleetkit import FLEET
from tests.fuzz import corpus
from tests.fuzz.fuzzkit import (
    AppDriver,
    Failure,
    Stats,
    chance,
    fuzz_settings,
    garbled,
    json_values,
    mutated,
    recorded,
)
from tests.integration.extenderkit import bound, extender_app, planned_pod, published
from tests.integration.memory_sources import ExtenderMemorySource as MemorySource
from tests.profilekit import NAMESPACE, NOW

MANIFESTS = [node.manifest() for node in FLEET]
NAMES = [node.name for node in FLEET]
CONFIGMAP = published(corpus.OWNER.sign(corpus.ENVELOPE))
PROFILE = verify_configmap(CONFIGMAP, corpus.OWNER.policy(), NOW)
PLANS = [plan.wire() for plan in corpus.plans() if plan.local]


@st.composite
def engine_pods(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A Pod as the scheduler sends it, and whether it was bent after planning."""
    plan = draw(st.sampled_from(PLANS))
    pod = planned_pod(plan)
    bent = False
    how = draw(st.sampled_from(["as-planned"] * 5 + ["plan", "requests", "text", "none"]))
    annotations = pod["metadata"]["annotations"]
    if how == "plan":
        annotations[PLAN_ANNOTATION] = json.dumps(draw(mutated(plan, 2)))
        bent = True
    elif how == "requests":
        resources = pod["spec"]["containers"][0]["resources"]
        resources["requests"] = {
            **resources.get("requests", {}),
            **draw(
                st.dictionaries(
                    st.sampled_from(list(plan["resources"]["requests"])),
                    st.sampled_from(["0", "2", "8", "1"]),
                    min_size=1,
                )
            ),
        }
        bent = True
    elif how == "text":
        annotations[PLAN_ANNOTATION] = draw(json_values | st.text(max_size=20))
        bent = True
    elif how == "none":
        del annotations[PLAN_ANNOTATION]
    return pod, bent


@st.composite
def ledgers(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Planned Pods bound to nodes: what the informer would have accounted."""
    placed = draw(st.lists(st.tuples(st.sampled_from(PLANS), st.sampled_from(NAMES)), max_size=10))
    return [
        bound(planned_pod(plan, name=f"bound-{i}"), node) for i, (plan, node) in enumerate(placed)
    ]


@st.composite
def extender_args(draw: st.DrawFn) -> tuple[bytes, dict[str, Any], bool]:
    pod, bent = draw(engine_pods())
    cache_mode = draw(st.booleans())
    if cache_mode:
        names = draw(st.lists(st.sampled_from([*NAMES, "unknown-node"]), max_size=len(NAMES) + 1))
        args: Any = {"Pod": pod, "Nodes": None, "NodeNames": names}
    else:
        items = [
            json.loads(json.dumps(m))
            for m in draw(st.lists(st.sampled_from(MANIFESTS), max_size=len(NAMES), unique_by=id))
        ]
        if items and chance(draw, 20):
            # A Node whose labels or allocatable were changed on the way (full-node mode
            # carries the scheduler's copy, not the informer's).
            index = draw(st.integers(0, len(items) - 1))
            items[index] = draw(mutated(items[index], 2))
        args = {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    shape = draw(st.sampled_from(["plain"] * 16 + ["mutated", "mutated", "garbled", "list"]))
    if shape == "mutated":
        args = draw(mutated(args, 2))
    if shape == "list":
        args = [args]
    body = json.dumps(args, separators=(",", ":")).encode()
    if shape == "garbled":
        body = draw(garbled(body))
    return body, args, bent


# -- the oracle ---------------------------------------------------------------------------------


def _valid(body: bytes) -> dict[str, Any] | None:
    """The ExtenderArgs when `body` is one the extender must answer (else None), decided here
    from the wire types (`k8s.io/kube-scheduler/extender/v1`), not from the extender's code."""
    try:
        args = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(args, dict) or not isinstance(args.get("Pod"), dict):
        return None
    names = args.get("NodeNames")
    if names is not None:
        ok = isinstance(names, list) and all(isinstance(n, str) for n in names)
        return args if ok else None
    nodes = args.get("Nodes")
    if nodes is None:
        return None
    items = nodes.get("items") if isinstance(nodes, dict) else None
    if items is None:
        return args
    if not isinstance(items, list):
        return None
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            return None
    return args


def _candidates(args: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Each input node's name and the Node object the check reads (None: not known)."""
    if args.get("NodeNames") is not None:
        known = {m["metadata"]["name"]: m for m in MANIFESTS}
        return [(name, known.get(name)) for name in args["NodeNames"]]
    nodes = args.get("Nodes")
    # A Nodes that is no object carries no Node: the extender may refuse it or pass nothing.
    items = (nodes.get("items") if isinstance(nodes, dict) else None) or []
    return [(item["metadata"]["name"], item) for item in items]


def _may_pass(pod: Mapping[str, Any], node: Any, ledger: UsageLedger) -> str | None:
    """None when the Pod may be placed on the node; else why not."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    text = annotations.get(PLAN_ANNOTATION) if isinstance(annotations, Mapping) else None
    if text is None:
        return None  # not a planned Pod: not the extender's to hold back
    if not isinstance(text, str):
        return "the plan is not a string"
    if node is None:
        return "the node is not known"
    try:
        plan = parse_plan(text)
        if plan.path == "external":
            return None
        found = PROFILE.envelope.binding(plan.bindingId or "") if plan.path == "gpu" else None
        binding = found[1] if found else None
        demand = demand_for(plan, binding, pod, PROFILE.sha256)
    except PlanError as exc:
        return f"the plan cannot be placed: {exc}"
    facts = node_facts(node)
    verdict = check(demand, facts, ledger.used(facts.name))
    return None if verdict.fits else f"{verdict.code}: {verdict.reason}"


def check_filter(driver: AppDriver, body: bytes, ledger: UsageLedger, stats: Stats) -> None:
    args = _valid(body)
    answer = driver.answer("/filter", body, args is not None, "ExtenderArgs to filter")
    if args is None:
        stats.saw("http-400")
        return
    if set(answer) != {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}:
        raise Failure(f"not an ExtenderFilterResult: {answer}")
    candidates = _candidates(args)
    if args.get("NodeNames") is not None:
        passed = answer["NodeNames"] or []
        if answer["Nodes"] is not None:
            raise Failure("a node-cache answer carries Nodes")
    else:
        items = (answer["Nodes"] or {}).get("items") or []
        inputs = (args["Nodes"].get("items") or []) if isinstance(args["Nodes"], dict) else []
        if any(item not in inputs for item in items):
            raise Failure("a full-node answer carries a Node that was not sent")
        passed = [item["metadata"]["name"] for item in items]
    if answer["Error"]:
        if passed:
            raise Failure(f"an answer with Error passes nodes: {answer}")
        stats.saw("error")
        return
    by_name = dict(candidates)
    failed = set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"])
    if set(passed) - set(by_name) or failed - set(by_name):
        raise Failure("the answer names nodes that were not sent")
    if set(by_name) - set(passed) - failed:
        raise Failure(f"nodes neither passed nor failed: {set(by_name) - set(passed) - failed}")
    pod = args["Pod"]
    for name in passed:
        why = _may_pass(pod, by_name[name], ledger)
        if why is not None:
            stats.forged_grants += 1
            raise Failure(f"node {name} passed though {why}")
    stats.saw("passed-some" if passed else "passed-none")


def check_prioritize(driver: AppDriver, body: bytes) -> None:
    args = _valid(body)
    scores = driver.answer("/prioritize", body, args is not None, "ExtenderArgs to prioritize")
    if args is None:
        return
    if not isinstance(scores, list):
        raise Failure(f"prioritize answered {scores}")
    names = [name for name, _ in _candidates(args)]
    if [entry["Host"] for entry in scores] != names:
        raise Failure("prioritize does not score each input node in order")
    if not all(isinstance(e["Score"], int) and 0 <= e["Score"] <= 10 for e in scores):
        raise Failure(f"a score outside 0..10: {scores}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[AppDriver, MemorySource]]:
    app, source = extender_app(corpus.OWNER, FLEET, envelope=corpus.ENVELOPE, configmap=CONFIGMAP)
    driver = AppDriver(app)
    yield driver, source
    driver.close()


def test_fuzz_extender_args(cluster: tuple[AppDriver, MemorySource]) -> None:
    driver, source = cluster
    with recorded(Stats("extender-args")) as stats:

        @fuzz_settings(200)
        @given(extender_args(), ledgers())
        def run(call: tuple[bytes, Any, bool], pods: list[dict[str, Any]]) -> None:
            body, _, bent = call
            for key in list(source.pods):
                source.delete_pod(key)
            ledger = UsageLedger()
            for pod in pods:
                source.put_pod(pod)
                accounted = accounted_pod(pod)
                if accounted is not None and pod["metadata"]["namespace"] == NAMESPACE:
                    ledger.upsert(pod_key(pod), *accounted)
            stats.forgeries_tried += bent
            check_filter(driver, body, ledger, stats)
            check_prioritize(driver, body)

        run()
    assert stats.forged_grants == 0
    assert stats.inputs > 0
