"""The tenant's namespace admin writes junk where every owner part looks for profile revisions.

Following revisions, the extender, the allocation controller and the tenant's webhook read every
ConfigMap labelled `kamiwaza.ai/inference-profile=true` in the namespace, and the namespace
admin may write any. Here it writes ConfigMaps over the size cap, small junk, copies of the
owner's own profile past the count cap and one ConfigMap rewritten in a loop, all labelled
(`policy_io.caps`). The engine Pod verified before keeps its verdict, a new one is placed and
verified, each cap refusal is an Event on its ConfigMap and every refusal is counted, by the
controller and by the extender.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kits.profilekit import CLUSTER, Owner, with_profiles
from kits.stackkit import LARGE, dated, whole_h100_profile
from localcluster import ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.stack import (
    CONDITION,
    StackSettings,
    TenantStack,
    condition,
    deploy_stack,
    engine_pod,
)
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.plane.metrics import Sample, metric

pytestmark = pytest.mark.e2e

PROFILE = "kamiwaza-inference-profiles-r1"
LABELS = {"kamiwaza.ai/inference-profile": "true"}
LARGE_JUNK, SMALL_JUNK, COPIES, REWRITES = 6, 20, 34, 15
EVENT_REASON = "ProfileRevisionRefused"


@pytest.fixture
def setup(control_plane: ControlPlane) -> Iterator[TenantStack]:
    owner = Owner()
    namespace = f"tmi-junk-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        bundle_configmap=PROFILE,
        follow_revisions=True,
        scheduling_timeout_seconds=30,
    )
    admin = control_plane.kube("admin")
    node = f"junk-h100-{uuid.uuid4().hex[:4]}"
    envelope = dated(with_profiles(owner, whole_h100_profile()), namespace)
    with deploy_stack(control_plane, settings, owner.sign(envelope, name=PROFILE)) as stack:
        control_plane.grant_namespace_admin("tmi-installer", namespace)
        create_fake_nodes(
            admin, [FakeNode(node, gpu_product="NVIDIA-H100-80GB-HBM3", gpus=2, vram_gb=80)]
        )
        assert stack.extender is not None
        stack.extender.wait_nodes([node])
        try:
            yield stack
        finally:
            delete_fake_nodes(admin, [node])


def junk(namespace: str, name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS},
        "data": {"bundle.json": "j" * size, "bundle.sha256": "0" * 64},
    }


def verified(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    pod = kube.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
        timeout=90,
        what=f"Pod {name} verified",
    )
    found = condition(pod, CONDITION)
    assert found is not None
    return dict(found)


def refused(samples: list[Sample], reason: str) -> float:
    return metric(samples, "tmi_allocation_profile_revisions_refused_total", reason=reason)


def test_junk_labelled_configmaps_leave_verdicts_and_placements_as_they_were(
    control_plane: ControlPlane, setup: TenantStack
) -> None:
    stack = setup
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    before = f"before-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=before))
    first = verified(admin, namespace, before)

    # As the namespace's admin: over the size cap, small junk, copies of the owner's own
    # profile past the count cap, one rewritten in a loop.
    for index in range(LARGE_JUNK):
        installer.create(junk(namespace, f"junk-large-{index}", 900_000))
    for index in range(SMALL_JUNK):
        installer.create(junk(namespace, f"junk-small-{index}", 2_000))
    signed = stack.profile
    for index in range(COPIES):
        copy = {**signed, "metadata": {**signed["metadata"], "name": f"copy-{index:02d}"}}
        copy["metadata"].pop("resourceVersion", None)
        copy["metadata"].pop("uid", None)
        installer.create(copy)
    looped = junk(namespace, "junk-looped", 10)
    installer.create(looped)
    path = f"/api/v1/namespaces/{namespace}/configmaps/junk-looped"
    for index in range(REWRITES):
        installer.request(
            "PATCH",
            path,
            body={"data": {"bundle.json": str(index) * 5_000}},
            content_type="application/merge-patch+json",
        )

    # 32 verified kept (the owner's and 31 copies): the last three copies are past the cap.
    past_count = COPIES + 1 - 32
    assert stack.controller is not None and stack.extender is not None
    leader = stack.controller.replicas[stack.controller.leader_index()]

    def counted() -> bool:
        text = leader.metrics()
        return (
            refused(text, "too-large") >= LARGE_JUNK
            and refused(text, "too-many") >= past_count
            and refused(text, "unverified") >= SMALL_JUNK + 1 + REWRITES
        )

    wait_until(counted, timeout=60, what="the controller counts every junk revision")
    samples = stack.extender.metrics()
    assert (
        metric(samples, "tmi_extender_profile_revisions_refused_total", reason="too-large")
        == LARGE_JUNK
    )

    # The Pod verified before is as it was, and a new one is placed and verified.
    again = condition(admin.get("v1", "Pod", before, namespace), CONDITION)
    assert again is not None
    kept = ("status", "reason", "lastTransitionTime")
    assert {k: again[k] for k in kept} == {k: first[k] for k in kept}
    after = f"after-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=after))
    assert verified(admin, namespace, after)["reason"] == "Verified"
    assert admin.get("v1", "Pod", after, namespace)["spec"].get("nodeName")

    # Each cap refusal is an Event on its ConfigMap, naming the cap.
    def told() -> dict[str, str]:
        events = admin.request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
        return {
            e["regarding"]["name"]: e.get("note", "")
            for e in events.get("items", [])
            if e.get("reason") == EVENT_REASON
        }

    wait_until(lambda: "junk-large-0" in told(), timeout=30, what="an Event on junk-large-0")
    note = told()["junk-large-0"]
    assert "over the cap of 262144 bytes on a profile revision" in note
    assert "ConfigMap 'junk-large-0'" in note
