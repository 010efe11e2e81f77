"""The tenant-input inventory's rows that no other end-to-end test proved, acting as the tenant's
namespace admin (`tmi-installer`) through the real API server against the chart's owner part.

Each test is named by its rows in `inference_policy.tools.tenant_inputs` (the threat model's table
"What the tenant can write, and what the owner's parts make of it"): the engine label removed, an
engine Pod that is not its plan, the planned image frozen, what no owner part reads, the API
server's own refusals (an overhead of the tenant's, annotations past 256 KiB, a Binding, its
Namespace's labels) and a ServiceAccount of the namespace acting as the admin. The open rows'
tests are in `test_tenant_inputs_open.py`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from inference_policy.admission.owner_objects_cel import OWNER_LABEL
from inference_policy.base.codes import (
    ENGINE_LABEL_REMOVED,
    IMAGE_MISMATCH,
    NODE_SELECTOR_MISMATCH,
    RUNTIME_CLASS_MISMATCH,
)
from inference_policy.base.wire import ENGINE_LABEL, OPT_IN_LABEL
from kits.stackkit import LARGE, h100_stack, pod_names
from localcluster import ApiError, ControlPlane, Kube, pod_condition, wait_until
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from tests.e2e.inputkit import (
    MERGE_PATCH,
    PREFIX,
    STRATEGIC,
    VOID,
    as_submitted,
    ns,
    plain_pod,
    pod_path,
    refused,
    refused_with,
    stays_verified,
    verdict,
    verified,
    webhook_removed,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(control_plane, PREFIX, 30) as up:
        yield up


@pytest.fixture
def installer(control_plane: ControlPlane, stack: TenantStack) -> Kube:
    return control_plane.kube("tmi-installer")


@pytest.fixture
def pods(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., str]]:
    with pod_names(control_plane, stack) as make:
        yield make


# -- the engine label ---------------------------------------------------------------------------


def test_removing_the_engine_label_withdraws_the_verdict(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """The label makes a Pod an engine Pod, re-checked for as long as it carries it; taken off a
    verified one, the controller says the grant is no longer vouched for, and its readiness
    gate closes."""
    name = pods("unlabelled")
    installer.create(engine_pod(ns(stack), LARGE, name=name))
    verified(kube, stack, name)
    installer.request(
        "PATCH",
        pod_path(stack, name),
        body={"metadata": {"labels": {ENGINE_LABEL: None}}},
        content_type=MERGE_PATCH,
    )
    pod = verdict(kube, stack, name, "False", ENGINE_LABEL_REMOVED)
    assert ENGINE_LABEL not in pod["metadata"].get("labels", {})
    kube.wait_for(
        "v1",
        "Pod",
        name,
        ns(stack),
        lambda p: pod_condition(p, "Ready") == "False",
        timeout=30,
        what=f"Pod {name} not Ready once its verdict is withdrawn",
    )


# -- an engine Pod that is not its plan ---------------------------------------------------------


def test_an_engine_pod_that_is_not_its_plan_is_placed_nowhere(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    installer: Kube,
    pods: Callable[..., str],
) -> None:
    """The tenant's webhook planned a Pod; the tenant then sends it with its webhook removed and
    one field changed that the guard cannot tell from a plan: the engine container's image, the
    RuntimeClass, the architecture selector. The owner's extender holds each to its plan and
    passes no node, naming the difference."""
    honest = installer.create(engine_pod(ns(stack), LARGE, name=pods("honest")), dry_run=True)
    cases: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
        "image": (
            lambda p: p["spec"]["containers"][0].update(image="registry.invalid/other:1"),
            IMAGE_MISMATCH,
        ),
        "runtime-class": (lambda p: p["spec"].pop("runtimeClassName"), RUNTIME_CLASS_MISMATCH),
        "arch-selector": (
            lambda p: p["spec"]["nodeSelector"].pop("kubernetes.io/arch"),
            NODE_SELECTOR_MISMATCH,
        ),
    }
    assert honest["spec"].get("runtimeClassName"), honest["spec"]
    with webhook_removed(control_plane, stack):
        for case, (change, reason) in cases.items():
            forged = as_submitted(honest)
            forged["metadata"]["name"] = pods(case)
            change(forged)
            installer.create(forged)
            pod = kube.wait_for(
                "v1",
                "Pod",
                forged["metadata"]["name"],
                ns(stack),
                refused_with(reason),
                timeout=60,
                what=f"the extender to refuse the {case} with {reason}",
            )
            assert not pod["spec"].get("nodeName"), (case, pod["spec"].get("nodeName"))


def test_the_planned_image_is_frozen_and_a_sidecars_is_not_read(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """The engine container's image is its plan's and cannot change on the admitted Pod; a
    sidecar's is the tenant's to change, shielded, and moves no verdict."""
    name = pods("images")
    pod = engine_pod(ns(stack), LARGE, name=name)
    pod["spec"]["containers"].append({"name": "sidecar", "image": "placeholder.invalid/s:1"})
    installer.create(pod)
    stored = verified(kube, stack, name)
    assert stored["spec"]["containers"][1]["env"] == [VOID]
    message = refused(
        lambda: installer.request(
            "PATCH",
            pod_path(stack, name),
            body={"spec": {"containers": [{"name": "engine", "image": "registry.invalid/x:1"}]}},
            content_type=STRATEGIC,
        )
    )
    assert "runs the image its plan names" in message, message
    installer.request(
        "PATCH",
        pod_path(stack, name),
        body={"spec": {"containers": [{"name": "sidecar", "image": "placeholder.invalid/s:2"}]}},
        content_type=STRATEGIC,
    )
    assert kube.get("v1", "Pod", name, ns(stack))["spec"]["containers"][1]["image"].endswith("s:2")
    stays_verified(kube, stack, name)


# -- what no owner part reads -------------------------------------------------------------------


def test_what_no_owner_part_reads_moves_no_verdict(
    kube: Kube, stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """An engine Pod carrying what the inventory says no owner part reads (owner references,
    other labels and annotations, volumes, probes, commands, ports, a ServiceAccount ...) is
    placed and verified as any; changing what may change of it, and writing Events, Endpoints
    and ConfigMaps beside it, moves nothing; a scheduling gate holds it for kube-scheduler
    alone, and once lifted the Pod is placed and verified."""
    namespace = ns(stack)
    target = installer.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"owner-{uuid.uuid4().hex[:6]}", "namespace": namespace},
            "data": {"note": "tenant"},
        }
    )
    name = pods("unread")
    pod = engine_pod(ns(stack), LARGE, name=name)
    meta = pod["metadata"]
    meta["labels"]["app.kubernetes.io/name"] = "engine"
    meta["annotations"]["example.com/note"] = "tenant"
    meta["generateName"] = "engine-"
    meta["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": target["metadata"]["name"],
            "uid": target["metadata"]["uid"],
        }
    ]
    spec = pod["spec"]
    spec.update(
        {
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "serviceAccountName": "default",
            "automountServiceAccountToken": False,
            "dnsPolicy": "ClusterFirst",
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["model-store"]}],
            "restartPolicy": "Always",
            "activeDeadlineSeconds": 864000,
            "os": {"name": "linux"},
            "shareProcessNamespace": True,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
        }
    )
    spec["containers"][0].update(
        {
            "command": ["serve"],
            "args": ["--port", "8080"],
            "ports": [{"containerPort": 8080}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            "readinessProbe": {"tcpSocket": {"port": 8080}},
            "lifecycle": {"preStop": {"exec": {"command": ["stop"]}}},
            "workingDir": "/srv",
        }
    )
    installer.create(pod)
    verified(kube, stack, name)
    installer.request(
        "PATCH",
        pod_path(stack, name),
        body={
            "metadata": {
                "labels": {"app.kubernetes.io/name": "other", "example.com/extra": "1"},
                "annotations": {"example.com/note": "changed", "example.com/more": "x" * 4096},
            }
        },
        content_type=MERGE_PATCH,
    )
    installer.create(
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.forged", "namespace": namespace},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "kamiwaza.ai/allocation-controller",
            "reportingInstance": "tenant",
            "action": "VerifyAllocation",
            "reason": "PlanMismatch",
            "note": "forged",
            "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
        }
    )
    installer.create(
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "tmi-extender", "namespace": namespace},
            "subsets": [{"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 443}]}],
        }
    )
    installer.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"other-{uuid.uuid4().hex[:6]}", "namespace": namespace},
            "data": {"bundle.json": "{}"},
        }
    )
    stays_verified(kube, stack, name)

    gated = pods("gated")
    held = engine_pod(ns(stack), LARGE, name=gated)
    held["spec"]["schedulingGates"] = [{"name": "example.com/warm"}]
    installer.create(held)
    kube.wait_for(
        "v1",
        "Pod",
        gated,
        namespace,
        lambda p: (condition(p, "PodScheduled") or {}).get("reason") == "SchedulingGated",
        timeout=30,
        what=f"Pod {gated} held by its scheduling gate",
    )
    installer.request(
        "PATCH",
        pod_path(stack, gated),
        body={"spec": {"schedulingGates": None}},
        content_type=MERGE_PATCH,
    )
    verified(kube, stack, gated)


# -- the API server's own refusals --------------------------------------------------------------


def test_overhead_and_oversized_annotations_are_refused_by_the_api_server(
    stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """An overhead is the owner's RuntimeClass's to give, on an engine Pod and a plain one; the
    annotations the request is read from are capped at 256 KiB in all."""
    plain = plain_pod(stack, pods("overhead"), overhead={"cpu": "1"})
    assert "Pod Overhead" in refused(lambda: installer.create(plain))
    engine = engine_pod(ns(stack), LARGE, name=pods("overhead-engine"))
    engine["spec"]["overhead"] = {"cpu": "1"}
    assert "Overhead" in refused(lambda: installer.create(engine))
    large = plain_pod(stack, pods("annotated"))
    large["metadata"]["annotations"] = {"example.com/pad": "x" * (257 * 1024)}
    assert "262144 bytes" in refused(lambda: installer.create(large), status=422)


def test_the_namespace_admin_can_neither_bind_a_pod_nor_label_its_namespace(
    stack: TenantStack, installer: Kube, pods: Callable[..., str]
) -> None:
    """RBAC: no Binding of the tenant's own places a Pod past the owner's scheduler, and the
    Namespace's labels (the opt-in, the DRA admin-access label) are the owner's."""
    namespace = ns(stack)
    name = pods("unbound")
    pending = plain_pod(stack, name, nodeSelector={"example.com/nowhere": "true"})
    pending["spec"]["schedulerName"] = stack.settings.scheduler_name
    installer.create(pending)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "anywhere"},
    }
    message = refused(
        lambda: installer.request("POST", pod_path(stack, name) + "/binding", body=binding)
    )
    assert "pods/binding" in message, message
    labelled: list[dict[str, Any]] = [
        {OPT_IN_LABEL: None},
        {"resource.kubernetes.io/admin-access": "true"},
    ]
    for labels in labelled:
        message = refused(
            partial(
                installer.request,
                "PATCH",
                f"/api/v1/namespaces/{namespace}",
                body={"metadata": {"labels": labels}},
                content_type=MERGE_PATCH,
            )
        )
        assert 'cannot patch resource "namespaces"' in message, message


# -- a ServiceAccount of the namespace ----------------------------------------------------------


def test_a_service_account_of_the_namespace_is_refused_what_its_admin_is(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    installer: Kube,
    pods: Callable[..., str],
) -> None:
    """The namespace admin makes a ServiceAccount named as the owner's allocation controller,
    binds it `admin` and `pods/status` patch, takes its token and acts as it: the verdict, the
    status and the owner's objects are refused to it as to the admin itself."""
    namespace = ns(stack)
    account = "tmi-allocation-controller"
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + namespace
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    suffix = uuid.uuid4().hex[:6]
    installer.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        }
    )
    installer.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"status-{suffix}", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}],
        }
    )
    for role_kind, role in (("ClusterRole", "admin"), ("Role", f"status-{suffix}")):
        installer.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{role_kind.lower()}-{suffix}", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": role_kind,
                    "name": role,
                },
                "subjects": subject,
            }
        )
    try:
        token = installer.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            },
        )["status"]["token"]
        identity = control_plane.identities.add_service_account(namespace, account, token)
        acting = control_plane.kube(identity)
        name = pods("as-account")
        wait_until(
            lambda: _allowed_to_create(acting, engine_pod(namespace, LARGE, name=name)),
            timeout=30,
            what=f"{identity} to hold admin in {namespace}",
        )
        verified(kube, stack, name)
        forged = {"status": {"conditions": [{"type": CONDITION, "status": "False"}]}}
        message = refused(lambda: acting.patch_status("v1", "Pod", name, namespace, forged))
        assert any(
            words in message
            for words in (
                "only the owner's allocation controller may write",
                "only the cluster's own components may change",
            )
        ), message
        message = refused(
            lambda: acting.patch_status(
                "v1", "Pod", name, namespace, {"status": {"phase": "Succeeded"}}
            )
        )
        assert "status.phase" in message, message
        message = refused(
            lambda: acting.delete("rbac.authorization.k8s.io/v1", "RoleBinding", account, namespace)
        )
        assert f"carries {OWNER_LABEL}" in message, message
        stays_verified(kube, stack, name, seconds=2.0)
    finally:
        for path in (
            f"{rbac}/rolebindings/clusterrole-{suffix}",
            f"{rbac}/rolebindings/role-{suffix}",
            f"{rbac}/roles/status-{suffix}",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}",
        ):
            with contextlib.suppress(ApiError):
                installer.request("DELETE", path)


def _allowed_to_create(kube: Kube, pod: dict[str, Any]) -> bool:
    try:
        kube.create(json.loads(json.dumps(pod)))
    except ApiError as exc:
        if exc.status == 403 and "tenant-mode inference" not in exc.message:
            return False
        raise
    return True
