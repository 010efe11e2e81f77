"""Publishing profile revision N+1 is one new ConfigMap and one changed value, or, following
revisions, the new ConfigMap alone.

The owner publishes the new immutable ConfigMap under its own name and changes one value,
core.inferenceResources.bundleConfigMap; `helm upgrade` does the rest. The chart derives every
place that name appears (the webhook's and the extender's Roles, both settings ConfigMaps) from
that value, and the Deployments whose settings changed roll. The test makes that one edit
(``TenantStack.upgrade``) and checks that each server follows: a Pod created afterwards is
planned with the new revision, placed and verified against it, while a Pod planned with the old
revision stays verified, since the controller still reads every published revision.

With `followRevisions`, no value changes and no Role names a revision: the servers follow the
newest verified signed profile ConfigMap by label, within seconds and without restarting.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kits.profilekit import CLUSTER, Owner, with_profiles
from kits.stackkit import LARGE, dated, whole_h100_profile
from localcluster import ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.stack import (
    CONDITION,
    CONTROLLER_DEPLOYMENT,
    EXTENDER_DEPLOYMENT,
    WEBHOOK_DEPLOYMENT,
    StackSettings,
    TenantStack,
    condition,
    deploy_stack,
    engine_pod,
)
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.plane.kube import ApiError
from localcluster.servers.webhook import PLAN_ANNOTATION, publish_profile

pytestmark = pytest.mark.e2e

R1 = "kamiwaza-inference-profiles-r1"
R2 = "kamiwaza-inference-profiles-r2"


def revision(owner: Owner, namespace: str, version: int, name: str) -> dict[str, Any]:
    envelope = dated(with_profiles(owner, whole_h100_profile()), namespace)
    envelope["version"] = version
    return owner.sign(envelope, name=name)


def planned_with(pod: dict[str, Any]) -> str:
    plan = json.loads(pod["metadata"]["annotations"][PLAN_ANNOTATION])
    return str(plan["bundle"]["sha256"])


@contextlib.contextmanager
def revision_stack(
    control_plane: ControlPlane, prefix: str, *, follow: bool
) -> Iterator[tuple[TenantStack, Owner, dict[str, Any]]]:
    """The stack with revision 1 published, pinned to it by name or following revisions."""
    owner = Owner()
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        bundle_configmap=R1,
        follow_revisions=follow,
        scheduling_timeout_seconds=30,
    )
    admin = control_plane.kube("admin")
    node = f"{prefix.removeprefix('tmi-')}-h100-{uuid.uuid4().hex[:4]}"
    first = revision(owner, namespace, 1, R1)
    with deploy_stack(control_plane, settings, first) as stack:
        control_plane.grant_namespace_admin("tmi-installer", namespace)
        create_fake_nodes(
            admin, [FakeNode(node, gpu_product="NVIDIA-H100-80GB-HBM3", gpus=2, vram_gb=80)]
        )
        assert stack.extender is not None
        stack.extender.wait_nodes([node])
        try:
            yield stack, owner, first
        finally:
            delete_fake_nodes(admin, [node])


# One stack at a time (each runs the owner's scheduler): each fixture serves one test.
@pytest.fixture
def setup(control_plane: ControlPlane) -> Iterator[tuple[TenantStack, Owner, dict[str, Any]]]:
    with revision_stack(control_plane, "tmi-rev", follow=False) as up:
        yield up


def verified_pod(control_plane: ControlPlane, stack: TenantStack, name: str) -> dict[str, Any]:
    return control_plane.kube("admin").wait_for(
        "v1",
        "Pod",
        name,
        stack.settings.namespace,
        lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
        timeout=60,
        what=f"Pod {name} verified",
    )


def test_one_value_rolls_a_new_revision_out_to_every_server(
    control_plane: ControlPlane, setup: tuple[TenantStack, Owner, dict[str, Any]]
) -> None:
    stack, owner, first = setup
    namespace = stack.settings.namespace
    installer = control_plane.kube("tmi-installer")
    before = f"before-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=before))
    old = verified_pod(control_plane, stack, before)
    assert planned_with(old) == first["data"]["bundle.sha256"]

    # The owner publishes revision 2 beside revision 1 ...
    second = revision(owner, namespace, 2, R2)
    publish_profile(control_plane, second)
    # ... and changes one value.
    rolled = stack.upgrade(bundle_configmap=R2)
    assert sorted(rolled) == sorted(
        [WEBHOOK_DEPLOYMENT, CONTROLLER_DEPLOYMENT, EXTENDER_DEPLOYMENT]
    )

    after = f"after-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=after))
    new = verified_pod(control_plane, stack, after)
    assert planned_with(new) == second["data"]["bundle.sha256"]
    assert new["spec"]["nodeName"]
    # The old Pod keeps the verdict it was given against the revision it was planned with.
    kept = control_plane.kube("admin").get("v1", "Pod", before, namespace)
    assert condition(kept, CONDITION) == condition(old, CONDITION)
    for pod in (before, after):
        control_plane.kube("admin").delete("v1", "Pod", pod, namespace, grace_period_seconds=0)


# -- following the newest revision: nothing to change ----------------------------------------


@pytest.fixture
def following(
    control_plane: ControlPlane,
) -> Iterator[tuple[TenantStack, Owner, dict[str, Any]]]:
    with revision_stack(control_plane, "tmi-follow", follow=True) as up:
        yield up


def _pids(stack: TenantStack) -> list[int]:
    processes = [stack.webhook.process if stack.webhook else None]
    processes.append(stack.extender.process if stack.extender else None)
    assert stack.controller is not None
    processes += [replica.process for replica in stack.controller.replicas]
    return [p.pid for p in processes if p is not None]


def test_following_a_new_revision_takes_only_its_publication(
    control_plane: ControlPlane, following: tuple[TenantStack, Owner, dict[str, Any]]
) -> None:
    stack, owner, first = following
    namespace = stack.settings.namespace
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    # No Role names a revision: the servers read the namespace's signed profiles by label.
    for role in ("tmi-webhook-read-profiles",):
        rules = admin.get("rbac.authorization.k8s.io/v1", "Role", role, namespace)["rules"]
        assert all(
            "resourceNames" not in rule for rule in rules if "configmaps" in rule["resources"]
        )
    pids = _pids(stack)
    before = f"before-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=before))
    old = verified_pod(control_plane, stack, before)
    assert planned_with(old) == first["data"]["bundle.sha256"]

    # The owner publishes revision 2, and that is all.
    second = revision(owner, namespace, 2, R2)
    published = time.monotonic()
    publish_profile(control_plane, second)
    wanted: str = second["data"]["bundle.sha256"]

    def planned_with_r2() -> bool:
        probe = engine_pod(namespace, LARGE, name=f"probe-{uuid.uuid4().hex[:6]}")
        return planned_with(installer.create(probe, dry_run=True)) == wanted

    wait_until(planned_with_r2, timeout=30, what="the webhook to follow revision 2")
    followed_after = time.monotonic() - published
    after = f"after-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=after))
    new = verified_pod(control_plane, stack, after)
    assert planned_with(new) == wanted
    assert new["spec"]["nodeName"]
    kept = admin.get("v1", "Pod", before, namespace)
    assert condition(kept, CONDITION) == condition(old, CONDITION)
    # Followed within seconds, and by the same processes: nothing restarted.
    assert followed_after < 30
    assert _pids(stack) == pids
    for pod in (before, after):
        admin.delete("v1", "Pod", pod, namespace, grace_period_seconds=0)


# -- a rollback is the owner's to allow --------------------------------------------------------


def _clear_record(kube: Kube, namespace: str) -> None:
    kube.request(
        "PATCH",
        f"/apis/tmi.kamiwaza.ai/v1alpha1/tenantadmissions/{namespace}/status",
        body={"status": None},
        content_type="application/merge-patch+json",
    )


def _record(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = control_plane.kube("admin").get(
        "tmi.kamiwaza.ai/v1alpha1", "TenantAdmission", namespace
    )
    return found


def test_a_replayed_older_revision_places_nothing(
    control_plane: ControlPlane, setup: tuple[TenantStack, Owner, dict[str, Any]]
) -> None:
    """The tenant's namespace admin deletes revision 2 and recreates it with revision 1's signed
    data (the ConfigMap's name is not signed, and the webhook's floor is the tenant's). Its
    webhook plans under revision 1, but the owner's extender recorded version 2 in the tenant's
    TenantAdmission, which the tenant cannot write, and places nothing below it, across a
    restart too, until the owner lowers the floor."""
    stack, owner, first = setup
    namespace = stack.settings.namespace
    installer = control_plane.kube("tmi-installer")
    admin = control_plane.kube("admin")
    second = revision(owner, namespace, 2, R2)
    publish_profile(control_plane, second)
    stack.upgrade(bundle_configmap=R2)
    placed = f"r2-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=placed))
    assert (
        planned_with(verified_pod(control_plane, stack, placed)) == second["data"]["bundle.sha256"]
    )
    record = wait_until(
        lambda: (
            _record(control_plane, namespace).get("status", {}).get("highestVerifiedVersion") == 2
        ),
        timeout=30,
        what="the extender to record version 2",
    )
    assert record
    # The record is the owner's: the tenant may neither reset nor edit it.
    with pytest.raises(ApiError) as refused:
        installer.delete("tmi.kamiwaza.ai/v1alpha1", "TenantAdmission", namespace)
    assert refused.value.status == 403
    with pytest.raises(ApiError) as refused:
        _clear_record(installer, namespace)
    assert refused.value.status == 403

    replayed = copy.deepcopy(first)
    replayed["metadata"]["name"] = R2
    installer.delete("v1", "ConfigMap", R2, namespace)
    installer.create(replayed)
    wanted: str = first["data"]["bundle.sha256"]

    def planned_with_r1() -> bool:
        probe = engine_pod(namespace, LARGE, name=f"probe-{uuid.uuid4().hex[:6]}")
        return planned_with(installer.create(probe, dry_run=True)) == wanted

    wait_until(planned_with_r1, timeout=30, what="the tenant's webhook to plan under r1 again")
    assert stack.extender is not None
    for restarted in (False, True):
        if restarted:
            stack.extender.restart()
        name = f"replay-{uuid.uuid4().hex[:6]}"
        installer.create(engine_pod(namespace, LARGE, name=name))
        pod = admin.wait_for(
            "v1",
            "Pod",
            name,
            namespace,
            lambda p: "a version below the configured floor" in scheduled_message(p),
            timeout=60,
            what="the scheduler to report the extender's rollback refusal",
        )
        assert not pod["spec"].get("nodeName"), pod["spec"].get("nodeName")
        admin.delete("v1", "Pod", name, namespace, grace_period_seconds=0)

    # The owner allows the rollback: its configured floor is already 1, so it clears the record
    # (docs/operations.md, "A profile rollback is refused").
    _clear_record(admin, namespace)
    allowed = f"allowed-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(namespace, LARGE, name=allowed))
    assert verified_pod(control_plane, stack, allowed)["spec"]["nodeName"]
    for pod_name in (placed, allowed):
        admin.delete("v1", "Pod", pod_name, namespace, grace_period_seconds=0)


def scheduled_message(pod: dict[str, Any]) -> str:
    return str((condition(pod, "PodScheduled") or {}).get("message", ""))
