"""The kamiwaza.ai/AllocationVerified condition and the readiness gate, end to end.

The whole stack runs behind the real API server (``localcluster.install.stack``); the controller
runs as two replicas electing a leader through their Lease, as the owner's part ships it: in the
owner's namespace, under the Roles the chart binds to its ServiceAccount there. KWOK plays the
kubelet and its pod-ready stage honours readiness gates, so a Pod's Ready condition here is what a
kubelet would report: Running is not Ready until the controller has written the condition True.

What the tests prove is the seed's point that readiness alone is not proof of the grant: an
honest Pod is verified and only then Ready; a Pod whose records were changed after admission,
or that got in while admission was off, is reported False and stays (or becomes) not Ready; and
a controller that was down, or lost its leader, catches up on every Pod when it is back.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kits.profilekit import request
from kits.stackkit import (
    LARGE,
    WHOLE,
    h100_stack,
    pod_names,
)
from localcluster import ApiError, ControlPlane, Kube, pod_condition
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.servers.webhook import PLAN_ANNOTATION, REQUEST_ANNOTATION, set_opt_in

pytestmark = pytest.mark.e2e
VERDICT_REFUSALS = (
    "only the owner's allocation controller may write",
    "only the cluster's own components may change",
)

# A 72B GGUF at Q4 (47 GB): one whole H100.
ENGINE = LARGE
MERGE_PATCH = "application/merge-patch+json"
GATE_WAIT = 3.0


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(control_plane, "tmi-verify", 30) as up:
        yield up


@pytest.fixture
def installer(control_plane: ControlPlane, stack: TenantStack) -> Kube:
    return control_plane.kube("tmi-installer")


@pytest.fixture
def pods(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., str]]:
    """Names for the Pods a test creates; each is deleted after the test."""
    with pod_names(control_plane, stack) as make:
        yield make


def create(installer: Kube, stack: TenantStack, name: str, body: dict[str, Any] = ENGINE) -> None:
    installer.create(engine_pod(stack.settings.namespace, body, name=name))


def wait_pod(
    kube: Kube,
    stack: TenantStack,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 60,
) -> dict[str, Any]:
    return kube.wait_for(
        "v1", "Pod", name, stack.settings.namespace, predicate, timeout=timeout, what=what
    )


def verified(
    kube: Kube, stack: TenantStack, name: str, status: str = "True", ready: str | None = None
) -> dict[str, Any]:
    """The Pod once AllocationVerified reads ``status`` (and Ready reads ``ready``, if given)."""

    def done(pod: dict[str, Any]) -> bool:
        if (condition(pod, CONDITION) or {}).get("status") != status:
            return False
        return ready is None or pod_condition(pod, "Ready") == ready

    return wait_pod(
        kube, stack, name, done, f"Pod {name} AllocationVerified={status} Ready={ready}"
    )


def events_for(kube: Kube, stack: TenantStack, name: str) -> list[dict[str, Any]]:
    listed = kube.request(
        "GET", f"/apis/events.k8s.io/v1/namespaces/{stack.settings.namespace}/events"
    )
    return [e for e in listed["items"] if e.get("regarding", {}).get("name") == name]


def rewrite_request(installer: Kube, stack: TenantStack, name: str) -> None:
    """The namespace admin rewrites a running Pod's deployment request to one that would be
    planned onto two GPUs: its plan is then no signed revision's for its request."""
    forged = request("vllm", config__tensor_parallel_size=2)
    installer.request(
        "PATCH",
        f"/api/v1/namespaces/{stack.settings.namespace}/pods/{name}",
        body={"metadata": {"annotations": {REQUEST_ANNOTATION: json.dumps(forged)}}},
        content_type=MERGE_PATCH,
    )


