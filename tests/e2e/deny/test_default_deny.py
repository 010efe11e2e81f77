"""Default-deny against the tenant's namespace admin, through the real API server.

Each test acts as the seed's installer (`admin` in the tenant namespace plus `pods/status`
patch) against the chart's owner part, and tries what the threat model's inventory says the
owner's parts do not believe: status fields other than the tenant's own conditions, the owner's
RoleBindings and Roles in the tenant namespace, the engine-container annotation of an admitted
Pod, device variables of other vendors and CDI annotations. Each is refused with a message
naming what is wrong, and what the tenant may do still works.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inference_policy.admission.owner_objects_cel import OWNER_LABEL
from inference_policy.base.wire import ENGINE_CONTAINER_ANNOTATION
from kits.stackkit import LARGE, h100_stack, pod_names
from localcluster import ApiError, ControlPlane, Kube, pod_condition
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod

pytestmark = pytest.mark.e2e
MERGE_PATCH = "application/merge-patch+json"
RBAC = "rbac.authorization.k8s.io/v1"
TMI_GROUP = "tmi.kamiwaza.ai/v1alpha1"
UNLABELLED = {"metadata": {"labels": {OWNER_LABEL: None}}}


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(control_plane, "tmi-deny", 30) as up:
        yield up


@pytest.fixture
def installer(control_plane: ControlPlane, stack: TenantStack) -> Kube:
    return control_plane.kube("tmi-installer")


@pytest.fixture
def pods(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., str]]:
    with pod_names(control_plane, stack) as make:
        yield make


def _verified(kube: Kube, stack: TenantStack, name: str) -> dict[str, Any]:
    return kube.wait_for(
        "v1",
        "Pod",
        name,
        stack.settings.namespace,
        lambda p: (
            (condition(p, CONDITION) or {}).get("status") == "True"
            and pod_condition(p, "Ready") == "True"
        ),
        timeout=60,
        what=f"Pod {name} verified and Ready",
    )


def _refused(call: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ApiError) as refused:
        call(*args, **kwargs)
    assert refused.value.status == 403, refused.value.message
    return refused.value.message


# -- status writes by allow-list ------------------------------------------------------------


STATUS_FORGERIES: dict[str, tuple[dict[str, Any], str]] = {
    # A running GPU Pod set to Succeeded drops out of every accounting.
    "phase": ({"phase": "Succeeded"}, "status.phase"),
    "message": ({"message": "all is well"}, "status.message"),
    "container-statuses": (
        {
            "containerStatuses": [
                {
                    "name": "engine",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 7,
                    "state": {"waiting": {"reason": "Forged"}},
                }
            ]
        },
        "status.containerStatuses",
    ),
    "system-condition": (
        {"conditions": [{"type": "Ready", "status": "False", "reason": "Forged"}]},
        "Ready",
    ),
    "disruption-target": (
        {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "Forged"}]},
        "DisruptionTarget",
    ),
    "owner-condition": (
        {"conditions": [{"type": "tmi.kamiwaza.ai/Anything", "status": "True"}]},
        "tmi.kamiwaza.ai/Anything",
    ),
}


def test_status_writes_are_refused_but_for_the_tenants_own_conditions(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """The namespace admin holds pods/status patch: every field it could forge to move an
    owner part (phase, nominated node, container statuses, the system's and the owner's
    conditions) is refused with the field named; a condition of its own domain is its to write,
    and the kubelet's (KWOK's) writes and the controller's verdict go on as before."""
    namespace = stack.settings.namespace
    name = pods("status")
    installer.create(engine_pod(namespace, LARGE, name=name))
    before = _verified(kube, stack, name)
    for case, (status, field) in STATUS_FORGERIES.items():
        message = _refused(installer.patch_status, "v1", "Pod", name, namespace, {"status": status})
        assert field in message, (case, message)
        assert "only the cluster's own components may change" in message, case
    after = kube.get("v1", "Pod", name, namespace)
    assert after["status"]["phase"] == before["status"]["phase"] == "Running"
    assert not after["status"].get("nominatedNodeName")
    assert condition(after, CONDITION) == condition(before, CONDITION)
    # A nomination is what the scheduler reserves room by; it is a pending Pod's to forge.
    pending: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pods("pending"), "namespace": namespace},
        "spec": {
            "nodeSelector": {"example.com/nowhere": "true"},
            "containers": [{"name": "app", "image": "placeholder.invalid/app:1"}],
        },
    }
    installer.create(pending)
    nominated = {"status": {"nominatedNodeName": "elsewhere"}}
    message = _refused(
        lambda: installer.patch_status(
            "v1", "Pod", pending["metadata"]["name"], namespace, nominated
        )
    )
    assert "status.nominatedNodeName" in message, message
    own = {"conditions": [{"type": "example.com/Warm", "status": "True", "reason": "Loaded"}]}
    patched = installer.patch_status("v1", "Pod", name, namespace, {"status": own})
    assert pod_condition(patched, "example.com/Warm") == "True"
    assert pod_condition(kube.get("v1", "Pod", name, namespace), "Ready") == "True"


