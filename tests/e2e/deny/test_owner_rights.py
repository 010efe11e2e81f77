"""An owner part that loses its rights in the tenant namespace fails closed there, and says so.

The whole stack runs behind the real API server (``localcluster.install.stack``), every server under
the ServiceAccount and Roles the chart gives it. The allocation controller's RoleBinding in the
tenant namespace is deleted (by the cluster admin here, the way around the owner's admission
policy that refuses it to the tenant's namespace admin). Then the controller can neither follow
the namespace's Pods nor write their verdicts, so a verdict it wrote before stands; what must
hold is that nothing new is placed on it and that the loss is visible: the controller's
``tmi_allocation_rights_missing`` gauge and its ``RightsMissing`` Event in the owner's namespace,
the extender's ``tmi_extender_controller_rights_confirmed`` gauge, and the new engine Pod,
created by the tenant's namespace admin, Pending with the extender's ``owner-rights`` reason
naming the RoleBinding. Restored, the same Pod is placed and verified.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from kits.stackkit import LARGE, pod_names, tenant_stack, whole_h100_envelope
from localcluster import ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod, metric
from localcluster.nodes.kwok import delete_fake_nodes
from tmi_cli.main import main

pytestmark = pytest.mark.e2e

BINDING = "tmi-allocation-controller"
RBAC = "rbac.authorization.k8s.io/v1"
PATIENCE = 60.0


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with tenant_stack(control_plane, "tmi-rights", whole_h100_envelope, 30) as up:
        yield up


@pytest.fixture
def node(control_plane: ControlPlane, stack: TenantStack) -> Iterator[str]:
    name = f"rights-h100-{uuid.uuid4().hex[:4]}"
    admin = control_plane.kube("admin")
    create_fake_nodes(admin, [FakeNode(name, gpus=2, vram_gb=80)])
    assert stack.extender is not None
    stack.extender.wait_nodes([name])
    try:
        yield name
    finally:
        delete_fake_nodes(admin, [name])


def scheduled_message(pod: dict[str, Any]) -> str:
    return str((condition(pod, "PodScheduled") or {}).get("message", ""))


def rights_events(
    admin: Kube, stack: TenantStack, reason: str, since: datetime
) -> list[dict[str, Any]]:
    """The controller's Events of `reason` about this stack's namespace, in the owner's."""
    listed = admin.request(
        "GET",
        f"/apis/events.k8s.io/v1/namespaces/{stack.settings.scheduler_namespace}/events",
        query={"fieldSelector": f"reason={reason}"},
    )
    return [
        e
        for e in listed["items"]
        if f"'{stack.settings.namespace}'" in e.get("note", "")
        and datetime.fromisoformat(e["eventTime"].replace("Z", "+00:00")) >= since
    ]


def confirmed(stack: TenantStack) -> float:
    assert stack.extender is not None
    return metric(
        stack.extender.metrics(),
        "tmi_extender_controller_rights_confirmed",
        namespace=stack.settings.namespace,
    )


def lacking(stack: TenantStack, index: int) -> float:
    """How many rights replica `index` of the controller says it lacks."""
    assert stack.controller is not None
    return metric(
        stack.controller.replicas[index].metrics(),
        "tmi_allocation_rights_missing",
        namespace=stack.settings.namespace,
    )


def doctor_says(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str], namespace: str
) -> dict[str, str]:
    """`tmi doctor`'s controller-rights check, as the owner."""
    argv = ["doctor", "--kubeconfig", str(plane.kubeconfig("admin")), "-o", "json"]
    main([*argv, "--namespace", namespace, "--no-cert-manager"])
    report = json.loads(capsys.readouterr().out)
    found: dict[str, str] = next(c for c in report["checks"] if c["check"] == "controller-rights")
    return found


