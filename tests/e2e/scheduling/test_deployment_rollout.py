"""A tenant's engine Deployment, rolled out and rolled to a new request, through every stage.

The installer a tenant uses creates Deployments, not bare Pods, so this module runs the path a
real cluster takes: kube-controller-manager's Deployment and ReplicaSet controllers create the
Pods, the API server sends each to the webhook (which plans it, from a Pod with no name yet),
the owner's scheduler places it with the extender, the controller verifies it, and KWOK's
readiness (which honours the AllocationVerified readiness gate) is what lets the rollout go on.

The node has four whole H100s for three one-GPU replicas, and the rolling update surges by one
with none unavailable: the second and third new Pods fit only once old Pods are gone and their
GPUs freed, in the scheduler's and in the extender's accounting. A rollout that completes is the
proof that both free what a deleted Pod held; the extender's gauge is checked at the end too.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kits.stackkit import (
    LARGE,
    WHOLE,
    h100_stack,
)
from localcluster import ApiError, ControlPlane, Kube
from localcluster.install.stack import CONDITION, TenantStack, condition, granted, metric
from localcluster.servers.engine_pods import engine_deployment
from localcluster.servers.webhook import PLAN_ANNOTATION, REQUEST_ANNOTATION

pytestmark = pytest.mark.e2e

REPLICAS = 3
GPUS = REPLICAS + 1
ROLLOUT_TIMEOUT = 150.0
# The same 72B model at a larger quantisation: still one whole H100, a different request.
NEW_REQUEST = {**LARGE, "model": {**LARGE["model"], "weightsBytes": 52_000_000_000}}


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(
        control_plane, "tmi-rollout", 120, gpus=GPUS, gpu_product="NVIDIA-H100-80GB-HBM3"
    ) as up:
        yield up


def rolled_out(dep: dict[str, Any]) -> bool:
    status = dep.get("status") or {}
    return (
        status.get("observedGeneration", 0) >= dep["metadata"]["generation"]
        and status.get("replicas") == REPLICAS
        and status.get("updatedReplicas") == REPLICAS
        and status.get("readyReplicas") == REPLICAS
        and status.get("availableReplicas") == REPLICAS
    )


def pods_of(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = kube.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"app={name}"}
    )
    return list(listed["items"])


def check_pod(pod: dict[str, Any], request: dict[str, Any], template_hash: str) -> None:
    meta = pod["metadata"]
    assert meta["labels"]["pod-template-hash"] == template_hash
    assert json.loads(meta["annotations"][REQUEST_ANNOTATION]) == request
    plan = json.loads(meta["annotations"][PLAN_ANNOTATION])
    assert plan, meta["name"]
    assert pod["spec"]["nodeName"]
    assert pod["spec"].get("runtimeClassName") == "nvidia"
    assert granted(pod) == "nvidia.com/gpu=1"
    verified = condition(pod, CONDITION)
    assert verified is not None and verified["status"] == "True", verified
    assert f"binding {WHOLE}" in verified["message"]


def current_hash(kube: Kube, namespace: str, name: str) -> str:
    """The pod-template-hash of the Deployment's newest ReplicaSet."""
    listed = kube.request(
        "GET",
        f"/apis/apps/v1/namespaces/{namespace}/replicasets",
        query={"labelSelector": f"app={name}"},
    )
    newest = max(
        listed["items"],
        key=lambda rs: int(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]),
    )
    return str(newest["metadata"]["labels"]["pod-template-hash"])


def test_a_deployment_rolls_to_a_new_request_pod_by_pod(
    control_plane: ControlPlane, stack: TenantStack
) -> None:
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    name = f"engine-{uuid.uuid4().hex[:6]}"
    assert stack.extender is not None
    accounted_before = metric(stack.extender.metrics(), "tmi_extender_accounted_pods")

    # No kubelet confirms termination here; nothing is gained by waiting for one.
    installer.create(
        engine_deployment(namespace, name, LARGE, replicas=REPLICAS, max_surge=1, max_unavailable=0)
    )
    try:
        admin.wait_for(
            "apps/v1",
            "Deployment",
            name,
            namespace,
            rolled_out,
            timeout=ROLLOUT_TIMEOUT,
            what=f"Deployment {name} to roll out {REPLICAS} verified replicas",
        )
        first = current_hash(admin, namespace, name)
        old_pods = pods_of(admin, namespace, name)
        assert len(old_pods) == REPLICAS
        for pod in old_pods:
            check_pod(pod, LARGE, first)

        installer.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            body={
                "spec": {
                    "template": {
                        "metadata": {"annotations": {REQUEST_ANNOTATION: json.dumps(NEW_REQUEST)}}
                    }
                }
            },
            content_type="application/merge-patch+json",
        )

        def replaced(dep: dict[str, Any]) -> bool:
            if not rolled_out(dep):
                return False
            current = pods_of(admin, namespace, name)
            return len(current) == REPLICAS and all(
                p["metadata"]["labels"]["pod-template-hash"] != first for p in current
            )

        admin.wait_for(
            "apps/v1",
            "Deployment",
            name,
            namespace,
            replaced,
            timeout=ROLLOUT_TIMEOUT,
            what=f"Deployment {name} to replace every Pod with the new request",
        )
        second = current_hash(admin, namespace, name)
        assert second != first
        new_pods = pods_of(admin, namespace, name)
        for pod in new_pods:
            check_pod(pod, NEW_REQUEST, second)
        gone = {p["metadata"]["name"] for p in old_pods}
        assert gone.isdisjoint(p["metadata"]["name"] for p in new_pods)

        # The extender accounts exactly the three new Pods: the old ones' GPUs are free.
        def freed() -> bool:
            samples = stack.extender.metrics() if stack.extender else []
            return metric(samples, "tmi_extender_accounted_pods") == accounted_before + REPLICAS

        admin.wait_for(
            "apps/v1",
            "Deployment",
            name,
            namespace,
            lambda _: freed(),
            timeout=30,
            what="the extender to account only the new ReplicaSet's Pods",
        )
    finally:
        with contextlib.suppress(ApiError):
            admin.request(
                "DELETE",
                f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
                query={"propagationPolicy": "Foreground"},
            )
        pod_query: dict[str, str | int] = {"labelSelector": f"app={name}", "gracePeriodSeconds": 0}
        with contextlib.suppress(ApiError):
            admin.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", query=pod_query)
