"""The local control plane behaves like a cluster for what tmi relies on.

Real scheduling of GPU requests onto fake NVIDIA nodes, KWOK running bound pods,
kubelet-like readiness gates (the allocation controller's condition decides Ready),
one distinct RBAC identity per component, and extra schedulers with their own names.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from localcluster import ApiError, ControlPlane, FakeNode, Kube, pod_condition

pytestmark = pytest.mark.e2e

GATE = "kamiwaza.ai/AllocationVerified"


def _pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    containers = spec.pop("containers", [{"name": "main", "image": "registry.example/inference:1"}])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": containers, **spec},
    }


def _phase(pod: dict[str, Any]) -> str:
    return str(pod.get("status", {}).get("phase", ""))


def test_gpu_pod_is_scheduled_onto_the_gpu_node_and_runs(
    kube: Kube, namespace: str, fake_nodes: Callable[..., list[dict[str, object]]]
) -> None:
    suffix = uuid.uuid4().hex[:6]
    pool = {"tmi.test/pool": suffix}
    fake_nodes(
        FakeNode(f"cpu-{suffix}", gpus=0, vram_gb=None, labels=pool),
        FakeNode(f"h100-{suffix}", gpus=2, gpu_memory_mib=81559, vram_budget=True, labels=pool),
    )
    node = kube.get("v1", "Node", f"h100-{suffix}")
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["status"]["allocatable"]["kamiwaza.ai/vram-gb-gpu-1"] == "80"

    kube.create(
        _pod(
            "gpu",
            namespace,
            nodeSelector=pool,
            containers=[
                {
                    "name": "main",
                    "image": "registry.example/inference:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        )
    )
    pod = kube.wait_for("v1", "Pod", "gpu", namespace, lambda p: _phase(p) == "Running", timeout=60)
    assert pod["spec"]["nodeName"] == f"h100-{suffix}"
    assert pod_condition(pod, "PodScheduled") == "True"
    # No readiness gates: KWOK marks it Ready like a kubelet would.
    assert pod_condition(pod, "Ready") == "True"
    assert pod["status"].get("podIP")


def test_a_watch_with_a_field_selector_hears_a_pod_when_it_is_bound(
    kube: Kube, namespace: str, fake_nodes: Callable[..., list[dict[str, object]]]
) -> None:
    # What the scheduling benchmark waits on, and what the extender's Pod informer relies on:
    # the API server sends a Pod entering `spec.nodeName!=` as ADDED, and nothing before.
    suffix = uuid.uuid4().hex[:6]
    pool = {"tmi.test/pool": suffix}
    fake_nodes(FakeNode(f"cpu-{suffix}", gpus=0, vram_gb=None, labels=pool))
    path = f"/api/v1/namespaces/{namespace}/pods"
    version = kube.request("GET", path, query={"limit": 1})["metadata"]["resourceVersion"]
    kube.create(_pod("watched", namespace, nodeSelector=pool))
    query = {"fieldSelector": "spec.nodeName!=", "resourceVersion": version}
    for event in kube.watch(path, query, timeout=60):
        assert event["type"] == "ADDED"
        assert event["object"]["metadata"]["name"] == "watched"
        assert event["object"]["spec"]["nodeName"] == f"cpu-{suffix}"
        break
    else:
        raise AssertionError("the watch ended before the Pod was bound")


def test_readiness_gate_holds_ready_until_condition_is_true(
    kube: Kube, namespace: str, fake_nodes: Callable[..., list[dict[str, object]]]
) -> None:
    suffix = uuid.uuid4().hex[:6]
    fake_nodes(FakeNode(f"gated-{suffix}", gpus=1, labels={"tmi.test/pool": suffix}))
    kube.create(
        _pod(
            "gated",
            namespace,
            nodeSelector={"tmi.test/pool": suffix},
            readinessGates=[{"conditionType": GATE}],
        )
    )
    pod = kube.wait_for(
        "v1", "Pod", "gated", namespace, lambda p: _phase(p) == "Running", timeout=60
    )
    assert pod_condition(pod, "Ready") == "False"
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ReadinessGatesNotReady"
    assert pod_condition(pod, GATE) is None

    # Nothing but the gate may make it Ready: watch it stay not-Ready for a while.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert pod_condition(kube.get("v1", "Pod", "gated", namespace), "Ready") != "True"
        time.sleep(0.3)

    def set_gate(status: str) -> None:
        kube.patch_status(
            "v1",
            "Pod",
            "gated",
            namespace,
            {
                "status": {
                    "conditions": [
                        {
                            "type": GATE,
                            "status": status,
                            "reason": "Test",
                            "lastTransitionTime": time.strftime(
                                "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
                            ),
                        }
                    ]
                }
            },
        )

    set_gate("True")
    pod = kube.wait_for(
        "v1", "Pod", "gated", namespace, lambda p: pod_condition(p, "Ready") == "True", timeout=30
    )
    # The strategic-merge patch merged by type: KWOK's conditions and ours coexist.
    assert pod_condition(pod, GATE) == "True"
    assert pod_condition(pod, "ContainersReady") == "True"

    # And back: a gate turning False takes Ready away again, as with a kubelet.
    set_gate("False")
    kube.wait_for(
        "v1", "Pod", "gated", namespace, lambda p: pod_condition(p, "Ready") == "False", timeout=30
    )


def test_each_component_has_its_own_identity(control_plane: ControlPlane) -> None:
    expected = {
        "admin": ("admin", "system:masters"),
        "scheduler": ("system:kube-scheduler", None),
        "kwok": ("kwok", None),
        "tmi-webhook": ("tmi-webhook", None),
        "tmi-extender": ("tmi-extender", None),
        "tmi-controller": ("tmi-controller", None),
        "tmi-installer": ("tmi-installer", None),
    }
    for identity, (user, group) in expected.items():
        review = control_plane.kube(identity).request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        info = review["status"]["userInfo"]
        assert info["username"] == user, identity
        assert "system:authenticated" in info["groups"]
        if group:
            assert group in info["groups"]
        else:
            assert "system:masters" not in info["groups"]

    # RBAC is really enforced for everyone but admin.
    with pytest.raises(ApiError) as denied:
        control_plane.kube("tmi-installer").request("GET", "/api/v1/nodes")
    assert denied.value.status == 403


def test_second_scheduler_with_its_own_name_can_start_stop_and_restart(
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    fake_nodes: Callable[..., list[dict[str, object]]],
) -> None:
    suffix = uuid.uuid4().hex[:6]
    fake_nodes(FakeNode(f"second-{suffix}", gpus=1, labels={"tmi.test/pool": suffix}))
    name = f"tmi-second-{suffix}"
    config = {"profiles": [{"schedulerName": name}]}
    control_plane.start_scheduler(config, name=name)
    try:
        assert control_plane.schedulers[name].scheduler_names == [name]
        kube.create(
            _pod("by-second", namespace, schedulerName=name, nodeSelector={"tmi.test/pool": suffix})
        )
        kube.wait_for(
            "v1", "Pod", "by-second", namespace, lambda p: _phase(p) == "Running", timeout=60
        )

        control_plane.stop_scheduler(name)
        kube.create(
            _pod("waits", namespace, schedulerName=name, nodeSelector={"tmi.test/pool": suffix})
        )
        time.sleep(2)  # negative check: nothing schedules pods for a stopped scheduler
        assert not kube.get("v1", "Pod", "waits", namespace)["spec"].get("nodeName")

        control_plane.start_scheduler(config, name=name)
        kube.wait_for("v1", "Pod", "waits", namespace, lambda p: _phase(p) == "Running", timeout=60)
        control_plane.restart_scheduler(name)
        assert control_plane.schedulers[name].process.running()
    finally:
        control_plane.stop_scheduler(name)
