"""The AllocationVerified verdict (inference_policy.granting.grant), one test per reason and per
policy.

Pods are built the way the admission webhook leaves them: the core's plan applied to a plain
engine Pod (image, resources, RuntimeClass, architecture selector, readiness gate, the plan
annotation), then bound. Covered: the honest GPU and CPU Pods; each way a Pod can drift from its
plan (image, resources in the engine and in other containers, device environment, RuntimeClass,
selector); plans the core would not give (forged plan, edited request); unknown, refused and
expired revisions, with the rule that a Pod already verified stays verified when only its
authorization lapses; a later revision leaving a running Pod alone; the scheduling deadline.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest

from inference_policy.admission.engine_pod import planned_pod
from inference_policy.base import codes
from inference_policy.base.quantity import same_quantity
from inference_policy.granting import grant, stored_pod
from inference_policy.granting.grant import CONDITION_TYPE, Lapse, check_grant, evaluate
from inference_policy.planning.plan import PlanResources
from inference_policy.planning.planner import Decision, PlanContext
from inference_policy.trust.signing import ProfileRefused, Reason, VerifiedProfile
from kits.profilekit import NOW, Owner, request
from policy_io.snapshot import PolicySnapshot

EXPIRES = NOW.replace(year=2027, month=11, day=1, hour=0)


@pytest.fixture(scope="module")
def owner() -> Owner:
    return Owner()


@pytest.fixture(scope="module")
def state(owner: Owner) -> PolicySnapshot:
    return owner.state()


@pytest.fixture(scope="module")
def profile(state: PolicySnapshot) -> VerifiedProfile:
    assert state.profile is not None
    return state.profile


@pytest.fixture(scope="module")
def ctx(state: PolicySnapshot) -> PlanContext:
    return state.context(NOW)


def compact(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"))


def apply_plan(pod: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """What the webhook does to an engine Pod: the core's own rewrite, so these tests also prove
    that a Pod the webhook admits is one the controller verifies."""
    assert decision.plan is not None
    return planned_pod(
        copy.deepcopy(pod),
        0,
        decision.plan,
        decision.plan.text(),
        scheduler_name="kamiwaza-inference-scheduler",
        pull_secret=None,
    )


def engine_pod(document: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "tmi-3f2a9c",
            "namespace": "kamiwaza",
            "uid": "6a1f0000-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "labels": {"kamiwaza.ai/deployment-id": "631e7142"},
            "annotations": {"kamiwaza.ai/deployment-request": compact(document)},
        },
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "placeholder.invalid/engine:latest",
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                },
                {"name": "metrics", "image": "registry.invalid/exporter:1"},
            ]
        },
        "status": {"phase": "Pending", "conditions": []},
    }


def bind(pod: dict[str, Any], node: str = "gpu-node-1") -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    pod["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-29T12:00:01Z"}
    )
    return pod


def planned(state: PolicySnapshot, document: dict[str, Any] | None = None) -> dict[str, Any]:
    document = document if document is not None else request()
    decision = state.decide(document, NOW)
    assert decision.allowed, decision.body
    return bind(apply_plan(engine_pod(document), decision))


def mark_verified(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["status"]["conditions"].append(
        {"type": CONDITION_TYPE, "status": "True", "reason": "Verified", "message": "ok"}
    )
    return pod


def engine(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


# -- honest Pods ---------------------------------------------------------------------------------


def test_honest_gpu_pod_is_verified(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("True", "Verified")
    assert "nvidia.com/mig-3g.40gb=1" in verdict.message
    assert "gpu-node-1" in verdict.message
    assert profile.sha256[:12] in verdict.message


def test_honest_cpu_pod_is_verified(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state, request(config__force_cpu=True))
    assert "runtimeClassName" not in pod["spec"]
    assert "limits" not in engine(pod)["resources"]
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("True", "Verified")


def test_quantities_compare_by_value_not_spelling(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state, request(config__force_cpu=True))
    requests = engine(pod)["resources"]["requests"]
    requests["cpu"] = "0.1"
    requests["memory"] = str(6 * 1024**3)
    assert check_grant(pod, profile, ctx, NOW).reason == "Verified"


def test_verified_later_within_the_window(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    assert check_grant(pod, profile, ctx, NOW + timedelta(days=200)).reason == "Verified"


# -- the Pod against its plan --------------------------------------------------------------------


def test_image_mismatch(state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext) -> None:
    pod = planned(state)
    engine(pod)["image"] = "registry.invalid/other@sha256:" + "0" * 64
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "ImageMismatch")
    assert "registry.invalid/other" in verdict.message


def test_engine_container_annotation_pointing_elsewhere(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    pod["metadata"]["annotations"]["kamiwaza.ai/engine-container"] = "metrics"
    verdict = check_grant(pod, profile, ctx, NOW)
    assert verdict.reason == "ImageMismatch"
    # The real engine container now counts as another container holding an accelerator.
    assert (
        "spec.containers[engine].resources.limits[nvidia.com/mig-3g.40gb] asks for an accelerator"
        in verdict.message
    )


def test_resources_mismatch_in_the_engine_container(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    engine(pod)["resources"]["limits"]["nvidia.com/mig-3g.40gb"] = "2"
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "ResourcesMismatch")
    assert "limits[nvidia.com/mig-3g.40gb] is 2, the plan says 1" in verdict.message


def test_resources_mismatch_extra_accelerator_in_engine(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    engine(pod)["resources"]["limits"]["nvidia.com/gpu"] = "1"
    verdict = check_grant(pod, profile, ctx, NOW)
    assert verdict.reason == "ResourcesMismatch"
    assert "nvidia.com/gpu" in verdict.message


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("containers", "nvidia.com/gpu"),
        ("initContainers", "amd.com/gpu"),
        ("containers", "kamiwaza.ai/vram-gb-h200"),
    ],
)
def test_resources_mismatch_other_container_asks_for_accelerator(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext, kind: str, key: str
) -> None:
    pod = planned(state)
    sidecar = {"name": "sneaky", "image": "x", "resources": {"limits": {key: "1"}}}
    pod["spec"].setdefault(kind, []).append(sidecar)
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "ResourcesMismatch")
    assert f"spec.{kind}[sneaky].resources.limits[{key}] asks for an accelerator" in verdict.message


def test_cpu_plan_with_limits_is_a_resources_mismatch(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state, request(config__force_cpu=True))
    engine(pod)["resources"]["limits"] = {"memory": "6Gi"}
    verdict = check_grant(pod, profile, ctx, NOW)
    assert verdict.reason == "ResourcesMismatch"
    assert "limits[memory] is 6Gi, the plan says absent" in verdict.message


def test_cpu_request_below_plan_is_a_resources_mismatch(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state, request(config__force_cpu=True))
    engine(pod)["resources"]["requests"]["memory"] = "1Gi"
    assert check_grant(pod, profile, ctx, NOW).reason == "ResourcesMismatch"


def test_device_environment_is_unplanned_access(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    pod["spec"]["containers"][1]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "UnplannedDeviceAccess")


def test_runtime_class_mismatch(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    pod["spec"]["runtimeClassName"] = "runc-privileged"
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "RuntimeClassMismatch")
    cpu = planned(state, request(config__force_cpu=True))
    cpu["spec"]["runtimeClassName"] = "nvidia"
    # A CPU plan grants no device, so the core's gate refuses the reach before the comparison.
    refused = check_grant(cpu, profile, ctx, NOW)
    assert (refused.status, refused.reason) == ("False", "UnplannedDeviceAccess")
    assert "spec.runtimeClassName (nvidia)" in refused.message


def test_node_selector_mismatch(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/arch": "arm64", "team": "a"}
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "NodeSelectorMismatch")
    assert "arm64" in verdict.message


def test_several_findings_report_the_first_reason_and_list_all(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    pod["spec"]["runtimeClassName"] = "other"
    engine(pod)["image"] = "registry.invalid/x@sha256:" + "1" * 64
    verdict = check_grant(pod, profile, ctx, NOW)
    assert verdict.reason == "ImageMismatch"
    assert "runtimeClassName is other" in verdict.message


# -- the plan itself -----------------------------------------------------------------------------


def test_plan_missing(state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext) -> None:
    pod = planned(state)
    del pod["metadata"]["annotations"]["kamiwaza.ai/plan"]
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "PlanMissing")
    pod["metadata"]["annotations"]["kamiwaza.ai/plan"] = "{not json"
    assert check_grant(pod, profile, ctx, NOW).reason == "PlanMissing"


def test_forged_plan_that_the_pod_follows_is_a_plan_mismatch(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    document = request()
    plan = state.decide(document, NOW).plan
    assert plan is not None
    forged = plan.model_copy(
        update={
            "resources": PlanResources(
                requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "1"}
            ),
            "bindingId": "nvidia-whole-amd64",
        }
    )
    pod = bind(apply_plan(engine_pod(document), Decision.planned(forged)))
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "PlanMismatch")
    assert "bindingId: annotation nvidia-whole-amd64, core nvidia-mig-3g40gb-amd64" in (
        verdict.message
    )


def test_edited_request_annotation_is_a_plan_mismatch(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    pod["metadata"]["annotations"]["kamiwaza.ai/deployment-request"] = compact(request("mlx"))
    verdict = check_grant(pod, profile, ctx, NOW)
    assert verdict.reason == "PlanMismatch"
    assert "engine 'mlx' is not qualified" in verdict.message
    del pod["metadata"]["annotations"]["kamiwaza.ai/deployment-request"]
    assert check_grant(pod, profile, ctx, NOW).reason == "PlanMismatch"


def test_plan_naming_another_revision_than_the_one_given(
    state: PolicySnapshot, owner: Owner, ctx: PlanContext
) -> None:
    other = owner.state(owner.envelope(version=2))
    assert other.profile is not None
    verdict = check_grant(planned(state), other.profile, ctx, NOW)
    assert verdict.reason == "PlanMismatch"


# -- the revision --------------------------------------------------------------------------------


def test_unknown_revision(
    state: PolicySnapshot, ctx: PlanContext, profile: VerifiedProfile
) -> None:
    pod = planned(state)
    verdict = check_grant(pod, None, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "ProfileRevisionUnknown")
    assert profile.sha256 in verdict.message


def test_refused_revision(state: PolicySnapshot, ctx: PlanContext) -> None:
    refusal = ProfileRefused(Reason.KEY, "signed by sha256:abc; trusted: sha256:def")
    lapse = grant.refused_lapse("kamiwaza-inference-profiles-r1", refusal)
    verdict = check_grant(planned(state), None, ctx, NOW, lapse=lapse)
    assert (verdict.status, verdict.reason) == ("False", "ProfileRefused")
    assert "signed by a key this cluster does not trust" in verdict.message


def test_expired_revision_refuses_a_pod_not_yet_verified(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    verdict = check_grant(pod, profile, ctx, EXPIRES + timedelta(seconds=1))
    assert (verdict.status, verdict.reason) == ("False", "ProfileExpired")
    assert "expired at 2027-11-01T00:00:00Z" in verdict.message


def test_expired_revision_keeps_a_verified_pod_verified_and_says_so(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = mark_verified(planned(state))
    verdict = check_grant(pod, profile, ctx, EXPIRES + timedelta(days=3))
    assert (verdict.status, verdict.reason) == ("True", "VerifiedProfileExpired")
    assert "publish a new profile revision and redeploy" in verdict.message


def test_lapsed_authorization_never_excuses_a_changed_pod(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = mark_verified(planned(state))
    engine(pod)["image"] = "registry.invalid/x@sha256:" + "2" * 64
    verdict = check_grant(pod, profile, ctx, EXPIRES + timedelta(days=3))
    assert (verdict.status, verdict.reason) == ("False", "ImageMismatch")
    assert check_grant(pod, None, ctx, NOW).reason == "ImageMismatch"


def test_removed_revision_keeps_a_verified_pod_verified(
    state: PolicySnapshot, ctx: PlanContext
) -> None:
    pod = mark_verified(planned(state))
    verdict = check_grant(pod, None, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("True", "VerifiedRevisionUnavailable")


def test_a_later_revision_does_not_disturb_a_running_pod(
    state: PolicySnapshot, owner: Owner, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    envelope = owner.envelope(version=2)
    envelope["profiles"] = [p for p in envelope["profiles"] if p["capability"] == "cpu"]
    later = owner.state(envelope).profile
    assert later is not None and later.sha256 != profile.sha256
    revisions: dict[str, VerifiedProfile | Lapse] = {
        profile.sha256: profile,
        later.sha256: later,
    }
    result = evaluate(pod, revisions, ctx, NOW + timedelta(days=1))
    assert result.verdict is not None
    assert result.verdict.reason == "Verified"
    assert result.recheck_after == pytest.approx(
        (EXPIRES - NOW - timedelta(days=1)).total_seconds()
    )


def test_evaluate_passes_a_refused_revision_on(
    state: PolicySnapshot, ctx: PlanContext, profile: VerifiedProfile
) -> None:
    refusal = ProfileRefused(Reason.TARGET, "version 1 is below the floor 2")
    revisions: dict[str, VerifiedProfile | Lapse] = {
        profile.sha256: grant.refused_lapse("r1", refusal)
    }
    result = evaluate(planned(state), revisions, ctx, NOW)
    assert result.verdict is not None and result.verdict.reason == "ProfileRefused"
    assert result.recheck_after is None


# -- scheduling ----------------------------------------------------------------------------------


def unbound(state: PolicySnapshot) -> dict[str, Any]:
    document = request()
    return apply_plan(engine_pod(document), state.decide(document, NOW))


def test_unbound_pod_waits_for_the_deadline(state: PolicySnapshot, ctx: PlanContext) -> None:
    result = evaluate(unbound(state), {}, ctx, NOW + timedelta(seconds=100), scheduling_timeout=300)
    assert result.verdict is None
    assert result.recheck_after == pytest.approx(200)


def test_scheduling_timeout_carries_the_scheduler_message(
    state: PolicySnapshot, ctx: PlanContext
) -> None:
    pod = unbound(state)
    said = "0/3 nodes are available: 3 Insufficient nvidia.com/mig-3g.40gb."
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
    ]
    result = evaluate(pod, {}, ctx, NOW + timedelta(seconds=301), scheduling_timeout=300)
    assert result.verdict is not None
    assert (result.verdict.status, result.verdict.reason) == ("False", "SchedulingTimeout")
    assert said in result.verdict.message
    assert "within 300s" in result.verdict.message


def test_scheduling_timeout_without_a_scheduler_message(
    state: PolicySnapshot, ctx: PlanContext
) -> None:
    result = evaluate(unbound(state), {}, ctx, NOW + timedelta(hours=1))
    assert result.verdict is not None
    assert result.verdict.reason == "SchedulingTimeout"
    assert "has not reported" in result.verdict.message


# -- small parts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right", "same"),
    [
        ("1", "1000m", True),
        ("1Gi", "1024Mi", True),
        ("6Gi", str(6 * 1024**3), True),
        ("1e3", "1k", True),
        ("0.5", "500m", True),
        ("1", "2", False),
        ("1G", "1Gi", False),
    ],
)
def test_quantity_values(left: str, right: str, same: bool) -> None:
    assert same_quantity(left, right) is same


def test_plan_revision_and_times(state: PolicySnapshot, profile: VerifiedProfile) -> None:
    pod = planned(state)
    assert grant.plan_revision(pod) == profile.sha256
    assert grant.plan_revision(engine_pod(request())) is None
    assert stored_pod.parse_time("2026-11-29T12:00:00.123456Z") is not None
    assert stored_pod.parse_time("2026-11-29T12:00:00+01:00") is None


def test_departed_verdict() -> None:
    verdict = grant.departed_verdict()
    assert (verdict.status, verdict.reason) == ("False", "EngineLabelRemoved")
    assert "kamiwaza.ai/deployment-id" in verdict.message
    assert set(codes.ALLOCATION_REASONS) >= {
        "Verified",
        "ImageMismatch",
        "ResourcesMismatch",
        "RuntimeClassMismatch",
        "NodeSelectorMismatch",
        "PlanMismatch",
        "ProfileRevisionUnknown",
        "PlanMissing",
        "SchedulingTimeout",
    }


def test_an_unshielded_sidecar_is_unplanned_device_access(
    state: PolicySnapshot, profile: VerifiedProfile, ctx: PlanContext
) -> None:
    pod = planned(state)
    metrics = pod["spec"]["containers"][1]
    assert metrics["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    del metrics["env"]
    verdict = check_grant(pod, profile, ctx, NOW)
    assert (verdict.status, verdict.reason) == ("False", "UnplannedDeviceAccess")
    assert "spec.containers[metrics] does not set NVIDIA_VISIBLE_DEVICES=void" in verdict.message
