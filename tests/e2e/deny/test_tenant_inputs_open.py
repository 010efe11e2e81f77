"""The tenant-input inventory's open rows, acting as the tenant's namespace admin
(`tmi-installer`) through the real API server: each test proves what holds today and says
what does not.

Tolerations and the scheduling constraints that stay within the namespace leave the grant as
planned, while where a tolerating Pod lands and what it takes of a shared node is the next
issue's ("Tenants kept apart"); and a terminating Pod whose engine label is removed keeps its
verdict, which its test asserts the other way round and is expected to fail until that row is
closed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from inference_policy.base.codes import ENGINE_LABEL_REMOVED
from inference_policy.base.wire import ENGINE_LABEL
from kits.stackkit import LARGE, h100_stack, pod_names
from localcluster import ControlPlane, Kube
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from tests.e2e.inputkit import (
    MERGE_PATCH,
    PREFIX,
    VOID,
    ns,
    plain_pod,
    pod_path,
    verified,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(control_plane, PREFIX + "-open", 30) as up:
        yield up


@pytest.fixture
def installer(control_plane: ControlPlane, stack: TenantStack) -> Kube:
    return control_plane.kube("tmi-installer")


@pytest.fixture
def pods(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., str]]:
    with pod_names(control_plane, stack) as make:
        yield make


# -- a terminating Pod --------------------------------------------------------------------------


def test_a_terminating_pod_whose_label_is_removed_loses_its_verdict(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    installer: Kube,
    pods: Callable[..., str],
) -> None:
    """The tenant holds a verified Pod terminating (a finalizer of its own, as a long grace
    period would on a real node) and removes its label: the controller reads the Pod that left
    its watch afresh (its last state lacks the label, so it was not deleted) and withdraws the
    verdict as for a running Pod."""
    name = pods("terminating")
    pod = engine_pod(ns(stack), LARGE, name=name)
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    installer.create(pod)
    verified(kube, stack, name)
    try:
        installer.delete("v1", "Pod", name, ns(stack), grace_period_seconds=None)
        kube.wait_for(
            "v1",
            "Pod",
            name,
            ns(stack),
            lambda p: bool(p["metadata"].get("deletionTimestamp")),
            timeout=30,
            what=f"Pod {name} terminating",
        )
        installer.request(
            "PATCH",
            pod_path(stack, name),
            body={"metadata": {"labels": {ENGINE_LABEL: None}}},
            content_type=MERGE_PATCH,
        )
        found = kube.wait_for(
            "v1",
            "Pod",
            name,
            ns(stack),
            lambda p: (condition(p, CONDITION) or {}).get("reason") == ENGINE_LABEL_REMOVED,
            timeout=15,
            what=f"Pod {name}'s verdict withdrawn",
        )
        assert (condition(found, CONDITION) or {}).get("status") == "False"
    finally:
        kube.request(
            "PATCH",
            pod_path(stack, name),
            body={"metadata": {"finalizers": None}},
            content_type=MERGE_PATCH,
        )


# -- open: Tenants kept apart (next issue) ------------------------------------------------------


def test_tolerations_and_constraints_within_the_namespace_leave_the_grant(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """What holds today of the open tolerations row, and of the constraints that stay within
    the namespace: an engine Pod tolerating every taint, with pod anti-affinity and a topology
    spread over its own namespace's Pods and a node affinity, is placed by the owner's
    scheduler only after the extender's grant check and verified, with the plan's grant and no
    more. A plain Pod tolerating every taint is admitted, shielded: where it may land and what
    it takes of a node another tenant uses is the open part."""
    name = pods("constrained")
    pod = engine_pod(ns(stack), LARGE, name=name)
    pod["metadata"]["labels"]["app"] = name
    pod["spec"].update(
        {
            "tolerations": [{"operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/os",
                                        "operator": "In",
                                        "values": ["linux"],
                                    }
                                ]
                            }
                        ]
                    }
                },
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"app": f"{name}-other"}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                },
            },
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app": name}},
                }
            ],
        }
    )
    installer.create(pod)
    stored = verified(kube, stack, name)
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert stored["spec"]["schedulerName"] == stack.settings.scheduler_name
    tolerant = installer.create(
        plain_pod(stack, pods("tolerant"), tolerations=[{"operator": "Exists"}])
    )
    assert tolerant["spec"]["containers"][0]["env"] == [VOID]