# -- the owner's objects in the tenant namespace ----------------------------------------------


def test_the_owners_roles_and_bindings_in_the_tenant_namespace_are_the_owners(
    control_plane: ControlPlane, stack: TenantStack, installer: Kube
) -> None:
    """The controller's and the extender's rights in the tenant namespace are Roles and
    RoleBindings there, which `admin` may otherwise delete or rewrite: each carries the owner
    label, and only an identity that may update the tenant's TenantAdmission changes them. The
    tenant's own Roles are untouched by the rule, and the owner (cluster admin) still manages
    its objects."""
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    owned = [
        ("Role", "tmi-allocation-controller"),
        ("RoleBinding", "tmi-allocation-controller"),
        ("Role", "tmi-extender-read-profiles"),
        ("RoleBinding", "tmi-extender-read-profiles"),
    ]
    for kind, name in owned:
        stored = admin.get(RBAC, kind, name, namespace)
        assert stored["metadata"]["labels"][OWNER_LABEL] == "true"
        message = _refused(installer.delete, RBAC, kind, name, namespace)
        assert f"{kind} {name} is the cluster owner's (it carries {OWNER_LABEL}" in message, message
        _refused(
            installer.request,
            "PATCH",
            f"/apis/{RBAC}/namespaces/{namespace}/{kind.lower()}s/{name}",
            body=UNLABELLED,
            content_type=MERGE_PATCH,
        )
    # The owner's quota in the namespace: RBAC refuses `admin` any write, the policy too.
    quota = "tmi-no-cross-namespace-affinity"
    assert admin.get("v1", "ResourceQuota", quota, namespace)["metadata"]["labels"][OWNER_LABEL]
    _refused(installer.delete, "v1", "ResourceQuota", quota, namespace)
    widened = {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    _refused(
        lambda: installer.request(
            "PATCH",
            f"/apis/{RBAC}/namespaces/{namespace}/roles/tmi-allocation-controller",
            body=widened,
            content_type=MERGE_PATCH,
        )
    )
    # Nor may the tenant make an object the owner's by labelling it.
    decoy: dict[str, Any] = {
        "apiVersion": RBAC,
        "kind": "Role",
        "metadata": {
            "name": f"decoy-{uuid.uuid4().hex[:6]}",
            "namespace": namespace,
            "labels": {OWNER_LABEL: "true"},
        },
        "rules": [],
    }
    _refused(lambda: installer.create(decoy))
    mine = copy.deepcopy(decoy)
    del mine["metadata"]["labels"]
    installer.create(mine)
    installer.delete(RBAC, "Role", mine["metadata"]["name"], namespace)
    note = {"metadata": {"annotations": {"example.com/reviewed": "yes"}}}
    admin.request(
        "PATCH",
        f"/apis/{RBAC}/namespaces/{namespace}/rolebindings/tmi-allocation-controller",
        body=note,
        content_type=MERGE_PATCH,
    )
    for kind, name in owned:
        assert admin.get(RBAC, kind, name, namespace)["metadata"]["labels"][OWNER_LABEL]


def test_the_admission_policies_parameters_are_the_owners_even_given_rbac(
    control_plane: ControlPlane, stack: TenantStack, installer: Kube
) -> None:
    """The policies are bound once for every tenant and read the TenantPolicy in the namespace
    of the request: RBAC gives the namespace admin no right to it, and the owner-objects policy
    refuses every write of one, labelled or not, to an identity granted every right in the
    namespace; the policies then still act on its Pods with the owner's parameters."""
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    params = admin.get(TMI_GROUP, "TenantPolicy", "tmi-admission", namespace)
    assert params["spec"]["namespace"] == namespace
    # RBAC first: the seed's installer (admin in the namespace) may not touch it at all.
    _refused(installer.delete, TMI_GROUP, "TenantPolicy", "tmi-admission", namespace)
    # Then an identity granted everything in the namespace (cluster-admin bound there), as a
    # careless owner might: the owner-objects policy still refuses it every write.
    everything = f"tmi-everything-{uuid.uuid4().hex[:6]}"
    control_plane.add_identity(everything)
    control_plane.grant_namespace_admin(everything, namespace, "cluster-admin")
    wide = control_plane.kube(everything)
    message = _refused(wide.delete, TMI_GROUP, "TenantPolicy", "tmi-admission", namespace)
    assert "TenantPolicy tmi-admission is the cluster owner's" in message, message
    widened = {"spec": {"priorityClasses": ["system-cluster-critical"]}}
    _refused(
        wide.request,
        "PATCH",
        f"/apis/{TMI_GROUP}/namespaces/{namespace}/tenantpolicies/tmi-admission",
        body=widened,
        content_type=MERGE_PATCH,
    )
    # Nor a second one without the owner's label.
    unlabelled = {
        "apiVersion": TMI_GROUP,
        "kind": "TenantPolicy",
        "metadata": {"name": "second", "namespace": namespace},
        "spec": params["spec"],
    }
    _refused(wide.create, unlabelled)
    assert (
        admin.get(TMI_GROUP, "TenantPolicy", "tmi-admission", namespace)["spec"] == params["spec"]
    )


# -- the engine container is fixed with the plan ----------------------------------------------


def test_the_engine_container_annotation_cannot_be_moved(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """Moving the annotation to another container would make that one the engine and leave
    the granted container's image free to change: it is frozen like the plan."""
    namespace = stack.settings.namespace
    name = pods("moved")
    pod = engine_pod(namespace, LARGE, name=name)
    pod["spec"]["containers"].append({"name": "helper", "image": "placeholder.invalid/h:1"})
    pod["metadata"]["annotations"][ENGINE_CONTAINER_ANNOTATION] = "engine"
    installer.create(pod)
    _verified(kube, stack, name)
    for value in ("helper", None):
        message = _refused(
            installer.request,
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            body={"metadata": {"annotations": {ENGINE_CONTAINER_ANNOTATION: value}}},
            content_type=MERGE_PATCH,
        )
        assert f"the {ENGINE_CONTAINER_ANNOTATION} annotation is fixed" in message, message
    stored = kube.get("v1", "Pod", name, namespace)
    assert stored["metadata"]["annotations"][ENGINE_CONTAINER_ANNOTATION] == "engine"


# -- device variables and CDI annotations on engine Pods --------------------------------------


ENGINE_REACHES: dict[str, tuple[str, Any, str]] = {
    "imex-channels": ("env", [{"name": "NVIDIA_IMEX_CHANNELS", "value": "all"}], "NVIDIA_IMEX"),
    "gds": ("env", [{"name": "NVIDIA_GDS", "value": "enabled"}], "NVIDIA_GDS"),
    "habana": ("env", [{"name": "HABANA_VISIBLE_DEVICES", "value": "all"}], "HABANA_VISIBLE"),
    "env-from": ("envFrom", [{"configMapRef": {"name": "devices"}}], "envFrom"),
}


@pytest.mark.parametrize("case", ENGINE_REACHES.values(), ids=ENGINE_REACHES.keys())
def test_no_engine_container_takes_a_device_variable(
    stack: TenantStack, installer: Kube, case: tuple[str, Any, str]
) -> None:
    """The granted container and its sidecar alike: a vendor's runtime hands out devices and
    device features for its whole variable namespace, whatever the device plugin granted."""
    field, value, named = case
    namespace = stack.settings.namespace
    for container in (0, 1):
        pod = engine_pod(namespace, LARGE, name=f"vars-{uuid.uuid4().hex[:6]}")
        pod["spec"]["containers"].append({"name": "sidecar", "image": "placeholder.invalid/s:1"})
        pod["spec"]["containers"][container][field] = copy.deepcopy(value)
        message = _refused(installer.create, pod)
        assert named in message, message


def test_cdi_annotations_are_refused_on_create_and_update(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """A CDI-enabled runtime injects the devices a `cdi.k8s.io/` annotation names: refused on
    an engine Pod, a plain Pod, and added later to an admitted one."""
    namespace = stack.settings.namespace
    cdi = {"cdi.k8s.io/extra": "nvidia.com/gpu=all"}
    planned = engine_pod(namespace, LARGE, name=f"cdi-{uuid.uuid4().hex[:6]}")
    planned["metadata"]["annotations"].update(cdi)
    assert "cdi.k8s.io/extra" in _refused(lambda: installer.create(planned))
    plain: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pods("plain"), "namespace": namespace, "annotations": dict(cdi)},
        "spec": {"containers": [{"name": "app", "image": "placeholder.invalid/app:1"}]},
    }
    assert "cdi.k8s.io/extra" in _refused(lambda: installer.create(plain))
    del plain["metadata"]["annotations"]
    installer.create(plain)
    message = _refused(
        lambda: installer.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{plain['metadata']['name']}",
            body={"metadata": {"annotations": cdi}},
            content_type=MERGE_PATCH,
        )
    )
    assert "cdi.k8s.io/extra" in message, message


