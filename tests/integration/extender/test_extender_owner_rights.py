"""The extender fails closed in a tenant namespace where the allocation controller lost its rights.

With `allocation_controller` set (the chart's TMI_ALLOCATION_CONTROLLER), an engine Pod is placed
only while the API server confirms, in a recent SubjectAccessReview, that the controller may
list, watch and get Pods and patch their status in the Pod's namespace
(`inference_policy.granting.owner_rights`, `extender.owner_rights`); otherwise every node is refused
with the reason and the stable code `owner-rights`. Pods without a plan are untouched. First through
the HTTP app fed from memory (the test records the answers), then with the real reviewer against
a fake API server answering reviews. Last, what happens when the extender itself may not read the
profile: GPU plans are refused, CPU plans asking for no device are placed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from extender.app import RUNTIME
from extender.config import settings_from_args
from extender.owner_rights import RightsBoard, Unconfirmed
from extender.sources import KubernetesSource
from extender.view import ClusterView
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.granting.owner_rights import (
    CONTROLLER_RIGHTS,
    MAX_REVIEWS_PER_SECOND,
    Right,
    judge,
)
from inference_policy.granting.pod_demand import Unplaceable
from inference_policy.placing.placement import Demand
from kits import polling
from kits.extenderkit import (
    NAMESPACE,
    block,
    cache_args,
    extender_app,
    fleet_envelope,
    plan_for,
    planned_pod,
    request,
)
from kits.fakeapi import FakeCluster
from kits.fleetkit import FLEET
from kits.profilekit import NOW, Owner
from localcluster.nodes.kwok import FakeNode
from serving.apiserver import from_kubeconfig
from serving.settings import ConfigError

CONTROLLER = "system:serviceaccount:tmi-system:tmi-allocation-controller"
LIST, WATCH, GET, PATCH = CONTROLLER_RIGHTS
NODES = ["h100-8a", "cpu-1"]


def answers(**denied: bool) -> dict[Right, bool | None]:
    """Every right allowed but those named (`patch=True`: patch pods/status denied)."""
    return {right: not denied.get(right.verb, False) for right in CONTROLLER_RIGHTS}


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
def plans(owner: Owner) -> dict[str, Any]:
    envelope = fleet_envelope(owner)
    return {
        "whole": plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole"))),
        "cpu": plan_for(owner, envelope, request(config__force_cpu=True)),
    }


async def post(client: TestClient[Any, Any], verb: str, body: Any) -> Any:
    response = await client.post(
        f"/{verb}", data=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status == 200, await response.text()
    return await response.json()


async def checked_app(
    aiohttp_client: AiohttpClient, owner: Owner
) -> tuple[TestClient[Any, Any], RightsBoard]:
    app, _ = extender_app(owner, [n.manifest() for n in FLEET], allocation_controller=CONTROLLER)
    client = await aiohttp_client(app)
    board = app[RUNTIME].view.rights
    assert board is not None
    return client, board


async def test_engine_pods_wait_for_the_first_answer_then_place_while_confirmed(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, board = await checked_app(aiohttp_client, owner)
    # Not asked yet: unready, and a planned Pod is retried (Error), not parked as unschedulable.
    ready = await client.get("/readyz")
    assert ready.status == 503
    assert f"controller rights/{NAMESPACE}" in (await ready.json())["detail"]
    waiting = await post(client, "filter", cache_args(planned_pod(plans["whole"]), NODES))
    assert "controller rights/kamiwaza" in waiting["Error"]
    plain = planned_pod(None, resources={"requests": {"cpu": "1"}})
    assert (await post(client, "filter", cache_args(plain, NODES)))["NodeNames"] == NODES

    board.record(judge(NAMESPACE, answers()))
    assert (await client.get("/readyz")).status == 200
    placed = await post(client, "filter", cache_args(planned_pod(plans["whole"]), NODES))
    assert placed["NodeNames"] == ["h100-8a"] and placed["Error"] == ""
    text = await (await client.get("/metrics")).text()
    assert f'tmi_extender_controller_rights_confirmed{{namespace="{NAMESPACE}"}} 1.0' in text
    assert (
        "tmi_extender_controller_rights_missing"
        f'{{namespace="{NAMESPACE}",resource="pods/status",verb="patch"}} 0.0'
    ) in text


async def test_a_lost_right_refuses_every_engine_pod_of_the_namespace_with_its_reason(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, board = await checked_app(aiohttp_client, owner)
    board.record(judge(NAMESPACE, answers(patch=True, list=True)))
    reason = (
        f"the allocation controller {CONTROLLER} may not list pods, patch pods/status in "
        f"namespace '{NAMESPACE}', so no AllocationVerified verdict can be checked there and no "
        f"engine Pod is placed; restore Role and RoleBinding tmi-allocation-controller in "
        f"namespace '{NAMESPACE}' (an upgrade of the owner release applies them again)"
    )
    for plan, node in ((plans["whole"], "h100-8a"), (plans["cpu"], "cpu-1")):
        pod = planned_pod(plan)
        result = await post(client, "filter", cache_args(pod, NODES))
        assert result["NodeNames"] == [] and result["Error"] == ""
        assert result["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, reason), node
        scores = await post(client, "prioritize", cache_args(pod, NODES))
        assert scores == [{"Host": n, "Score": 0} for n in NODES]
    # A Pod holding no plan, or a plan that places nothing, is no business of the controller's.
    plain = planned_pod(None, resources={"requests": {"cpu": "1"}})
    assert (await post(client, "filter", cache_args(plain, NODES)))["NodeNames"] == NODES
    external = {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}
    outside = planned_pod(external, resources={})
    assert (await post(client, "filter", cache_args(outside, NODES)))["NodeNames"] == NODES

    text = await (await client.get("/metrics")).text()
    assert 'tmi_extender_node_verdicts_total{code="owner-rights"} 4.0' in text
    assert 'tmi_extender_requests_total{outcome="owner-rights",verb="filter"} 2.0' in text
    assert f'tmi_extender_controller_rights_confirmed{{namespace="{NAMESPACE}"}} 0.0' in text
    for resource, verb, value in (
        ("pods/status", "patch", 1),
        ("pods", "list", 1),
        ("pods", "get", 0),
    ):
        series = f'{{namespace="{NAMESPACE}",resource="{resource}",verb="{verb}"}}'
        assert f"tmi_extender_controller_rights_missing{series} {float(value)}" in text

    # Restored: the next answer places again.
    board.record(judge(NAMESPACE, answers()))
    placed = await post(client, "filter", cache_args(planned_pod(plans["whole"]), NODES))
    assert placed["NodeNames"] == ["h100-8a"]


def test_no_answer_to_rely_on_fails_closed_as_the_extenders_own_trouble() -> None:
    """Not asked yet, or answered too long ago: the Pod is not placed, and not parked either
    (`Unconfirmed` is answered as an `Error`, which the scheduler retries after its backoff)."""
    now = [100.0]
    board = RightsBoard(CONTROLLER, [NAMESPACE], interval=5.0, monotonic=lambda: now[0])
    with pytest.raises(Unconfirmed, match="unconfirmed \\(no review has answered yet\\)"):
        board.check(NAMESPACE)
    board.record(judge(NAMESPACE, answers()))
    now[0] += 15.0
    board.check(NAMESPACE)  # three rounds' worth is still trusted
    now[0] += 1.0
    with pytest.raises(Unconfirmed) as unconfirmed:
        board.check(NAMESPACE)
    assert unconfirmed.value.reason == (
        f"the allocation controller {CONTROLLER}'s rights in namespace '{NAMESPACE}' (list pods, "
        "watch pods, get pods, patch pods/status) are unconfirmed (no review has answered for "
        "16s), so no AllocationVerified verdict can be checked there and no engine Pod is "
        "placed until they are"
    )
    assert [(ns, present) for ns, present, _ in board.series()] == [(NAMESPACE, False)]
    # A denial goes stale the same way: what is denied is not known now either.
    board.record(judge(NAMESPACE, answers(patch=True)))
    with pytest.raises(Unplaceable):
        board.check(NAMESPACE)
    now[0] += 16.0
    with pytest.raises(Unconfirmed):
        board.check(NAMESPACE)


async def test_an_unconfirmed_namespace_answers_an_error_for_engine_pods_only(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, board = await checked_app(aiohttp_client, owner)
    now = [0.0]
    board.monotonic = lambda: now[0]
    board.record(judge(NAMESPACE, answers()))
    now[0] += 60.0
    result = await post(client, "filter", cache_args(planned_pod(plans["whole"]), NODES))
    assert result["NodeNames"] == [] and result["FailedAndUnresolvableNodes"] == {}
    assert result["Error"].endswith("until they are; retry shortly")
    assert "are unconfirmed (no review has answered for 60s)" in result["Error"]
    scores = await post(client, "prioritize", cache_args(planned_pod(plans["whole"]), NODES))
    assert scores == [{"Host": n, "Score": 0} for n in NODES]
    plain = planned_pod(None, resources={"requests": {"cpu": "1"}})
    assert (await post(client, "filter", cache_args(plain, NODES)))["NodeNames"] == NODES
    text = await (await client.get("/metrics")).text()
    assert 'tmi_extender_requests_total{outcome="not-ready",verb="filter"} 1.0' in text
    assert f'tmi_extender_controller_rights_confirmed{{namespace="{NAMESPACE}"}} 0.0' in text


# -- the reviewer against an API server -----------------------------------------------------------


@pytest.fixture
async def cluster() -> Any:
    fake = FakeCluster()
    await fake.start()
    yield fake
    await fake.stop()


async def until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    code = predicate.__code__
    what = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} to hold"
    await polling.eventually(predicate, what=what, timeout=timeout)


def _source(fake: FakeCluster, tmp_path: Path) -> KubernetesSource:
    kubeconfig = str(fake.kubeconfig(tmp_path / "kubeconfig"))
    return KubernetesSource(
        [NAMESPACE], from_kubeconfig(kubeconfig), watch_seconds=1, backoff_seconds=0.05
    )


def _publish(fake: FakeCluster, owner: Owner) -> None:
    configmap = owner.sign(fleet_envelope(owner))
    configmap["metadata"]["namespace"] = NAMESPACE
    fake.put("configmaps", configmap)
    node = FakeNode("n1", gpus=2).manifest()
    node.pop("apiVersion")
    node.pop("kind")
    fake.put("nodes", node)


def refusal(view: ClusterView) -> str | None:
    """Why an engine Pod of the namespace is not placed now (None: it may be)."""
    assert view.rights is not None
    try:
        view.rights.check(NAMESPACE)
    except Unplaceable as exc:
        assert exc.code == NodeVerdictCode.OWNER_RIGHTS
        return exc.reason
    except Unconfirmed as exc:
        return exc.reason
    return None


async def test_the_reviewer_asks_each_right_and_the_view_follows_the_answers(
    cluster: FakeCluster, tmp_path: Path, owner: Owner
) -> None:
    _publish(cluster, owner)
    board = RightsBoard(CONTROLLER, [NAMESPACE], interval=0.1)
    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW, rights=board)
    source = _source(cluster, tmp_path)
    await source.start(view)
    try:
        await until(lambda: view.ready)
        assert refusal(view) is None
        asked = {
            (r["spec"]["user"], r["spec"]["resourceAttributes"]["verb"]) for r in cluster.reviews
        }
        assert asked == {(CONTROLLER, r.verb) for r in CONTROLLER_RIGHTS}
        assert cluster.reviews[0]["spec"]["groups"][1] == "system:serviceaccounts:tmi-system"

        # The tenant deletes the RoleBinding: within a round, no engine Pod is placed.
        cluster.denied = {(NAMESPACE, r.verb, r.resource_path) for r in CONTROLLER_RIGHTS}
        await until(lambda: "may not list pods" in (refusal(view) or ""))
        cluster.denied.clear()
        await until(lambda: refusal(view) is None)

        # The reviews fail: the last answer holds for three rounds, then fails closed.
        cluster.review_failure = 500
        await until(lambda: "unconfirmed (no review has answered for" in (refusal(view) or ""))
        assert source.rights is not None and source.rights.failures > 0
        # Refused to the extender itself: unconfirmed, and the fix is the extender's ClusterRole.
        cluster.review_failure = 403
        await until(lambda: "check ClusterRole kamiwaza-tmi-extender" in (refusal(view) or ""))
        cluster.review_failure = None
        await until(lambda: refusal(view) is None)
    finally:
        await source.stop()


async def test_a_profile_the_extender_may_not_read_refuses_gpu_plans_but_not_cpu_plans(
    cluster: FakeCluster, tmp_path: Path, owner: Owner, plans: dict[str, Any]
) -> None:
    """The extender's own Role in the tenant namespace deleted: its profile read is refused
    (`policy_io.feed`), so no GPU plan has a verified profile to be placed under, while a CPU
    plan, which asks for no device, needs none."""
    _publish(cluster, owner)
    cluster.forbidden.add("configmaps")
    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
    source = _source(cluster, tmp_path)
    await source.start(view)
    try:
        await until(lambda: view.ready)
        with pytest.raises(Unplaceable) as refused:
            view.demand(planned_pod(plans["whole"]))
        assert refused.value.code == NodeVerdictCode.PROFILE_REFUSED
        assert refused.value.reason.endswith("bundle did not arrive from the configured ConfigMap")
        # The cause is kept beside the refusal.
        check = view.policy.profile_refusal
        assert check is not None and "may not be read (HTTP 403; check the Role)" in check.check
        assert isinstance(view.demand(planned_pod(plans["cpu"])), Demand)
    finally:
        await source.stop()


def test_the_controller_and_the_interval_are_settings() -> None:
    env = {
        "TMI_NAMESPACE": NAMESPACE,
        "TMI_OWNER_PUBLIC_KEY": "A" * 43 + "=",
        "TMI_CLUSTER_BINDING_ID": "demo-cluster",
        "TMI_PLAIN_HTTP": "true",
    }
    unchecked = settings_from_args([], env)
    assert (unchecked.allocation_controller, unchecked.rights_seconds) == (None, 5.0)
    checked = settings_from_args(
        ["--rights-seconds", "2"], {**env, "TMI_ALLOCATION_CONTROLLER": CONTROLLER}
    )
    assert (checked.allocation_controller, checked.rights_seconds) == (CONTROLLER, 2.0)
    with pytest.raises(ConfigError, match="rights-seconds"):
        settings_from_args(["--rights-seconds", "0"], env)


def test_the_reviews_keep_to_a_rate_whatever_the_number_of_tenants() -> None:
    """A round asks every right in every tenant namespace: with 100 tenants at the 5 s default
    that was 80 reviews a second against the API server. Rounds space out instead, and the
    answers are trusted for as many rounds as before."""
    one = RightsBoard(CONTROLLER, [NAMESPACE], interval=5.0)
    assert (one.interval, one.ttl) == (5.0, 15.0)
    many = RightsBoard(CONTROLLER, [f"team-{i}" for i in range(100)], interval=5.0)
    rate = 100 * len(CONTROLLER_RIGHTS) / many.interval
    assert rate <= MAX_REVIEWS_PER_SECOND and many.interval > 5.0
    assert many.ttl == 3 * many.interval
