"""Fuzzing `POST /filter` and `POST /prioritize`: ExtenderArgs in both wire forms (NodeNames for
node-cache mode, Nodes for full-node mode), Pods with plans of every path (a GPU or CPU plan as
the webhook leaves it, an external plan, a bent or malformed plan, a plan made by hand, none)
combined with every kind of reach (an accelerator ask on the engine container, a sidecar, an
init container or the Pod, a claim, a RuntimeClass, device variables of every vendor, envFrom
prefixes, CDI annotations: `tests.fuzz.devicekit`), in the tenant namespace or another, and a
ledger of bound Pods that changes with every input, against the real extender app.

Oracles: the status is 200 for a structurally valid ExtenderArgs and 400 otherwise, never a
5xx; passed nodes are input nodes, every input node is accounted for once; a prioritize answer
scores each input node, in order, within 0..10; and no node passes a filter unless

* the Pod reaches for nothing (`access.reaches`, and the rule restated in `devicekit`, find
  nothing, and nothing was added to reach), or it is exactly a Pod the webhook leaves for a GPU
  plan the signed profile gives its request, untouched (a genuine plan: every other Pod that
  reaches is a forgery, whatever its plan says of itself);
* the Pod is in the tenant namespace, or carries no plan and reaches for nothing;
* the pure placement check (`placement.check`, on the Pod's plan joined with the verified
  profile's binding, the node's facts and the node's bound requests, all computed here) says
  the Pod fits there; a Pod whose plan cannot be read or joined passes nowhere.

Beside the app, the same Pods go to the core as the allocation controller would judge them once
bound (`grant.evaluate`): a forgery is never verified, and a genuine GPU Pod always is (so the
oracle's notion of genuine is the controller's). `device_gate` refuses a reaching Pod without a
GPU plan as `unplanned-device`, and a plan that is no string as `plan-invalid`.

A forgery here is a Pod that reaches for anything and is not a genuine GPU Pod, or whose plan or
requests are not what the planner made (a bent plan, requests raised past the grant); each is
counted, and a node passed for one is a forged placement and fails the target.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_policy.admission.device_gate import device_gate
from inference_policy.base.access import reaches
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.wire import PLAN_ANNOTATION
from inference_policy.granting.grant import evaluate
from inference_policy.placing.ledger import UsageLedger, accounted_pod, pod_key
from inference_policy.placing.nodes import node_facts
from inference_policy.placing.placement import check, demand_for
from inference_policy.planning.plan import PlanError, parse_plan
from inference_policy.trust.signing import verify_configmap
from kits.extenderkit import (
    PlanBody,
    bound,
    extender_app,
    planned_pod,
    published,
)
from kits.fleetkit import FLEET
from kits.memory_sources import ExtenderMemorySource as MemorySource
from kits.profilekit import NAMESPACE, NOW
from tests.fuzz import corpus
from tests.fuzz.devicekit import add_device_surfaces, device_findings
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

MANIFESTS = [node.manifest() for node in FLEET]
NAMES = [node.name for node in FLEET]
CONFIGMAP = published(corpus.OWNER.sign(corpus.ENVELOPE))
PROFILE = verify_configmap(CONFIGMAP, corpus.OWNER.policy(), NOW)
PLANS = [plan.wire() for plan in corpus.plans() if plan.local]
EXTERNAL = {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}


def _genuine(path: str) -> list[PlanBody]:
    """The webhook's plans of `path` for the seed requests, each remembering its request, so
    `planned_pod` writes the Pod exactly as the webhook leaves it."""
    found: dict[str, PlanBody] = {}
    for document in corpus.requests():
        plan = corpus.state().decide(document, NOW).plan
        if plan is not None and plan.path == path:
            body = PlanBody(plan.wire())
            body.request = copy.deepcopy(document)
            found.setdefault(plan.text(), body)
    return list(found.values())


GENUINE = {"gpu": _genuine("gpu"), "cpu": _genuine("cpu")}
# How a Pod's plan was come by: as the webhook leaves it (gpu, cpu), one that places nothing,
# a plan the webhook's own words bent, a plan made by hand as a replaced webhook would make it,
# or none.
PATHS = ["gpu"] * 4 + ["cpu"] * 2 + ["external", "external", "malformed", "hand", "hand", "none"]
# Every kind of reach the access rule knows, added after planning; "none" adds nothing.
REACHES = [
    *(["none"] * 6),
    "engine-resource",
    "sidecar-resource",
    "init-resource",
    "pod-resource",
    "container-claim",
    "pod-claims",
    "runtime-class",
    "devices",
    "devices",
    "devices",
]


@dataclass
class Case:
    """A Pod as the scheduler sends it, and what the test knows of how it was made."""

    pod: dict[str, Any]
    path: str
    reach: str
    # Bent after planning: its plan or its requests are not what the planner made.
    bent: bool
    # The Pod exactly as the webhook leaves it for a GPU plan (None: not such a Pod).
    genuine: dict[str, Any] | None


# What of a Pod its grant rests on: every container (resources, env, envFrom, image), the
# Pod's RuntimeClass, claims, resources and node selector, its annotations (the plan, the
# request, CDI keys) and its namespace. Nothing else (the name, uid, labels, scheduler name,
# readiness gates a scheduler's copy may differ in) gives or takes a device under the access
# rule; volumes and privilege are the pod security admission's, not this rule's.
GRANT_FIELDS = (
    "containers",
    "initContainers",
    "ephemeralContainers",
    "runtimeClassName",
    "resourceClaims",
    "resources",
    "nodeSelector",
)


def _view(pod: Any) -> Any:
    """The parts of `pod` its grant rests on (`GRANT_FIELDS`, annotations, namespace)."""
    if not isinstance(pod, Mapping):
        return pod
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = pod.get("spec")
    spec = {k: spec.get(k) for k in GRANT_FIELDS} if isinstance(spec, Mapping) else spec
    return (spec, meta.get("annotations"), meta.get("namespace"))


def _add_reach(draw: st.DrawFn, pod: dict[str, Any], reach: str) -> None:
    spec = pod["spec"]
    engine = spec["containers"][0]
    resource = draw(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "example.com/widget"]))
    quantity = draw(st.sampled_from(["1", "2", "8"]))
    if reach == "engine-resource":
        resources = engine.setdefault("resources", {})
        for part in ("requests", "limits"):
            resources[part] = {**resources.get(part, {}), resource: quantity}
    elif reach in ("sidecar-resource", "init-resource"):
        kind = "containers" if reach == "sidecar-resource" else "initContainers"
        spec.setdefault(kind, []).append(
            {"name": "extra", "image": "app", "resources": {"limits": {resource: quantity}}}
        )
    elif reach == "pod-resource":
        spec["resources"] = {"limits": {resource: quantity}}
    elif reach == "container-claim":
        engine.setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    elif reach == "pod-claims":
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
    elif reach == "runtime-class":
        spec["runtimeClassName"] = draw(st.sampled_from(["nvidia", "runc"]))
    elif reach == "devices":
        if draw(st.booleans()):
            spec["containers"].append({"name": "sidecar", "image": "app"})
        annotations = pod["metadata"].setdefault("annotations", {})
        while not device_findings(pod):
            add_device_surfaces(draw, spec, annotations)


@st.composite
def engine_pods(draw: st.DrawFn) -> Case:
    """A Pod of one of `PATHS`, with one of `REACHES` added."""
    path = draw(st.sampled_from(PATHS))
    bent = False
    if path in GENUINE:
        pod = planned_pod(draw(st.sampled_from(GENUINE[path])))
    elif path == "external":
        pod = planned_pod(json.dumps(EXTERNAL), resources={})
    elif path == "none":
        pod = planned_pod(None, resources={})
    elif path == "malformed":
        body = draw(st.sampled_from([*GENUINE["gpu"], *GENUINE["cpu"], EXTERNAL]))
        text = json.dumps(body, separators=(",", ":"))
        pod = planned_pod(text, resources=body.get("resources", {}))
        pod["metadata"]["annotations"][PLAN_ANNOTATION] = draw(
            st.one_of(
                mutated(dict(body), 2).map(json.dumps),
                garbled(text.encode()).map(lambda b: b.decode("utf-8", "replace")),
                json_values,
                st.text(max_size=20),
            )
        )
        bent = True
    else:
        pod, bent = draw(hand_made_pods())
    made = copy.deepcopy(pod)
    reach = draw(st.sampled_from(REACHES))
    _add_reach(draw, pod, reach)
    if _view(pod) == _view(made):
        reach = "none"  # what was added was there already (the plan's own RuntimeClass, say)
    if chance(draw, 5):
        pod["metadata"]["namespace"] = "elsewhere"
    genuine = made if path == "gpu" and _view(pod) == _view(made) else None
    return Case(pod, path, reach, bent, genuine)


@st.composite
def hand_made_pods(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A Pod made by hand from a plan (as a replaced webhook would), and whether it was bent
    after planning."""
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
def extender_args(draw: st.DrawFn) -> tuple[bytes, Any, Case]:
    case = draw(engine_pods())
    pod = case.pod
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
    return body, args, case


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
    try:
        plan = parse_plan(text)
    except PlanError as exc:
        return f"the plan cannot be read: {exc}"
    if plan.path == "external":
        return None  # places nothing: passed as any Pod (one that reaches: `_forged_placement`)
    if node is None:
        return "the node is not known"
    try:
        found = PROFILE.envelope.binding(plan.bindingId or "") if plan.path == "gpu" else None
        binding = found[1] if found else None
        demand = demand_for(plan, binding, pod, PROFILE.sha256)
    except PlanError as exc:
        return f"the plan cannot be placed: {exc}"
    facts = node_facts(node)
    verdict = check(demand, facts, ledger.used(facts.name))
    return None if verdict.fits else f"{verdict.code}: {verdict.reason}"