def test_a_controller_without_its_binding_places_nothing_new_and_says_why(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    node: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    assert stack.owner is not None and stack.controller is not None
    binding = next(
        d
        for d in stack.owner.docs
        if d["kind"] == "RoleBinding"
        and d["metadata"]["name"] == BINDING
        and d["metadata"].get("namespace") == namespace
    )
    replicas = range(len(stack.controller.replicas))
    since = datetime.now(UTC).replace(microsecond=0)
    with pod_names(control_plane, stack) as name:
        # Before: an engine Pod is placed and verified, and each part has its rights confirmed.
        before = name("before")
        installer.create(engine_pod(namespace, LARGE, name=before))
        placed = kube.wait_for(
            "v1",
            "Pod",
            before,
            namespace,
            lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
            timeout=PATIENCE,
            what=f"Pod {before} verified",
        )
        assert placed["spec"]["nodeName"] == node
        assert confirmed(stack) == 1
        assert all(lacking(stack, i) == 0 for i in replicas)
        assert doctor_says(control_plane, capsys, namespace)["status"] == "pass"

        admin.delete(RBAC, "RoleBinding", BINDING, namespace)
        try:
            wait_until(
                lambda: confirmed(stack) == 0,
                timeout=PATIENCE,
                what="the extender to find the controller's rights gone",
            )
            # Each replica says which rights it lacks (all four), in its metric and its Event.
            wait_until(
                lambda: all(lacking(stack, i) == 4 for i in replicas),
                timeout=PATIENCE,
                what="each controller replica to report its rights missing",
            )
            missing = wait_until(
                lambda: rights_events(admin, stack, "RightsMissing", since) or None,
                timeout=PATIENCE,
                what="a RightsMissing Event in the owner's namespace",
            )
            event = missing[0]
            assert event["type"] == "Warning"
            assert event["regarding"]["kind"] == "Pod"
            assert event["regarding"]["name"] in {r.identity for r in stack.controller.replicas}
            assert f"RoleBinding {BINDING} in namespace '{namespace}'" in event["note"]

            # A new engine Pod of the tenant's namespace admin is placed nowhere, and says why.
            after = name("after")
            installer.create(engine_pod(namespace, LARGE, name=after))
            pod = kube.wait_for(
                "v1",
                "Pod",
                after,
                namespace,
                lambda p: "may not list pods" in scheduled_message(p),
                timeout=PATIENCE,
                what=f"Pod {after} to report the extender's owner-rights reason",
            )
            assert not pod["spec"].get("nodeName")
            message = scheduled_message(pod)
            assert f"Role and RoleBinding {BINDING} in namespace '{namespace}'" in message
            assert stack.extender is not None
            codes = metric(
                stack.extender.metrics(), "tmi_extender_node_verdicts_total", code="owner-rights"
            )
            assert codes >= 1
            # The owner's preflight finds the same, by the same rule.
            said = doctor_says(control_plane, capsys, namespace)
            assert said["status"] == "fail"
            assert said["fix"].startswith(f"restore Role and RoleBinding {BINDING}")
            # What the controller wrote before stands: it may no longer write anything.
            kept = kube.get("v1", "Pod", before, namespace)
            assert (condition(kept, CONDITION) or {}).get("status") == "True"
        finally:
            restored = copy.deepcopy(binding)
            restored["metadata"].pop("resourceVersion", None)
            admin.apply(restored)

        # Restored: both parts confirm it, and the same Pod is placed and verified.
        wait_until(
            lambda: confirmed(stack) == 1,
            timeout=PATIENCE,
            what="the extender to confirm the controller's rights again",
        )
        wait_until(
            lambda: all(lacking(stack, i) == 0 for i in replicas),
            timeout=PATIENCE,
            what="each controller replica to report its rights back",
        )
        wait_until(
            lambda: rights_events(admin, stack, "RightsRestored", since) or None,
            timeout=PATIENCE,
            what="a RightsRestored Event in the owner's namespace",
        )
        # The scheduler parked the Pod as unschedulable; any cluster event requeues it (a label
        # on the node here, as the next Pod or Node change would).
        admin.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            body={"metadata": {"labels": {"tmi.test/nudge": str(int(time.time()))}}},
            content_type="application/merge-patch+json",
        )
        verified = kube.wait_for(
            "v1",
            "Pod",
            after,
            namespace,
            lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
            timeout=PATIENCE,
            what=f"Pod {after} placed and verified once the binding is back",
        )
        assert verified["spec"]["nodeName"] == node