def test_honest_pod_is_verified_then_ready(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    name = pods("honest")
    create(installer, stack, name)

    pod = verified(kube, stack, name, "True", ready="True")
    found = condition(pod, CONDITION)
    assert found is not None
    assert found["reason"] == "Verified"
    assert f"binding {WHOLE}: nvidia.com/gpu=1, RuntimeClass nvidia" in found["message"]
    assert f"on node {pod['spec']['nodeName']}" in found["message"]
    assert {"conditionType": CONDITION} in pod["spec"]["readinessGates"]
    notes = [(e["reason"], e["type"]) for e in events_for(kube, stack, name)]
    assert ("Verified", "Normal") in notes


def test_readiness_waits_for_the_condition_and_a_controller_restart_loses_nothing(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """With every controller replica down, a new Pod is placed and Running but not Ready, and
    nothing vouches for it; once the controller is back it is verified and becomes Ready, and a
    Pod verified before the outage keeps its condition untouched (no flap, same transition)."""
    controller = stack.controller
    assert controller is not None
    before = pods("before")
    create(installer, stack, before)
    kept = condition(verified(kube, stack, before, "True", ready="True"), CONDITION)

    controller.stop()
    try:
        during = pods("during")
        create(installer, stack, during)
        pod = wait_pod(
            kube,
            stack,
            during,
            lambda p: (
                p["status"].get("phase") == "Running"
                and pod_condition(p, "ContainersReady") == "True"
            ),
            f"Pod {during} Running with its containers ready",
        )
        # Bounded negative check: the gate holds Ready while nobody verifies the grant.
        deadline = time.monotonic() + GATE_WAIT
        while True:
            assert condition(pod, CONDITION) is None
            assert pod_condition(pod, "Ready") == "False"
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
            pod = kube.get("v1", "Pod", during, stack.settings.namespace)
    finally:
        controller.start()

    caught_up = condition(verified(kube, stack, during, "True", ready="True"), CONDITION)
    assert caught_up is not None and caught_up["reason"] == "Verified"
    assert condition(kube.get("v1", "Pod", before, stack.settings.namespace), CONDITION) == kept


def test_leader_failover_keeps_verifying(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """Two replicas, one Lease: with the leader stopped, the standby takes the Lease and
    verifies the Pods created meanwhile."""
    controller = stack.controller
    assert controller is not None
    leading = controller.leader_index()
    standby = 1 - leading
    assert not controller.is_leader(standby)

    controller.stop(leading)
    try:
        name = pods("failover")
        create(installer, stack, name)
        verified(kube, stack, name, "True", ready="True")
        assert controller.wait_leader() == controller.replicas[standby].identity
        assert controller.is_leader(standby)
    finally:
        controller.start(leading)
    assert controller.leader() == controller.replicas[standby].identity


def test_request_annotation_changed_after_admission_is_reported_false(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """Tampering by the namespace admin, through the one path admission leaves open.

    The webhook freezes the plan annotation and the planned image of an admitted Pod, and
    container resources are immutable, but annotations are otherwise the tenant's to edit. An
    admin who rewrites the deployment request of a running Pod (here: to a request that would be
    planned onto two GPUs) leaves a Pod whose plan no signed revision gives for its request. The
    controller re-checks on every change, reports PlanMismatch, and the readiness gate takes the
    Pod out of Ready.
    """
    name = pods("tampered")
    create(installer, stack, name)
    verified(kube, stack, name, "True", ready="True")
    path = f"/api/v1/namespaces/{stack.settings.namespace}/pods/{name}"

    # The plan itself cannot be edited: the webhook refuses the update.
    with pytest.raises(ApiError) as refused:
        installer.request(
            "PATCH",
            path,
            body={"metadata": {"annotations": {PLAN_ANNOTATION: "{}"}}},
            content_type=MERGE_PATCH,
        )
    assert refused.value.status == 403

    rewrite_request(installer, stack, name)

    pod = verified(kube, stack, name, "False", ready="False")
    found = condition(pod, CONDITION)
    assert found is not None
    assert found["reason"] == "PlanMismatch"
    assert "the plan annotation is not what profile revision" in found["message"]
    assert "plans for the Pod's deployment request" in found["message"]
    notes = [(e["reason"], e["type"]) for e in events_for(kube, stack, name)]
    assert ("PlanMismatch", "Warning") in notes


def test_pod_admitted_while_admission_was_off_is_reported_false(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    installer: Kube,
    pods: Callable[..., str],
) -> None:
    """A forged engine Pod that never went through the webhook.

    While the namespace is briefly not opted in (the owner's label removed, as during a
    misconfigured upgrade), a cluster admin creates an engine Pod copied from an honest, verified
    one (its plan and request annotations, image, RuntimeClass, readiness gate) but asking for
    two GPUs where the plan grants one, and placed directly with spec.nodeName, so neither the
    webhook nor the extender ever sees it. Once admission is back the webhook would refuse such
    a Pod; the one already in is caught by the controller, which re-checks every engine Pod
    against its plan: ResourcesMismatch, and the Pod runs but never becomes Ready.
    """
    namespace = stack.settings.namespace
    honest = pods("original")
    create(installer, stack, honest)
    original = verified(kube, stack, honest, "True", ready="True")

    forged_name = pods("forged")
    forged = copy.deepcopy(original)
    forged["metadata"] = {
        "name": forged_name,
        "namespace": namespace,
        "labels": original["metadata"]["labels"],
        "annotations": original["metadata"]["annotations"],
    }
    forged.pop("status")
    engine = forged["spec"]["containers"][0]
    engine["resources"] = {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}

    def planned_by_webhook() -> bool:
        try:
            kube.create(forged, dry_run=True)
        except ApiError as exc:
            return "admission webhook" in exc.message
        return False

    set_opt_in(control_plane, namespace, False)
    try:
        kube.wait_for(
            "v1",
            "Namespace",
            namespace,
            None,
            lambda _: not planned_by_webhook(),
            timeout=30,
            what="admission to stop reviewing the namespace",
        )
        kube.create(forged)
    finally:
        set_opt_in(control_plane, namespace, True)
    kube.wait_for(
        "v1",
        "Namespace",
        namespace,
        None,
        lambda _: planned_by_webhook(),
        timeout=30,
        what="admission to review the namespace again (and refuse the forged Pod)",
    )

    pod = verified(kube, stack, forged_name, "False")
    found = condition(pod, CONDITION)
    assert found is not None
    assert found["reason"] == "ResourcesMismatch"
    assert "requests[nvidia.com/gpu] is 2, the plan says 1" in found["message"]
    pod = wait_pod(
        kube,
        stack,
        forged_name,
        lambda p: (
            p["status"].get("phase") == "Running" and pod_condition(p, "ContainersReady") == "True"
        ),
        f"Pod {forged_name} Running",
    )
    assert pod_condition(pod, "Ready") == "False"
    # The honest original is untouched by its forged copy.
    again = condition(kube.get("v1", "Pod", honest, namespace), CONDITION)
    assert again is not None and again["status"] == "True"


# -- the verdict is the owner's ----------------------------------------------------------------


def test_the_tenant_can_neither_forge_nor_freeze_the_verdict(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    installer: Kube,
    pods: Callable[..., str],
) -> None:
    """The tenant's namespace admin holds pods/status patch and may act as any ServiceAccount of
    its namespace, so the controller and its Lease live in the owner's namespace, and the
    verdict policy lets only that controller change the condition. Acting as the tenant: a
    verified Pod's condition cannot be set False or a refused one's True; the Lease cannot be
    read or taken; a Lease of the same name in the tenant namespace freezes nothing, since a
    Pod tampered with afterwards is still reported False within seconds."""
    controller = stack.controller
    assert controller is not None
    namespace, owner_namespace = stack.settings.namespace, stack.settings.scheduler_namespace
    honest = pods("honest")
    create(installer, stack, honest)
    kept = condition(verified(kube, stack, honest, "True", ready="True"), CONDITION)

    forged = {"status": {"conditions": [{"type": CONDITION, "status": "False", "reason": "X"}]}}
    with pytest.raises(ApiError) as refused:
        installer.patch_status("v1", "Pod", honest, namespace, forged)
    assert refused.value.status == 403
    # Two owner policies refuse it, each naming the condition: the verdict policy and the
    # status allow-list (which of them the API server reports first is its own affair).
    assert CONDITION in refused.value.message
    assert any(text in refused.value.message for text in VERDICT_REFUSALS)
    assert condition(kube.get("v1", "Pod", honest, namespace), CONDITION) == kept

    # The Lease is out of reach, and a decoy in the tenant namespace is not the controller's.
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{owner_namespace}/leases"
    for method, path, body in (
        ("GET", f"{lease_path}/tmi-allocation-controller", None),
        ("PUT", f"{lease_path}/tmi-allocation-controller", controller.lease()),
        ("DELETE", f"{lease_path}/tmi-allocation-controller", None),
    ):
        with pytest.raises(ApiError) as denied:
            installer.request(method, path, body=body)
        assert denied.value.status == 403, (method, path)
    decoy = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "tmi-allocation-controller", "namespace": namespace},
        "spec": {"holderIdentity": "tenant", "leaseDurationSeconds": 3600},
    }
    installer.create(decoy)
    try:
        tampered = pods("tampered")
        create(installer, stack, tampered)
        verified(kube, stack, tampered, "True", ready="True")
        rewrite_request(installer, stack, tampered)
        refused_pod = verified(kube, stack, tampered, "False", ready="False")
        # Nor may the tenant put it back.
        back = {"status": {"conditions": [{"type": CONDITION, "status": "True"}]}}
        with pytest.raises(ApiError) as again:
            installer.patch_status("v1", "Pod", tampered, namespace, back)
        assert again.value.status == 403
        assert condition(kube.get("v1", "Pod", tampered, namespace), CONDITION) == condition(
            refused_pod, CONDITION
        )
    finally:
        kube.delete("coordination.k8s.io/v1", "Lease", "tmi-allocation-controller", namespace)
