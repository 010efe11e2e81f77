"""The dra allocation class end to end: signed, rendered, planned, allocated, verified, guarded.

The chart's owner part is installed with the profile's DRA objects (`tmi render-dra`'s values:
a DeviceClass per dra binding, the claim templates in the tenant namespace, the claims policy's
parameters). KWOK nodes carry no devices of their own: a test identity playing NVIDIA's DRA
driver publishes ResourceSlices for them, as upstream's scheduler tests do, and kube-scheduler
(the owner's, with the extender) allocates each engine Pod's claim from the owner's classes; the
resource-claim controller of kube-controller-manager makes each claim from its template.

What is proved, in order (one stack, the tests build on each other's Pods):

* a DRA engine Pod is allocated a device of its binding, and AllocationVerified says which;
* spill: with the first binding's device taken, the next Pod's claim takes the next binding's
  (`firstAvailable`), with no change to the plan;
* a device whose published attributes differ from the signed facts (an older driver, another
  product) is never allocated: the Pod waits, and is placed when a binding's device frees;
* a device republished with other facts after allocation makes AllocationVerified False, with
  the fact named;
* the tenant's namespace admin can make no claim that widens the grant: the driver's own class,
  selectors, admin access, another count, a claim by name on an engine Pod, any claim on a plain
  Pod; nobody labels the namespace for admin access.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from inference_policy.trust.dra_claims import CLAIM_NAME, device_class_name, published_templates
from inference_policy.trust.profile import DraBinding
from kits.profilekit import Owner, dra_binding, gpu_profile, request, with_profiles
from kits.stackkit import dated, tenant_stack
from localcluster import ApiError, ControlPlane, Kube
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.nodes.dra_driver import DRIVER, Driver, published_device
from localcluster.nodes.kwok import FakeNode, create_fake_nodes, delete_fake_nodes

pytestmark = pytest.mark.e2e

SMALL = "h100-80"
NEXT = "h100-nvl"


def dra_envelope(owner: Owner, namespace: str) -> dict[str, Any]:
    bindings = [
        dra_binding(SMALL),
        dra_binding(NEXT, product="NVIDIA H100 NVL", device_memory="94Gi", usable="93Gi"),
    ]
    return dated(
        with_profiles(owner, gpu_profile("nvidia-dra", "whole-device", bindings)), namespace
    )


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    admin = control_plane.kube("admin")
    with tenant_stack(control_plane, "tmi-dra", dra_envelope, 30) as up:
        # The tenant's namespace admin may make claims as far as RBAC goes: what refuses them
        # below is the owner's policy, not a missing role.
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "claims", "namespace": up.settings.namespace},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceclaims", "resourceclaimtemplates"],
                        "verbs": ["create", "get", "list", "delete"],
                    }
                ],
            }
        )
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "claims", "namespace": up.settings.namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "claims",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": "tmi-installer",
                    }
                ],
            }
        )
        yield up


@pytest.fixture(scope="module")
def driver(control_plane: ControlPlane, stack: TenantStack) -> Driver:
    return Driver(control_plane)


@pytest.fixture(scope="module")
def nodes(
    control_plane: ControlPlane, stack: TenantStack, driver: Driver
) -> Iterator[dict[str, str]]:
    """Three device-less KWOK nodes and what the driver publishes on each."""
    admin = control_plane.kube("admin")
    suffix = uuid.uuid4().hex[:4]
    names = {"small": f"dra-a-{suffix}", "next": f"dra-b-{suffix}", "wrong": f"dra-c-{suffix}"}
    create_fake_nodes(admin, [FakeNode(name, gpus=0, vram_gb=None) for name in names.values()])
    driver.publish(names["small"], [published_device("gpu-0")])
    driver.publish(
        names["next"],
        [published_device("gpu-0", uuid=_uuid(2), product="NVIDIA H100 NVL", memory="94Gi")],
    )
    driver.publish(
        names["wrong"],
        [
            published_device("gpu-0", uuid=_uuid(3), driver="550.54.15"),
            published_device("gpu-1", uuid=_uuid(4), product="NVIDIA H100 PCIe"),
        ],
    )
    assert stack.extender is not None
    stack.extender.wait_nodes(list(names.values()))
    try:
        yield names
    finally:
        for name in names.values():
            driver.withdraw(name)
        delete_fake_nodes(admin, list(names.values()))


def _uuid(n: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{n:012d}"


def _pod(stack: TenantStack, name: str) -> dict[str, Any]:
    return engine_pod(stack.settings.namespace, request(), name=name)


def _claim(kube: Kube, stack: TenantStack, pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("resourceClaimStatuses") or []
    name = next(s["resourceClaimName"] for s in statuses if s["name"] == CLAIM_NAME)
    return kube.get("resource.k8s.io/v1", "ResourceClaim", name, stack.settings.namespace)


def _running(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName")) and pod["status"].get("phase") == "Running"


def _condition(pod: dict[str, Any]) -> dict[str, Any]:
    found = condition(pod, CONDITION)
    assert found is not None, pod["status"]
    return dict(found)


def _class_of(stack: TenantStack, binding_id: str) -> str:
    found = stack.verified.envelope.binding(binding_id)
    assert found is not None and isinstance(found[1], DraBinding)
    return device_class_name(found[1])


def _verdict(pod: dict[str, Any], status: str) -> bool:
    found = condition(pod, CONDITION)
    return found is not None and found.get("status") == status


def _result(claim: dict[str, Any]) -> dict[str, Any]:
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    return dict(results[0])


PODS: list[str] = []


def _create(control_plane: ControlPlane, stack: TenantStack) -> dict[str, Any]:
    name = f"dra-{uuid.uuid4().hex[:6]}"
    PODS.append(name)
    return control_plane.kube("tmi-installer").create(_pod(stack, name))


def _wait(
    kube: Kube, stack: TenantStack, name: str, predicate: Any, what: str, timeout: float = 60
) -> dict[str, Any]:
    return kube.wait_for(
        "v1", "Pod", name, stack.settings.namespace, predicate, timeout=timeout, what=what
    )


@pytest.fixture(scope="module", autouse=True)
def _cleanup(control_plane: ControlPlane, stack: TenantStack) -> Iterator[None]:
    yield
    admin = control_plane.kube("admin")
    for name in PODS:
        with contextlib.suppress(ApiError):
            admin.delete("v1", "Pod", name, stack.settings.namespace, grace_period_seconds=0)


def test_a_dra_engine_pod_is_allocated_a_device_of_its_binding(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str]
) -> None:
    admin = control_plane.kube("admin")
    created = _create(control_plane, stack)
    name = created["metadata"]["name"]
    assert created["spec"]["resourceClaims"][0]["name"] == CLAIM_NAME
    assert created["spec"]["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}]
    pod = _wait(admin, stack, name, lambda p: _running(p) and _verdict(p, "True"), "verified")
    assert pod["spec"]["nodeName"] == nodes["small"]
    result = _result(_claim(admin, stack, pod))
    assert result["request"] == f"{CLAIM_NAME}/b0"
    assert (result["pool"], result["device"]) == (nodes["small"], "gpu-0")
    message = _condition(pod)["message"]
    assert f"{nodes['small']}/gpu-0" in message, message


def test_the_next_claim_spills_to_the_next_binding_when_the_first_is_full(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str]
) -> None:
    admin = control_plane.kube("admin")
    name = _create(control_plane, stack)["metadata"]["name"]
    pod = _wait(admin, stack, name, lambda p: _running(p) and _verdict(p, "True"), "spilled")
    assert pod["spec"]["nodeName"] == nodes["next"]
    result = _result(_claim(admin, stack, pod))
    assert result["request"] == f"{CLAIM_NAME}/b1"
    claim = _claim(admin, stack, pod)
    sub = claim["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [s["deviceClassName"] for s in sub] == [_class_of(stack, b) for b in (SMALL, NEXT)]


def test_a_device_whose_facts_differ_is_never_allocated(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str]
) -> None:
    admin = control_plane.kube("admin")
    name = _create(control_plane, stack)["metadata"]["name"]

    def refused(pod: dict[str, Any]) -> bool:
        scheduled = condition(pod, "PodScheduled")
        return scheduled is not None and scheduled.get("reason") == "Unschedulable"

    pod = _wait(admin, stack, name, refused, "reported unschedulable")
    assert not pod["spec"].get("nodeName")
    # Only the wrong node's two devices are free, and neither is allocated; when a binding's
    # device frees, the waiting Pod takes it.
    admin.delete("v1", "Pod", PODS[0], stack.settings.namespace, grace_period_seconds=0)
    pod = _wait(admin, stack, name, _running, "placed once a device freed")
    assert pod["spec"]["nodeName"] == nodes["small"]


def test_a_device_republished_with_other_facts_is_not_verified(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str], driver: Driver
) -> None:
    admin = control_plane.kube("admin")
    name = PODS[2]
    _wait(admin, stack, name, lambda p: _verdict(p, "True"), "verified first")
    driver.publish(nodes["small"], [published_device("gpu-0", product="NVIDIA H100 PCIe")])
    # A controller that starts again re-checks every engine Pod.
    assert stack.controller is not None
    stack.controller.restart()
    pod = _wait(admin, stack, name, lambda p: _verdict(p, "False"), "refused after republish")
    found = _condition(pod)
    assert found["reason"] == "DeviceMismatch"
    assert "its productName is NVIDIA H100 PCIe" in found["message"], found["message"]


def _template(stack: TenantStack, **changes: Any) -> dict[str, Any]:
    template = published_templates(stack.verified.envelope)[0]
    spec = copy.deepcopy(template.claim_spec())
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": f"tenant-{uuid.uuid4().hex[:6]}",
            "namespace": stack.settings.namespace,
        },
        "spec": {"spec": spec},
        **changes,
    }


def _refused(kube: Kube, body: dict[str, Any], status: int = 403) -> str:
    try:
        kube.create(body, dry_run=True)
    except ApiError as exc:
        assert exc.status == status, exc
        return exc.message
    raise AssertionError(f"admitted: {body}")


def test_the_tenant_can_make_no_claim_that_widens_the_grant(
    control_plane: ControlPlane, stack: TenantStack
) -> None:
    tenant = control_plane.kube("tmi-installer")
    ns = stack.settings.namespace
    owner_class = _class_of(stack, SMALL)
    exactly = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    body = _template(stack)
    body["spec"]["spec"] = {"devices": {"requests": [exactly]}}
    assert "names a DeviceClass the owner did not publish" in _refused(tenant, body)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine", "namespace": ns},
        "spec": {"devices": {"requests": [exactly]}},
    }
    assert "names a DeviceClass the owner did not publish" in _refused(tenant, claim)
    admin_access = {"name": "gpu", "exactly": {"deviceClassName": owner_class, "adminAccess": True}}
    claim["spec"] = {"devices": {"requests": [admin_access]}}
    # Kubernetes itself refuses admin access outside a namespace with the label, which the
    # owner's namespace policy keeps off (the last test).
    message = _refused(tenant, claim, status=422)
    assert "resource.kubernetes.io/admin-access: true" in message, message
    selected = _template(stack)
    sub = selected["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]
    sub["selectors"] = [{"cel": {"expression": "true"}}]
    assert "adds selectors" in _refused(tenant, selected)
    every = _template(stack)
    every["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["allocationMode"] = "All"
    every["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0].pop("count")
    assert "allocationMode All" in _refused(tenant, every)
    more = _template(stack)
    more["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"] = 8
    assert "is not a claim template the owner published" in _refused(tenant, more)
    # An engine Pod's claims are its plan's: one the tenant brings is replaced by the planned
    # one (and, with a webhook that plans nothing, refused by the guard: test_admission_policies).
    named = _pod(stack, "by-name")
    named["spec"]["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimName": "mine"}]
    stored = tenant.create(named, dry_run=True)
    [planned] = stored["spec"]["resourceClaims"]
    assert planned["name"] == CLAIM_NAME and "resourceClaimName" not in planned
    assert planned["resourceClaimTemplateName"].startswith("tmi-h100-80-")
    # A plain Pod has none, even from the owner's template.
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain", "namespace": ns},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "g"}]}}
            ],
            "resourceClaims": [
                {
                    "name": "g",
                    "resourceClaimTemplateName": published_templates(stack.verified.envelope)[
                        0
                    ].name,
                }
            ],
        },
    }
    assert "outside a plan" in _refused(tenant, plain)


def test_nobody_labels_the_tenant_namespace_for_admin_access(
    control_plane: ControlPlane, stack: TenantStack
) -> None:
    admin = control_plane.kube("admin")
    with pytest.raises(ApiError) as raised:
        admin.request(
            "PATCH",
            f"/api/v1/namespaces/{stack.settings.namespace}",
            body={"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
            content_type="application/merge-patch+json",
        )
    assert raised.value.status == 403
    assert "admin access to devices" in raised.value.message