# -- the recipe catalogs --------------------------------------------------------------------


def test_a_recipe_catalog_under_the_owners_name_is_exactly_the_owners(
    control_plane: ControlPlane, stack: TenantStack, installer: Kube
) -> None:
    """The owner configures a catalog by a name carrying its whole sha256 (`tmi render-catalog`);
    the tenant's namespace admin may write ConfigMaps of that name. Written by it through the
    API server, another catalog under the owner's name, the owner's catalog edited, or one
    under a name carrying only a 64-bit prefix of the digest is refused by the one loader the
    owner's servers read it with; the owner's own ConfigMap loads."""
    from inference_policy.planning.recipes import RecipeCatalogError, load_catalog, render_catalog
    from tests.unit.cli.test_cli import RECIPES

    namespace = stack.settings.namespace
    owners = render_catalog(RECIPES, namespace, "gpu").configmap
    name = owners["metadata"]["name"]
    other: dict[str, Any] = copy.deepcopy(RECIPES)
    other["recipes"][0]["match"] = {"max_model_len": 4096}
    forged = render_catalog(other, namespace, "gpu").configmap
    forged["metadata"]["name"] = name
    short = copy.deepcopy(owners)
    short["metadata"]["name"] = name[: -(64 - 16)]
    edited = copy.deepcopy(owners)
    edited["data"]["catalog.json"] = forged["data"]["catalog.json"]
    for configmap, refusal in (
        (forged, "does not carry its sha256"),
        (short, "does not carry its sha256"),
        (edited, "catalog.sha256 does not match"),
    ):
        installer.create(configmap)
        try:
            stored = control_plane.kube("admin").get(
                "v1", "ConfigMap", name_of(configmap), namespace
            )
            with pytest.raises(RecipeCatalogError) as refused:
                load_catalog(stored, "gpu")
            assert refusal in str(refused.value), refused.value
        finally:
            installer.delete("v1", "ConfigMap", name_of(configmap), namespace)
    installer.create(owners)
    try:
        stored = control_plane.kube("admin").get("v1", "ConfigMap", name, namespace)
        assert load_catalog(stored, "gpu").recipes[0].id == "qwen-8k"
    finally:
        installer.delete("v1", "ConfigMap", name, namespace)


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


# -- what the controller keeps of the tenant's Pods ---------------------------------------------


def test_an_engine_pod_larger_than_the_controller_keeps_is_not_verified(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """The tenant decides how large its engine-labelled Pods are; the controller keeps at most
    128 KiB of one (`inference_policy.granting.kept_pod`), so a Pod padded past it with an
    annotation is kept as a skeleton and reported `PodTooLarge`, never verified. (Ready here is
    KWOK's stage, not a kubelet's, and was seen True once beside the False verdict; the verdict is
    what is asserted.)"""
    from inference_policy.granting.kept_pod import MAX_KEPT_POD_BYTES

    namespace = stack.settings.namespace
    name = pods("padded")
    pod = engine_pod(namespace, LARGE, name=name)
    pod["metadata"]["annotations"]["example.com/padding"] = "x" * (MAX_KEPT_POD_BYTES + 1024)
    installer.create(pod)
    found = kube.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("reason") == "PodTooLarge",
        timeout=60,
        what=f"Pod {name} reported PodTooLarge",
    )
    verdict = condition(found, CONDITION) or {}
    assert verdict.get("status") == "False"
    assert f"more than the {MAX_KEPT_POD_BYTES}" in str(verdict.get("message"))
