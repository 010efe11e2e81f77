"""The owner's quota per tenant (`inference_policy.placing.quota`): read from its ResourceQuota,
what a Pod holds against it, and the one decision the webhook and the extender both take."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from inference_policy.admission.engine_pod import planned_pod
from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION
from inference_policy.placing.quota import (
    QUOTA_ANNOTATION,
    QUOTA_NAME,
    Quota,
    QuotaError,
    TenantUsage,
    Usage,
    check,
    headroom,
    parse_quota,
    plan_usage,
    pod_usage,
    refusal_body,
)
from inference_policy.planning.plan import Plan
from kits.profilekit import NAMESPACE, NOW, Owner, gpu_binding, gpu_profile, request, with_profiles

WHOLE = "nvidia-whole-amd64"
SHARE = "nvidia-vram-l40s-amd64"
VRAM = "kamiwaza.ai/vram-gb-gpu-0"


def _quota_object(hard: dict[str, str], annotation: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": QUOTA_NAME, "namespace": NAMESPACE}
    if annotation is not None:
        meta["annotations"] = {QUOTA_ANNOTATION: json.dumps(annotation)}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta, "spec": {"hard": hard}}


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    owner = Owner()
    envelope = with_profiles(
        owner,
        gpu_profile("nvidia-whole", "whole-device", [gpu_binding(WHOLE, memory="79Gi")]),
        gpu_profile(
            "nvidia-vram-share",
            "accounted-share",
            [gpu_binding(SHARE, allocator="vram-plugin", resource=VRAM, cc="8.9", cuda=12)],
        ),
    )
    state = owner.state(envelope)
    share = request(
        inferenceResources={
            "schemaVersion": 1,
            "accelerator": {
                "capability": "gpu",
                "count": 1,
                "memory": {"minimum": "8Gi"},
                "isolation": "any-qualified",
                "profile": "nvidia-vram-share",
            },
            "runtime": {"selection": "automatic"},
        }
    )
    out: dict[str, Plan] = {}
    for name, document in (
        ("whole", request()),
        ("share", share),
        ("cpu", request(config__force_cpu=True)),
    ):
        plan = state.decide(document, NOW).plan
        assert plan is not None, name
        out[name] = plan
    return out


def _pod(plan: Plan, name: str = "engine-0") -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {ENGINE_LABEL: "d"}},
        "spec": {"containers": [{"name": "engine", "image": "placeholder.invalid/e:1"}]},
    }
    return planned_pod(pod, 0, plan, plan.text(), scheduler_name="s", pull_secret=None)


# -- the quota object ------------------------------------------------------------------------


def test_the_quota_is_the_native_device_counts_and_the_annotations_limits() -> None:
    obj = _quota_object(
        {"requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-3g.40gb": "2", "pods": "10"},
        {"schemaVersion": 1, "bindings": {WHOLE: 2}, "accountedVramGB": 80, "enginePods": 3},
    )
    quota = parse_quota(obj)
    assert quota == Quota(
        QUOTA_NAME,
        {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.40gb": 2},
        {WHOLE: 2},
        80,
        3,
    )
    # Without the annotation: the device counts alone; nothing set is no limit.
    assert parse_quota(_quota_object({"requests.nvidia.com/gpu": "1"}, None)) == Quota(
        QUOTA_NAME, {"nvidia.com/gpu": 1}
    )
    assert parse_quota(_quota_object({}, {})).empty


@pytest.mark.parametrize(
    ("hard", "annotation", "named"),
    [
        ({}, {"enginePods": 2, "borrow": True}, "unknown keys: borrow"),
        ({}, {"enginePods": -1}, "enginePods"),
        ({}, {"bindings": {WHOLE: "2"}}, f"bindings[{WHOLE}]"),
        ({}, {"schemaVersion": 2}, "schemaVersion"),
        ({"requests.nvidia.com/gpu": "lots"}, None, "requests.nvidia.com/gpu"),
    ],
)
def test_an_unreadable_quota_is_refused_naming_what(
    hard: dict[str, str], annotation: dict[str, Any] | None, named: str
) -> None:
    with pytest.raises(QuotaError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_quota(_quota_object(hard, annotation))


def test_an_annotation_that_is_not_json_is_refused() -> None:
    obj = _quota_object({}, None)
    obj["metadata"]["annotations"] = {QUOTA_ANNOTATION: "{enginePods: 2"}
    with pytest.raises(QuotaError, match=QUOTA_ANNOTATION):
        parse_quota(obj)


# -- what a Pod holds -----------------------------------------------------------------------


def test_a_pod_holds_its_requests_its_bindings_devices_and_one_engine_pod(
    plans: dict[str, Plan],
) -> None:
    whole = pod_usage(_pod(plans["whole"]))
    assert whole == Usage({"nvidia.com/gpu": 1}, {WHOLE: 1}, 0, 1)
    assert plan_usage(plans["whole"]) == whole
    share = pod_usage(_pod(plans["share"]))
    (granted,) = share.devices.values()
    assert share.devices == {VRAM: granted} and share.vram_gb == granted > 0
    assert share.bindings == {SHARE: 1} and share.engine_pods == 1
    assert plan_usage(plans["share"]) == share
    # A CPU engine Pod holds no device, but it is an engine Pod.
    assert pod_usage(_pod(plans["cpu"])) == Usage({}, {}, 0, 1) == plan_usage(plans["cpu"])


def test_a_pod_whose_engine_label_was_removed_still_holds_its_plan(plans: dict[str, Plan]) -> None:
    pod = _pod(plans["whole"])
    del pod["metadata"]["labels"][ENGINE_LABEL]
    assert pod_usage(pod) == Usage({"nvidia.com/gpu": 1}, {WHOLE: 1}, 0, 1)


def test_a_plain_pod_or_an_unreadable_plan_holds_only_what_it_asks() -> None:
    plain: dict[str, Any] = {"metadata": {"name": "app"}, "spec": {"containers": [{"name": "app"}]}}
    assert pod_usage(plain).empty
    odd = copy.deepcopy(plain)
    odd["metadata"]["annotations"] = {PLAN_ANNOTATION: "{not json"}
    odd["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert pod_usage(odd) == Usage({"nvidia.com/gpu": 1}, {}, 0, 1)


def test_the_namespace_totals_follow_each_pod() -> None:
    usage = TenantUsage()
    usage.put("a", Usage({"nvidia.com/gpu": 1}, {WHOLE: 1}, 0, 1))
    usage.put("b", Usage({VRAM: 20}, {SHARE: 1}, 20, 1))
    usage.put("b", Usage({VRAM: 24}, {SHARE: 1}, 24, 1))
    assert usage.total() == Usage({"nvidia.com/gpu": 1, VRAM: 24}, {WHOLE: 1, SHARE: 1}, 24, 2)
    usage.put("a", None)
    assert usage.total() == Usage({VRAM: 24}, {SHARE: 1}, 24, 1) and len(usage) == 1
    usage.replace([("c", Usage({}, {}, 0, 1))])
    assert usage.total() == Usage({}, {}, 0, 1) and usage.keys() == {"c"}


# -- the decision ------------------------------------------------------------------------------


def test_one_more_pod_fits_up_to_each_limit_and_is_refused_past_it() -> None:
    quota = Quota(QUOTA_NAME, {"nvidia.com/gpu": 2}, {WHOLE: 2}, 48, 3)
    one = Usage({"nvidia.com/gpu": 1}, {WHOLE: 1}, 0, 1)
    assert check(quota, NAMESPACE, one, one) is None
    two = Usage({"nvidia.com/gpu": 2}, {WHOLE: 2}, 0, 2)
    refusal = check(quota, NAMESPACE, two, one)
    assert refusal is not None
    assert [e.item for e in refusal.excess] == [
        "nvidia.com/gpu devices",
        f"binding {WHOLE} devices",
    ]
    message = refusal.message()
    assert message.startswith("tenant-mode inference (quota-exceeded): ")
    assert f"namespace {NAMESPACE} would pass the owner's quota {QUOTA_NAME}" in message
    assert "nvidia.com/gpu devices: limit 2, held now 2, this Pod asks 1" in message
    assert refusal_body(refusal) == {"status": 403, "detail": message, "code": "quota-exceeded"}
    # Accounted VRAM sums over every GPU's name; engine Pods count CPU engines too.
    shares = Usage({VRAM: 24, "kamiwaza.ai/vram-gb-gpu-1": 20}, {}, 44, 2)
    refusal = check(quota, NAMESPACE, shares, Usage({VRAM: 8}, {SHARE: 1}, 8, 1))
    assert refusal is not None and [e.item for e in refusal.excess] == ["accountedVramGB"]
    cpu = Usage({}, {}, 0, 1)
    refusal = check(quota, NAMESPACE, Usage({}, {}, 0, 3), cpu)
    assert refusal is not None and refusal.excess[0].describe() == (
        "enginePods: limit 3, held now 3, this Pod asks 1"
    )


def test_a_limit_the_pod_does_not_ask_for_never_refuses_it() -> None:
    """A lowered quota holds new Pods of what it limits back, not every Pod."""
    quota = Quota(QUOTA_NAME, {"nvidia.com/gpu": 1}, accounted_vram_gb=0)
    past = Usage({"nvidia.com/gpu": 3}, {WHOLE: 3}, 0, 3)
    assert check(quota, NAMESPACE, past, Usage({}, {}, 0, 1)) is None
    refusal = check(quota, NAMESPACE, Usage(), Usage({VRAM: 8}, {SHARE: 1}, 8, 1))
    assert refusal is not None and refusal.excess[0].describe() == (
        "accountedVramGB: limit 0, held now 0, this Pod asks 8"
    )


def test_no_quota_refuses_nothing() -> None:
    everything = Usage({"nvidia.com/gpu": 64}, {WHOLE: 64}, 1000, 100)
    assert check(None, NAMESPACE, everything, everything) is None
    assert check(Quota(QUOTA_NAME), NAMESPACE, everything, everything) is None


def test_headroom_is_each_limit_less_what_is_held() -> None:
    quota = Quota(QUOTA_NAME, {"nvidia.com/gpu": 4}, {WHOLE: 2}, 48, 3)
    held = Usage({"nvidia.com/gpu": 3}, {WHOLE: 3}, 20, 3)
    assert [h.to_json() for h in headroom(quota, held)] == [
        {"item": "nvidia.com/gpu devices", "limit": 4, "held": 3, "left": 1},
        {"item": f"binding {WHOLE} devices", "limit": 2, "held": 3, "left": 0},
        {"item": "accountedVramGB", "limit": 48, "held": 20, "left": 28},
        {"item": "enginePods", "limit": 3, "held": 3, "left": 0},
    ]