def _reaching(pod: Any, case: Case) -> list[str]:
    """Why `pod` reaches for something (empty: it does not): the predicate's reaches, the
    rule's device findings restated, and the reach the test added, while the Pod is the one it
    was added to."""
    if not isinstance(pod, Mapping):
        return []
    why = [reach.field for reach in reaches(pod, plan_annotation=False)]
    why += [found[0] for found in device_findings(pod)]
    if case.reach != "none" and _view(pod) == _view(case.pod):
        why.append(f"the added {case.reach}")
    return why


def _forged_placement(pod: Any, case: Case) -> str | None:
    """Why no node may pass `pod` whatever its fit (None: a node may, if the Pod fits)."""
    why = _reaching(pod, case)
    genuine = case.genuine is not None and _view(pod) == _view(case.genuine)
    if why and not genuine:
        return f"the Pod reaches ({', '.join(why)}) and is no genuine GPU Pod ({case.path} plan)"
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    annotations = meta.get("annotations")
    planned = isinstance(annotations, Mapping) and PLAN_ANNOTATION in annotations
    if meta.get("namespace") != NAMESPACE and (planned or why):
        namespace = meta.get("namespace")
        return f"the Pod is in namespace {namespace!r}, no tenant's, yet planned or reaching"
    return None


def check_filter(
    driver: AppDriver, body: bytes, case: Case, ledger: UsageLedger, stats: Stats
) -> None:
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
    forged = _forged_placement(pod, case) if passed else None
    if forged is not None:
        stats.forged_grants += 1
        raise Failure(f"nodes {passed} passed though {forged}: {json.dumps(pod)[:2000]}")
    for name in passed:
        why = _may_pass(pod, by_name[name], ledger)
        if why is not None:
            stats.forged_grants += 1
            raise Failure(f"node {name} passed though {why}")
    genuine = case.genuine is not None and _view(pod) == _view(case.genuine)
    if passed:
        stats.saw("passed-genuine-gpu" if genuine else "passed-some")
    else:
        stats.saw("passed-none")


