"""Least privilege, proven: each server uses every rule the chart grants it, and no more.

The stack runs every tmi server under the ServiceAccount the chart creates, so each request it
makes is authorised by the chart's Roles alone. The API server's audit log records each request
a ServiceAccount makes (localcluster/data/audit-policy.yaml). After driving the stack through
what the servers do in operation (engine Pods planned, placed and verified; a Deployment rolled
out and deleted, so Pods come and go; the controller's leader stopped so the standby takes the
Lease; the extender recording the profile version it verified; the tenant's uninstall hook), the
test fails on any request that was forbidden and on any (verb, resource, name) a rule of the
chart grants that no request used.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME, DEFAULT_SCHEDULER_NAMESPACE
from kits.stackkit import LARGE, tenant_stack, whole_h100_envelope
from localcluster import ApiError, ControlPlane, FakeNode, create_fake_nodes
from localcluster.install.install import CLEANUP_HOOK, run_uninstall_hook
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.servers.controller_process import CONTROLLER_LEASE
from localcluster.servers.webhook import ENGINE_LABEL, REQUEST_ANNOTATION

pytestmark = pytest.mark.e2e

REPLICAS = 2


@dataclass
class Driven:
    stack: TenantStack
    since: datetime


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def driven(control_plane: ControlPlane) -> Iterator[Driven]:
    """The stack, after it has done everything the servers do in operation."""
    since = datetime.now(UTC)
    admin = control_plane.kube("admin")
    # A fresh install: the owner's scheduler and controller create their Leases in the owner's
    # namespace (an earlier stack's outlive it).
    for lease in (DEFAULT_SCHEDULER_NAME, CONTROLLER_LEASE):
        admin.delete("coordination.k8s.io/v1", "Lease", lease, DEFAULT_SCHEDULER_NAMESPACE)
    node = f"lp-h100-{uuid.uuid4().hex[:4]}"
    with tenant_stack(control_plane, "tmi-lp", whole_h100_envelope, 30) as stack:
        create_fake_nodes(
            admin, [FakeNode(node, gpu_product="NVIDIA-H100-80GB-HBM3", gpus=4, vram_gb=80)]
        )
        try:
            assert stack.extender is not None and stack.controller is not None
            stack.extender.wait_nodes([node])
            _roll_a_deployment(control_plane, stack)
            _remove_an_engine_label(control_plane, stack)
            # The standby takes over: it reads, then updates, the Lease the leader held.
            leader = stack.controller.leader_index()
            stack.controller.stop(leader)
            stack.controller.wait_leader()
            stack.controller.start(leader)
            # Last, the tenant's uninstall hook removes its webhook configuration.
            assert stack.tenant is not None
            hook = run_uninstall_hook(control_plane, stack.tenant)
            assert hook.returncode == 0 and "removed" in hook.stdout, hook.stderr
            yield Driven(stack, since)
        finally:
            delete_fake_nodes(admin, [node])


def _roll_a_deployment(control_plane: ControlPlane, stack: TenantStack) -> None:
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    name = f"lp-{uuid.uuid4().hex[:6]}"
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    installer.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": REPLICAS,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {
                        "labels": {"app": name, ENGINE_LABEL: name},
                        "annotations": {REQUEST_ANNOTATION: json.dumps(LARGE)},
                    },
                    "spec": {
                        "containers": [{"name": "engine", "image": "placeholder.invalid/e:1"}],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        }
    )

    def verified_pods() -> bool:
        listed = admin.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"app={name}"}
        )["items"]
        return len(listed) == REPLICAS and all(
            (condition(p, CONDITION) or {}).get("status") == "True" for p in listed
        )

    admin.wait_for(
        "apps/v1",
        "Deployment",
        name,
        namespace,
        lambda _: verified_pods(),
        timeout=120,
        what=f"{REPLICAS} verified Pods of {name}",
    )
    # Pods leave: the controller looks each departed one up again.
    with contextlib.suppress(ApiError):
        admin.request("DELETE", path, query={"propagationPolicy": "Foreground"})

    def gone() -> bool:
        listed = admin.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"app={name}"}
        )["items"]
        return not listed

    admin.wait_for(
        "v1",
        "Namespace",
        namespace,
        None,
        lambda _: gone(),
        timeout=60,
        what=f"the Pods of {name} to be deleted",
    )


def _remove_an_engine_label(control_plane: ControlPlane, stack: TenantStack) -> None:
    """A verified Pod loses its engine label: the controller reads it afresh (pods get) and
    withdraws the verdict."""
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    name = f"lp-relabel-{uuid.uuid4().hex[:6]}"
    control_plane.kube("tmi-installer").create(engine_pod(namespace, LARGE, name=name))
    admin.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
        timeout=60,
        what=f"Pod {name} verified",
    )
    admin.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        body={"metadata": {"labels": {ENGINE_LABEL: None}}},
        content_type="application/merge-patch+json",
    )
    admin.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("reason") == "EngineLabelRemoved",
        timeout=60,
        what=f"Pod {name} to lose its verdict",
    )
    admin.delete("v1", "Pod", name, namespace, grace_period_seconds=0)


@dataclass(frozen=True)
class Grant:
    """One (verb, resource) a rule of the chart grants, where, and to whom."""

    user: str
    role: str
    group: str
    resource: str
    verb: str
    namespace: str | None
    names: tuple[str, ...]

    def used_by(self, event: dict[str, Any]) -> bool:
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        if (ref.get("apiGroup") or "", resource, event.get("verb")) != (
            self.group,
            self.resource,
            self.verb,
        ):
            return False
        if self.namespace is not None and ref.get("namespace") != self.namespace:
            return False
        # A list or watch narrowed by a metadata.name field selector carries no name here.
        return not self.names or not ref.get("name") or ref["name"] in self.names


def chart_grants(stack: TenantStack) -> list[Grant]:
    """Every (verb, resource) the chart's own Roles and ClusterRoles grant a ServiceAccount."""
    assert stack.tenant is not None and stack.owner is not None
    docs = stack.tenant.docs + stack.owner.docs
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    grants: list[Grant] = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles.get((ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"]))
        if role is None:
            continue  # a built-in role (system:kube-scheduler, ...): not the chart's to trim
        for subject in binding["subjects"]:
            user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            grants.append(
                                Grant(
                                    user,
                                    ref["name"],
                                    group,
                                    resource,
                                    verb,
                                    namespace,
                                    tuple(rule.get("resourceNames") or ()),
                                )
                            )
    return grants


def events(control_plane: ControlPlane, driven: Driven, user: str) -> list[dict[str, Any]]:
    return [
        e
        for e in control_plane.audit_events(user)
        if _timestamp(e["requestReceivedTimestamp"]) >= driven.since
    ]


def server_users(driven: Driven) -> list[str]:
    s = driven.stack.settings
    return [
        f"system:serviceaccount:{s.namespace}:tmi-webhook",
        f"system:serviceaccount:{s.scheduler_namespace}:tmi-allocation-controller",
        f"system:serviceaccount:{s.scheduler_namespace}:tmi-extender",
        f"system:serviceaccount:{s.scheduler_namespace}:{s.scheduler_name}",
        f"system:serviceaccount:{s.namespace}:{CLEANUP_HOOK}",
    ]


def test_every_server_ran_as_the_charts_service_account(
    control_plane: ControlPlane, driven: Driven
) -> None:
    for user in server_users(driven):
        assert events(control_plane, driven, user), f"{user} made no request"


def test_no_request_of_a_server_was_forbidden(control_plane: ControlPlane, driven: Driven) -> None:
    forbidden = [
        (user, e["verb"], e.get("objectRef"))
        for user in server_users(driven)
        for e in events(control_plane, driven, user)
        if (e.get("responseStatus") or {}).get("code") == 403
    ]
    assert not forbidden


def test_every_rule_the_chart_grants_is_used(control_plane: ControlPlane, driven: Driven) -> None:
    grants = chart_grants(driven.stack)
    granted_users = {g.user for g in grants}
    assert set(server_users(driven)) == granted_users
    unused = [
        (g.role, g.verb, g.group or "core", g.resource, g.names)
        for g in grants
        if not any(g.used_by(e) for e in events(control_plane, driven, g.user))
    ]
    assert not unused, f"granted but never used: {unused}"
