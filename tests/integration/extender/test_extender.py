"""POST /filter and /prioritize through aiohttp's test client, fed from memory.

Both wire modes (node-cache with `NodeNames`, full-node with `Nodes`), the exact Go field names,
every filter reason and which of `FailedNodes` / `FailedAndUnresolvableNodes` it lands in, best
fit ordering, malformed input (400 with an `Error`), answers it cannot give (200 with an
`Error`: deep nesting, a bug; never aiohttp's bare 500), Pods without a plan, profile
refusals, and accounting rebuilt from the Pod list after a restart.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION
from kits.extenderkit import (
    MIG,
    NAMESPACE,
    SHARE,
    VRAM,
    WHOLE,
    block,
    bound,
    cache_args,
    extender_app,
    fleet_envelope,
    full_args,
    plan_for,
    planned_pod,
    published,
    request,
)
from kits.fleetkit import (
    FLEET,
    H100_2,
    H100_8,
    H100_8B,
    L40S,
    T4,
    h100,
    l40s,
)
from kits.memory_sources import ExtenderMemorySource as MemorySource
from kits.profilekit import NOW, Owner

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
PROFILE_PREFIX = "owner profile bundle: invalid inference profile authorization: "


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
def plans(owner: Owner) -> dict[str, dict[str, Any]]:
    envelope = fleet_envelope(owner)
    return {
        "whole": plan_for(owner, envelope, request(inferenceResources=block("nvidia-whole"))),
        "mig": plan_for(owner, envelope, request(inferenceResources=block("nvidia-mig-3g40gb"))),
        "share": plan_for(owner, envelope, request(inferenceResources=block("nvidia-vram-share"))),
        "cpu": plan_for(owner, envelope, request(config__force_cpu=True)),
    }


async def client_for(
    aiohttp_client: AiohttpClient, owner: Owner, **kwargs: Any
) -> tuple[TestClient[Any, Any], MemorySource]:
    kwargs.setdefault("nodes", FLEET)
    app, source = extender_app(owner, **kwargs)
    return await aiohttp_client(app), source


async def post(client: TestClient[Any, Any], verb: str, body: Any, status: int = 200) -> Any:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    resp = await client.post(f"/{verb}", data=data, headers={"Content-Type": "application/json"})
    assert resp.status == status, await resp.text()
    return await resp.json()


async def filter_names(client: TestClient[Any, Any], pod: Any, names: list[str]) -> Any:
    result = await post(client, "filter", cache_args(pod, names))
    assert set(result) == FILTER_KEYS
    assert result["Nodes"] is None and result["Error"] == ""
    return result


ALL = [n.name for n in FLEET]


# -- wire modes ---------------------------------------------------------------------------------


async def test_node_cache_mode_answers_names_with_exact_field_names(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await filter_names(client, planned_pod(plans["whole"]), ALL)
    assert result["NodeNames"] == ["h100-8a", "h100-8b", "h100-2"]
    assert result["FailedNodes"] == {}
    unresolvable = result["FailedAndUnresolvableNodes"]
    assert set(unresolvable) == set(ALL) - {"h100-8a", "h100-8b", "h100-2"}
    assert unresolvable["a100-mig"] == (
        "node advertises 0 nvidia.com/gpu in its allocatable resources"
    )
    assert unresolvable["gh200"] == (
        f"node architecture is arm64; binding {WHOLE} runs on amd64 nodes only"
    )
    assert unresolvable["cpu-1"] == "node advertises no nvidia.com/gpu in its allocatable resources"


async def test_full_node_mode_echoes_the_node_objects_it_keeps(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    # No node informer data at all: full-node mode judges the Nodes it is sent.
    client, _ = await client_for(aiohttp_client, owner, nodes=[])
    args = full_args(planned_pod(plans["mig"]), [n.manifest() for n in FLEET])
    result = await post(client, "filter", args)
    assert set(result) == FILTER_KEYS
    assert result["NodeNames"] is None and result["Error"] == ""
    kept = result["Nodes"]["items"]
    assert [n["metadata"]["name"] for n in kept] == ["a100-mig"]
    assert kept[0] == args["Nodes"]["items"][3]
    assert result["FailedAndUnresolvableNodes"]["a100-single"].startswith(
        "node's MIG strategy is single"
    )
    assert "h100-8a" in result["FailedAndUnresolvableNodes"]


async def test_prioritize_answers_a_host_priority_list_in_both_modes(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    busy = [bound(planned_pod(plans["whole"]), "h100-8b") for _ in range(7)]
    client, _ = await client_for(aiohttp_client, owner, pods=busy)
    pod = planned_pod(plans["whole"])
    names = ["h100-8a", "h100-2", "h100-8b", "t4"]
    cached = await post(client, "prioritize", cache_args(pod, names))
    assert cached == [
        {"Host": "h100-8a", "Score": 1},
        {"Host": "h100-2", "Score": 8},
        {"Host": "h100-8b", "Score": 10},
        {"Host": "t4", "Score": 0},
    ]
    nodes = [n.manifest() for n in (H100_8, H100_2, H100_8B, T4)]
    full = await post(client, "prioritize", full_args(pod, nodes))
    assert full == cached
    best = max(cached, key=lambda h: h["Score"])
    assert best["Host"] == "h100-8b"


async def test_best_fit_keeps_large_free_devices_whole_for_shares(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    other = l40s("l40s-b")
    used = [bound(planned_pod(plans["share"]), "l40s") for _ in range(4)]  # 32 of 48 GB
    client, _ = await client_for(aiohttp_client, owner, nodes=[L40S, other], pods=used)
    scores = await post(
        client, "prioritize", cache_args(planned_pod(plans["share"]), ["l40s-b", "l40s"])
    )
    assert scores == [{"Host": "l40s-b", "Score": 1}, {"Host": "l40s", "Score": 8}]


async def test_a_replica_goes_to_a_node_without_its_sibling_while_deployments_still_pack(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    """Best fit would put the second replica beside the first, on the node it part-filled;
    seed 002: two replicas on one GPU are no evidence of resilience to that GPU failing."""
    first = planned_pod(plans["share"])
    deployment = first["metadata"]["labels"][ENGINE_LABEL]
    used = [bound(first, "l40s")]
    client, _ = await client_for(aiohttp_client, owner, nodes=[L40S, l40s("l40s-b")], pods=used)
    sibling = planned_pod(plans["share"])
    sibling["metadata"]["labels"][ENGINE_LABEL] = deployment
    apart = await post(client, "prioritize", cache_args(sibling, ["l40s", "l40s-b"]))
    assert apart[1]["Score"] > apart[0]["Score"] >= 1, apart
    # Another deployment packs onto the part-filled node, as best fit says.
    other = await post(
        client, "prioritize", cache_args(planned_pod(plans["share"]), ["l40s", "l40s-b"])
    )
    assert other[0]["Score"] > other[1]["Score"], other


# -- each reason, and where it lands -------------------------------------------------------------


async def test_gfd_contradictions_are_unresolvable(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await filter_names(client, planned_pod(plans["whole"]), ["t4", "r570", "no-gfd"])
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    reasons = result["FailedAndUnresolvableNodes"]
    assert reasons["t4"].startswith("GPU Feature Discovery reports compute capability 7.5")
    assert reasons["r570"].startswith("GPU Feature Discovery reports a driver for CUDA 12")
    assert reasons["no-gfd"] == (
        f"node has no GPU Feature Discovery labels; cannot confirm the accelerator binding "
        f"{WHOLE} attests"
    )


async def test_mig_strategy_and_product_are_checked(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await filter_names(client, planned_pod(plans["mig"]), ["a100-mig", "a100-single"])
    assert result["NodeNames"] == ["a100-mig"]
    assert result["FailedAndUnresolvableNodes"]["a100-single"].startswith(
        f"node's MIG strategy is single (nvidia.com/mig.strategy); binding {MIG} requests "
        "nvidia.com/mig-3g.40gb"
    )


async def test_full_vram_bucket_and_busy_gpus_are_resolvable(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    pods = [bound(planned_pod(plans["share"]), "l40s") for _ in range(5)]  # 40 of 48 GB
    pods += [bound(planned_pod(plans["whole"]), "h100-2") for _ in range(2)]
    client, _ = await client_for(aiohttp_client, owner, pods=pods)
    share = await filter_names(client, planned_pod(plans["share"]), ["l40s"])
    assert share["NodeNames"] == ["l40s"]  # 40 + 8 = 48 fits exactly
    pods_more = bound(planned_pod(plans["share"]), "l40s")
    client2, _ = await client_for(aiohttp_client, owner, pods=[*pods, pods_more])
    full = await filter_names(client2, planned_pod(plans["share"]), ["l40s"])
    assert full["NodeNames"] == [] and full["FailedAndUnresolvableNodes"] == {}
    assert full["FailedNodes"] == {
        "l40s": f"accounted VRAM bucket {VRAM} is full: the share of binding {SHARE} needs 8 GB "
        "and 0 of 48 GB are free"
    }
    whole = await filter_names(client2, planned_pod(plans["whole"]), ["h100-2", "h100-8a"])
    assert whole["NodeNames"] == ["h100-8a"]
    assert whole["FailedNodes"] == {
        "h100-2": "not enough free nvidia.com/gpu: the Pod requests 1, and 0 of 2 is free"
    }


async def test_cpu_plans_check_architecture_and_cpu_memory(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await filter_names(client, planned_pod(plans["cpu"]), ["cpu-1", "gh200", "h100-8a"])
    assert result["NodeNames"] == ["cpu-1", "h100-8a"]
    assert list(result["FailedAndUnresolvableNodes"]) == ["gh200"]


async def test_unknown_node_in_cache_mode_is_resolvable(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await filter_names(client, planned_pod(plans["whole"]), ["h100-8a", "brand-new"])
    assert result["NodeNames"] == ["h100-8a"]
    assert "not in the extender's node cache yet" in result["FailedNodes"]["brand-new"]


# -- Pods without a plan, and bad plans ---------------------------------------------------------


async def test_pod_without_a_plan_passes_every_node_unchanged(
    aiohttp_client: AiohttpClient, owner: Owner
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    pod = planned_pod(None, resources={"requests": {"cpu": "1"}})
    result = await filter_names(client, pod, ALL)
    assert result["NodeNames"] == ALL
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
    scores = await post(client, "prioritize", cache_args(pod, ALL))
    assert scores == [{"Host": n, "Score": 0} for n in ALL]
    full = await post(client, "filter", full_args(pod, [n.manifest() for n in FLEET]))
    assert len(full["Nodes"]["items"]) == len(FLEET)


async def test_pod_asking_for_an_accelerator_without_a_plan_passes_no_node(
    aiohttp_client: AiohttpClient, owner: Owner
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    pod = planned_pod(None, resources={"limits": {"nvidia.com/gpu": "1"}})
    result = await filter_names(client, pod, ALL)
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == set(ALL)
    (reason,) = set(result["FailedAndUnresolvableNodes"].values())
    assert reason == (
        "the Pod asks for an accelerator without a plan "
        "(spec.containers[engine].resources.limits[nvidia.com/gpu]); only an engine Pod planned "
        "by the tenant webhook may"
    )


def _forged(pod: dict[str, Any], change: Any) -> dict[str, Any]:
    """The same Pod, changed as the API server would store the change: a new resourceVersion
    (the extender remembers a verdict by uid and resourceVersion)."""
    pod = copy.deepcopy(pod)
    change(pod)
    pod["metadata"]["resourceVersion"] = str(int(pod["metadata"].get("resourceVersion", "1")) + 1)
    return pod


def _raise_gpus(pod: dict[str, Any]) -> None:
    # A replaced webhook granting 8 GPUs, plan annotation and all, to a 1-GPU request.
    plan = json.loads(pod["metadata"]["annotations"][PLAN_ANNOTATION])
    plan["resources"] = {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    pod["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps(plan)
    pod["spec"]["containers"][0]["resources"] = plan["resources"]


def _other_image(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["image"] = "registry.invalid/miner:1"


def _unshielded_sidecar(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"].append({"name": "helper", "image": "registry.invalid/tool:1"})


def _device_env(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


GRANT_FORGERIES = {
    "eight-gpus": (_raise_gpus, "plans for the Pod's deployment request"),
    "other-image": (_other_image, "registry.invalid/miner:1"),
    "unshielded-sidecar": (_unshielded_sidecar, "helper"),
    "device-env": (_device_env, "NVIDIA_VISIBLE_DEVICES"),
}


@pytest.mark.parametrize(("change", "words"), GRANT_FORGERIES.values(), ids=GRANT_FORGERIES)
async def test_a_pod_that_is_not_its_plan_passes_no_node(
    aiohttp_client: AiohttpClient,
    owner: Owner,
    plans: dict[str, Any],
    change: Any,
    words: str,
) -> None:
    """The owner's extender holds the Pod to the signed profile, as the controller does: a
    tenant webhook that was replaced or misconfigured gets no node, and says why."""
    client, _ = await client_for(aiohttp_client, owner)
    honest = planned_pod(plans["whole"])
    assert (await filter_names(client, honest, ["h100-8a"]))["NodeNames"] == ["h100-8a"]
    result = await filter_names(client, _forged(honest, change), ALL)
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    (reason,) = set(result["FailedAndUnresolvableNodes"].values())
    assert words in reason, reason
    scores = await post(client, "prioritize", cache_args(_forged(honest, change), ALL))
    assert {s["Score"] for s in scores} == {0}


async def test_external_plan_passes_every_node(aiohttp_client: AiohttpClient, owner: Owner) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    external = {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}
    pod = planned_pod(external, resources={})
    assert (await filter_names(client, pod, ALL))["NodeNames"] == ALL


@pytest.mark.parametrize(
    ("resources", "extra"),
    [
        ({"limits": {"nvidia.com/gpu": "2"}}, {}),
        ({"limits": {"aws.amazon.com/neuroncore": "2"}}, {}),
        ({}, {"runtimeClassName": "nvidia"}),
        ({}, {"env": [{"name": "NVIDIA_IMEX_CHANNELS", "value": "all"}]}),
        ({}, {"annotation": "nvidia.com/gpu=all"}),
    ],
    ids=["gpus", "neuron", "runtime-class", "device-variable", "cdi-annotation"],
)
@pytest.mark.parametrize("path", ["external", "cpu"])
async def test_a_plan_that_grants_no_device_places_no_pod_that_reaches(
    aiohttp_client: AiohttpClient,
    owner: Owner,
    resources: dict[str, Any],
    extra: dict[str, Any],
    path: str,
) -> None:
    """Whatever the plan says of itself: only a GPU plan the profile grants may hold a device
    (the core's `device_gate`), so a tenant that removed its webhook gets no such Pod bound."""
    client, _ = await client_for(aiohttp_client, owner)
    if path == "external":
        plan: dict[str, Any] = {
            "status": 200,
            "path": "external",
            "derived": True,
            "engine": "llamacpp",
        }
    else:
        plan = plan_for(owner, owner.envelope(), request(config__force_cpu=True))
    pod = planned_pod(plan, resources=resources)
    if "runtimeClassName" in extra:
        pod["spec"]["runtimeClassName"] = extra["runtimeClassName"]
    if "env" in extra:
        pod["spec"]["containers"][0]["env"] = extra["env"]
    if "annotation" in extra:
        pod["metadata"]["annotations"]["cdi.k8s.io/gpu"] = extra["annotation"]
    result = await filter_names(client, pod, ALL)
    assert result["NodeNames"] == [], result
    (reason,) = set(result["FailedAndUnresolvableNodes"].values())
    assert "only a gpu plan the signed profile grants may hold a device" in reason, reason


async def test_malformed_plan_fails_closed_on_every_node(
    aiohttp_client: AiohttpClient, owner: Owner
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await filter_names(client, planned_pod("{not json", resources={}), ALL)
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    reasons = set(result["FailedAndUnresolvableNodes"].values())
    assert len(result["FailedAndUnresolvableNodes"]) == len(ALL)
    assert len(reasons) == 1 and next(iter(reasons)).startswith(
        "the kamiwaza.ai/plan annotation cannot be read"
    )


async def test_pod_changed_after_admission_is_refused(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    pod = planned_pod(plans["whole"], resources={"limits": {"nvidia.com/gpu": "4"}})
    result = await filter_names(client, pod, ["h100-8a"])
    assert result["FailedAndUnresolvableNodes"]["h100-8a"].startswith(
        "the Pod requests 4 nvidia.com/gpu but its plan grants 1"
    )


# -- the profile --------------------------------------------------------------------------------


async def test_missing_profile_refuses_gpu_pods_but_not_cpu_pods(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner, configmap=None)
    gpu = await filter_names(client, planned_pod(plans["whole"]), ["h100-8a"])
    assert gpu["FailedAndUnresolvableNodes"] == {
        "h100-8a": PROFILE_PREFIX + "bundle did not arrive from the configured ConfigMap"
    }
    cpu = await filter_names(client, planned_pod(plans["cpu"]), ["cpu-1"])
    assert cpu["NodeNames"] == ["cpu-1"]


async def test_expired_profile_refuses_gpu_pods(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    later = NOW + timedelta(days=3650)
    client, _ = await client_for(aiohttp_client, owner, now=later)
    result = await filter_names(client, planned_pod(plans["whole"]), ["h100-8a"])
    assert result["FailedAndUnresolvableNodes"] == {
        "h100-8a": PROFILE_PREFIX + "bundle is expired or its window is empty"
    }


async def test_binding_dropped_by_a_new_revision_is_refused(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, source = await client_for(aiohttp_client, owner)
    assert (await filter_names(client, planned_pod(plans["mig"]), ["a100-mig"]))["NodeNames"]
    revision = fleet_envelope(owner, mig=False)
    revision["version"] = 2
    source.put_configmap(published(owner.sign(revision), "2002"))
    result = await filter_names(client, planned_pod(plans["mig"]), ["a100-mig"])
    assert result["FailedAndUnresolvableNodes"]["a100-mig"].startswith(
        f"binding {MIG} is not in the verified profile"
    )


async def test_profile_signed_by_another_key_is_refused(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    stranger = Owner()
    configmap = published(stranger.sign(fleet_envelope(stranger)))
    client, _ = await client_for(aiohttp_client, owner, configmap=configmap)
    result = await filter_names(client, planned_pod(plans["whole"]), ["h100-8a"])
    assert result["FailedAndUnresolvableNodes"] == {
        "h100-8a": PROFILE_PREFIX + "bundle is signed by a key this cluster does not trust"
    }


# -- malformed input ----------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (b"[]", "the body is not an ExtenderArgs object"),
        (b'{"Nodes": null, "NodeNames": ["a"]}', "ExtenderArgs.Pod is missing"),
        (b'{"Pod": {}, "Nodes": null, "NodeNames": null}', "neither Nodes nor NodeNames"),
        (b'{"Pod": {}, "NodeNames": "a"}', "NodeNames is not a list"),
        (b'{"Pod": {}, "Nodes": {"items": [{}]}}', "has no metadata.name"),
        (b'{"Pod": {}, "Nodes": {"items": 3}}', "items is not a list"),
    ],
)
async def test_malformed_bodies_get_400_with_an_error(
    aiohttp_client: AiohttpClient, owner: Owner, verb: str, body: bytes, message: str
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    result = await post(client, verb, body, status=400)
    assert message in result["Error"]


async def test_oversized_body_is_413(aiohttp_client: AiohttpClient, owner: Owner) -> None:
    from extender.app import create_app

    app = create_app(owner.settings(), MemorySource(), max_body_bytes=1024)
    client = await aiohttp_client(app)
    resp = await client.post("/filter", data=b"{" + b" " * 4096 + b"}")
    assert resp.status == 413
    assert "larger than 1024 bytes" in (await resp.json())["Error"]


def nested(levels: int) -> Any:
    """A value `levels` lists deep: valid JSON that orjson reads (up to 1024) but will not write
    back beyond 254 levels."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("plan", ["whole", None])
async def test_full_node_filter_with_a_deeply_nested_node_answers_200_with_an_error(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any], plan: str | None
) -> None:
    # The Node that would be echoed back (it passes) carries the deep value, so the answer
    # itself cannot be encoded; the scheduler must get a readable Error, not aiohttp's bare 500.
    client, _ = await client_for(aiohttp_client, owner, nodes=[])
    nodes = [n.manifest() for n in FLEET]
    nodes[0]["metadata"]["labels"]["example.com/deep"] = nested(300)
    pod = planned_pod(plans[plan] if plan else None)
    result = await post(client, "filter", full_args(pod, nodes))
    assert set(result) == FILTER_KEYS
    assert result["Nodes"] is None and result["NodeNames"] is None
    assert result["Error"].startswith(
        "node h100-8a in ExtenderArgs.Nodes.items cannot be sent back: "
    )
    assert "no node was filtered" in result["Error"]
    # Scoring echoes no Node, so it answers the list as usual.
    scores = await post(client, "prioritize", full_args(pod, nodes))
    assert [entry["Host"] for entry in scores] == [n["metadata"]["name"] for n in nodes]


async def test_a_deeply_nested_node_the_rules_refuse_is_not_echoed_and_does_not_matter(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner, nodes=[])
    nodes = [n.manifest() for n in FLEET]
    l40s = next(n for n in nodes if n["metadata"]["name"] == "l40s")
    l40s["metadata"]["labels"]["example.com/deep"] = nested(300)
    result = await post(client, "filter", full_args(planned_pod(plans["whole"]), nodes))
    assert result["Error"] == ""
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == [
        "h100-8a",
        "h100-8b",
        "h100-2",
    ]
    assert "l40s" in result["FailedAndUnresolvableNodes"]


async def test_full_node_filter_with_deeply_nested_list_metadata_answers_200_with_an_error(
    aiohttp_client: AiohttpClient, owner: Owner
) -> None:
    client, _ = await client_for(aiohttp_client, owner, nodes=[])
    args = full_args(planned_pod(None), [n.manifest() for n in FLEET[:2]])
    args["Nodes"]["metadata"] = {"example": nested(300)}
    result = await post(client, "filter", args)
    assert result["Error"].startswith("ExtenderArgs.Nodes.metadata cannot be sent back: ")


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_an_unexpected_failure_is_a_200_with_an_error_and_a_logged_traceback(
    aiohttp_client: AiohttpClient,
    owner: Owner,
    plans: dict[str, Any],
    verb: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import extender.app

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(extender.app, f"{verb}_nodes", broken)
    client, _ = await client_for(aiohttp_client, owner)
    pod = planned_pod(plans["whole"])
    with caplog.at_level("INFO", "extender.app"):
        result = await post(client, verb, cache_args(pod, ALL))
    assert result["Error"] == "tmi extender internal error (see the extender's log)"
    [logged] = [r for r in caplog.records if r.name == "extender.app"]
    assert logged.levelname == "ERROR" and logged.exc_info is not None
    assert "RuntimeError: a bug" in (logged.exc_text or "")
    assert (logged.pod, logged.uid) == (pod["metadata"]["name"], pod["metadata"]["uid"])  # type: ignore[attr-defined]
    text = await (await client.get("/metrics")).text()
    assert f'tmi_extender_requests_total{{outcome="error",verb="{verb}"}} 1.0' in text


# -- caches, restart and health -----------------------------------------------------------------


async def test_accounting_is_rebuilt_from_the_pod_list_after_a_restart(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    pods = [bound(planned_pod(plans["whole"]), "h100-2") for _ in range(2)]
    pods.append(bound(planned_pod(plans["whole"]), "h100-8a", phase="Succeeded"))
    pods.append(planned_pod(plans["whole"]))  # not bound yet: holds nothing
    elsewhere = bound(planned_pod(plans["whole"], namespace="other"), "h100-8a")
    client, source = await client_for(aiohttp_client, owner, pods=[*pods, elsewhere])
    before = await filter_names(client, planned_pod(plans["whole"]), ["h100-2", "h100-8a"])
    assert before["NodeNames"] == ["h100-8a"]
    assert list(before["FailedNodes"]) == ["h100-2"]
    await client.close()
    # A new process lists the same Pods and reaches the same answer.
    restarted, _ = extender_app(owner, source=source)
    client2 = await aiohttp_client(restarted)
    after = await filter_names(client2, planned_pod(plans["whole"]), ["h100-2", "h100-8a"])
    assert after == before
    # Watch events keep it current: a deletion frees the GPU.
    source.delete_pod(f"{NAMESPACE}/{pods[0]['metadata']['name']}")
    freed = await filter_names(client2, planned_pod(plans["whole"]), ["h100-2"])
    assert freed["NodeNames"] == ["h100-2"]


async def test_pods_of_other_namespaces_count_when_configured(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    pods = [bound(planned_pod(plans["whole"], namespace="team-b"), "h100-2") for _ in range(2)]
    app, _ = extender_app(owner, FLEET, pods, pod_namespaces=["*"])
    client = await aiohttp_client(app)
    result = await filter_names(client, planned_pod(plans["whole"]), ["h100-2"])
    assert list(result["FailedNodes"]) == ["h100-2"]


async def test_node_events_update_the_cache(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, source = await client_for(aiohttp_client, owner)
    source.put_node(h100("h100-8a", compute_capability="7.0").manifest())
    result = await filter_names(client, planned_pod(plans["whole"]), ["h100-8a"])
    assert "compute capability 7.0" in result["FailedAndUnresolvableNodes"]["h100-8a"]
    source.delete_node("h100-8a")
    result = await filter_names(client, planned_pod(plans["whole"]), ["h100-8a"])
    assert "not in the extender's node cache" in result["FailedNodes"]["h100-8a"]


async def test_unsynced_caches_answer_error_for_planned_pods_only(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    source = MemorySource([n.manifest() for n in FLEET], [], published(owner.sign()))
    source.hold = {"pods"}
    app, _ = extender_app(owner, source=source)
    client = await aiohttp_client(app)
    ready = await client.get("/readyz")
    assert ready.status == 503
    assert "pods/kamiwaza" in (await ready.json())["detail"]
    result = await post(client, "filter", cache_args(planned_pod(plans["whole"]), ["h100-8a"]))
    assert result["Error"].startswith("the extender's caches have not synced yet (pods/kamiwaza)")
    assert result["NodeNames"] == []
    unplanned = await post(client, "filter", cache_args(planned_pod(None), ["h100-8a"]))
    assert unplanned["NodeNames"] == ["h100-8a"] and unplanned["Error"] == ""


async def test_health_ready_and_metrics(
    aiohttp_client: AiohttpClient, owner: Owner, plans: dict[str, Any]
) -> None:
    client, _ = await client_for(aiohttp_client, owner)
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    await filter_names(client, planned_pod(plans["whole"]), ALL)
    await post(client, "prioritize", cache_args(planned_pod(plans["whole"]), ALL))
    await post(client, "filter", b"nope", status=400)
    text = await (await client.get("/metrics")).text()
    assert 'tmi_extender_requests_total{outcome="planned",verb="filter"} 1.0' in text
    assert 'tmi_extender_requests_total{outcome="bad-request",verb="filter"} 1.0' in text
    assert 'tmi_extender_node_verdicts_total{code="fits"} 3.0' in text
    assert 'tmi_extender_node_verdicts_total{code="arch"} 1.0' in text
    # One filter call was read (the malformed one was not), naming every node in ALL.
    assert "tmi_extender_nodes_per_call_count 1.0" in text
    assert f"tmi_extender_nodes_per_call_sum {float(len(ALL))}" in text
    assert "tmi_extender_nodes 11.0" in text
    assert "tmi_extender_profile_valid 1.0" in text
    assert "tmi_extender_cache_synced 1.0" in text


@pytest.mark.parametrize("containers", ["engine", {"name": "engine"}, 7])
async def test_a_pod_whose_containers_are_not_a_list_is_answered_not_a_500(
    aiohttp_client: AiohttpClient, owner: Owner, containers: Any
) -> None:
    # pod_requests once iterated spec.containers blindly and raised TypeError, which /prioritize
    # turned into an HTTP 500. The Pod cannot be placed: every node fails with the reason, and
    # every node scores 0.
    client, _ = await client_for(aiohttp_client, owner)
    pod = planned_pod(plan_for(owner, fleet_envelope(owner), request()))
    pod["spec"]["containers"] = containers
    scores = await post(client, "prioritize", cache_args(pod, ALL))
    assert scores == [{"Host": n, "Score": 0} for n in ALL]
    result = await filter_names(client, pod, ALL)
    assert result["NodeNames"] == []
    reasons = set(result["FailedAndUnresolvableNodes"].values())
    assert reasons == {"the Pod's resource requests are unreadable: spec.containers is not a list"}
