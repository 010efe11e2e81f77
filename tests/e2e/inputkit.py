"""What the end-to-end tests of the tenant-input inventory share (`test_tenant_inputs.py`,
`test_tenant_inputs_open.py`): reading a Pod's verdict and scheduling message, the refusals the
tenant's namespace admin gets, plain Pods, and the tenant's webhook configuration taken away
so that engine Pods are admitted as sent.
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inference_policy.base.codes import VERIFIED
from inference_policy.base.wire import PLAN_ANNOTATION
from kits.stackkit import LARGE
from localcluster import ApiError, ControlPlane, Kube, pod_condition, wait_until
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.servers.webhook_objects import CONFIGURATION_NAME

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
PREFIX = "tmi-inputs"


def ns(stack: TenantStack) -> str:
    return stack.settings.namespace


def pod_path(stack: TenantStack, name: str) -> str:
    return f"/api/v1/namespaces/{ns(stack)}/pods/{name}"


def verdict(kube: Kube, stack: TenantStack, name: str, status: str, reason: str) -> dict[str, Any]:
    return kube.wait_for(
        "v1",
        "Pod",
        name,
        ns(stack),
        lambda p: (
            (condition(p, CONDITION) or {}).get("status") == status
            and (condition(p, CONDITION) or {}).get("reason") == reason
        ),
        timeout=60,
        what=f"Pod {name} to read {CONDITION}={status} ({reason})",
    )


def verified(kube: Kube, stack: TenantStack, name: str) -> dict[str, Any]:
    pod = verdict(kube, stack, name, "True", VERIFIED)
    kube.wait_for(
        "v1",
        "Pod",
        name,
        ns(stack),
        lambda p: pod_condition(p, "Ready") == "True",
        timeout=30,
        what=f"Pod {name} Ready",
    )
    return pod


def stays_verified(kube: Kube, stack: TenantStack, name: str, seconds: float = 4.0) -> None:
    """The verdict reads Verified throughout `seconds` (the controller rechecks a Pod on every
    watch event, well within that)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition(kube.get("v1", "Pod", name, ns(stack)), CONDITION) or {}
        assert (found.get("status"), found.get("reason")) == ("True", VERIFIED), found
        time.sleep(0.5)


def refused(call: Callable[[], Any], status: int = 403) -> str:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == status, caught.value.message
    return caught.value.message


def scheduled_message(pod: dict[str, Any]) -> str:
    return str((condition(pod, "PodScheduled") or {}).get("message", ""))


def plain_pod(stack: TenantStack, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns(stack)},
        "spec": {
            "containers": [{"name": "app", "image": "placeholder.invalid/app:1"}],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def as_submitted(stored: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(stored)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    return pod


@contextlib.contextmanager
def webhook_removed(control_plane: ControlPlane, stack: TenantStack) -> Iterator[None]:
    """The tenant's webhook configuration deleted (its uninstall hook's identity may) until the
    block ends, then restored: engine Pods are admitted as sent, planned or not."""
    installer, admin = control_plane.kube("tmi-installer"), control_plane.kube("admin")
    assert stack.owner is not None
    configuration = stack.owner.get("MutatingWebhookConfiguration", CONFIGURATION_NAME)
    probe = engine_pod(ns(stack), LARGE, name=f"probe-{uuid.uuid4().hex[:6]}")

    def planned() -> bool:
        stored = installer.create(copy.deepcopy(probe), dry_run=True)
        return PLAN_ANNOTATION in stored["metadata"].get("annotations", {})

    admin.delete(
        "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", CONFIGURATION_NAME
    )
    try:
        wait_until(
            lambda: refused_or(planned),
            timeout=60,
            what="engine Pods to stop being planned by the tenant webhook",
        )
        yield
    finally:
        admin.apply(configuration)
        wait_until(
            lambda: not refused_or(planned),
            timeout=60,
            what="the tenant webhook to plan engine Pods again",
        )


def refused_with(reason: str) -> Callable[[dict[str, Any]], bool]:
    """Whether a Pod's scheduling message carries the extender's `reason`."""
    return lambda pod: reason in scheduled_message(pod)


def refused_or(planned: Callable[[], bool]) -> bool:
    """The probe is no longer planned: refused by the guard (it holds no grant yet asks for
    nothing, so it is admitted) or stored without a plan."""
    try:
        return not planned()
    except ApiError:
        return True