# -- the core, as the allocation controller judges the same Pods -------------------------------

CONTEXT = corpus.state().context(NOW)
REVISIONS = {PROFILE.sha256: PROFILE}


def check_core(case: Case, stats: Stats) -> None:
    """The gate and the grant check on the Pod as made (before any bending of the whole
    ExtenderArgs): a forgery is never verified, a genuine GPU Pod always is, and the gate
    refuses what it must with the code it must."""
    pod = case.pod
    if pod["metadata"]["namespace"] != NAMESPACE:
        return
    why = _reaching(pod, case)
    annotations = pod["metadata"].get("annotations") or {}
    text = annotations.get(PLAN_ANNOTATION)
    path: str | None = None
    if text is not None:
        try:
            path = parse_plan(text).path if isinstance(text, str) else "invalid"
        except PlanError:
            path = "invalid"
    wanted = None
    if path == "invalid":
        wanted = NodeVerdictCode.PLAN_INVALID
    elif why and path in (None, "cpu", "external"):
        wanted = NodeVerdictCode.UNPLANNED_DEVICE
    gate = device_gate(pod)
    if gate.code is not wanted:
        raise Failure(f"a Pod with a {path} plan, reaching {why}, got {gate}, not {wanted}")
    verdict = evaluate(bound(pod, NAMES[0]), REVISIONS, CONTEXT, NOW).verdict
    verified = verdict is not None and verdict.verified
    if case.genuine is not None:
        if not verified:
            raise Failure(f"a genuine GPU Pod is not verified: {verdict}")
        stats.tried("genuine-gpu-verified")
    elif why and verified:
        stats.forged_grants += 1
        raise Failure(f"the grant check verifies a Pod that reaches ({why}): {json.dumps(pod)}")
    elif why:
        stats.tried("forgery-not-verified")


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

        @fuzz_settings(250)
        @given(extender_args(), ledgers())
        def run(call: tuple[bytes, Any, Case], pods: list[dict[str, Any]]) -> None:
            body, _, case = call
            for key in list(source.pods):
                source.delete_pod(key)
            ledger = UsageLedger()
            for pod in pods:
                source.put_pod(pod)
                accounted = accounted_pod(pod)
                if accounted is not None and pod["metadata"]["namespace"] == NAMESPACE:
                    ledger.upsert(pod_key(pod), *accounted)
            forgery = case.bent or (case.genuine is None and bool(_reaching(case.pod, case)))
            stats.forgeries_tried += forgery
            stats.tried(f"path-{case.path}", f"reach-{case.reach}")
            check_core(case, stats)
            check_filter(driver, body, case, ledger, stats)
            check_prioritize(driver, body)

        run()
    assert stats.forged_grants == 0
    assert stats.inputs > 0
