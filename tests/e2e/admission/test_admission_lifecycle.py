"""What the owner's admission policies do about how a Pod is made and how tmi is installed, in a
real 1.36 API server, acting as the tenant's admin.

Whatever makes the Pod (a Deployment, Job, StatefulSet or DaemonSet controller) meets the same
policies; the tenant's ResourceClaims are refused outright; an uninstall of the tenant part or an
upgrade of the owner's refuses no Pod that is not an engine Pod. The webhook is a local process
(``localcluster.servers.webhook``), so a test can stop it precisely.
"""

from __future__ import annotations

import copy
import threading
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from inference_policy.admission.access_cel import FORGERY_PREFIX
from kits.profilekit import NAMESPACE, request
from kits.stackkit import refusal
from kits.webhookkit import engine_pod, plain_pod
from localcluster import ApiError, ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.install import (
    CLEANUP_HOOK,
    Rendered,
    render_owner_admission,
    render_tenant,
    run_uninstall_hook,
    wait_allowed,
)
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.servers.webhook import webhook_configuration
from localcluster.servers.webhook_objects import apply_webhook_rbac, chart_values_for
from tests.e2e.policykit import VOID, guard_prefix, named, plans

if TYPE_CHECKING:
    from tests.e2e.webhook_fixtures import Deployed

pytest_plugins = ["tests.e2e.webhook_fixtures"]
pytestmark = pytest.mark.e2e


# -- whatever makes the Pod, and claims made directly ---------------------------------------------


def _workload(kind: str, name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": name}}, "spec": pod_spec}
    spec: dict[str, Any] = {"template": template}
    api = "apps/v1"
    if kind == "Job":
        api = "batch/v1"
        template["spec"] = {**pod_spec, "restartPolicy": "Never"}
        spec["backoffLimit"] = 0
    else:
        spec["selector"] = {"matchLabels": {"app": name}}
    if kind == "StatefulSet":
        spec["serviceName"] = name
    if kind in ("Deployment", "StatefulSet"):
        spec["replicas"] = 1
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def _failed_create(kube: Kube, owner_prefix: str, words: str) -> bool:
    events = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return any(
        e.get("reason") == "FailedCreate"
        and str(e.get("involvedObject", {}).get("name", "")).startswith(owner_prefix)
        and words in str(e.get("message", ""))
        for e in events
    )


@pytest.mark.parametrize("kind", ["Deployment", "Job", "StatefulSet", "DaemonSet"])
def test_pods_made_by_workload_controllers_are_guarded_and_shielded(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube, kind: str
) -> None:
    """The tenant's admin makes the Pod through a controller instead: the controller's create is
    refused the same way, and a plain workload's Pod is created shielded."""
    forged_name = f"forged-{kind.lower()}-{uuid.uuid4().hex[:6]}"
    plain_name = f"plain-{kind.lower()}-{uuid.uuid4().hex[:6]}"
    miner = {"name": "miner", "image": "busybox:1.37"}
    forged = _workload(
        kind,
        forged_name,
        {"containers": [{**miner, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    )
    plain = _workload(kind, plain_name, {"containers": [miner]})
    admin = control_plane.kube("admin")
    created = []
    node = f"ds-{uuid.uuid4().hex[:6]}"
    if kind == "DaemonSet":
        # A DaemonSet makes a Pod per node; one KWOK node is enough.
        create_fake_nodes(admin, [FakeNode(node, gpus=0)])
    try:
        for doc in (forged, plain):
            installer.create(doc)
            created.append(doc)
        prefix = guard_prefix(webhook.hook) + FORGERY_PREFIX
        wait_until(
            lambda: _failed_create(admin, forged_name, prefix),
            timeout=60,
            what=f"the {kind} controller's create to be refused by the guard",
        )

        def plain_pods() -> list[dict[str, Any]] | None:
            # Done once the controller's Pod exists: an empty list is "not yet", not an answer.
            items: list[dict[str, Any]] = admin.request(
                "GET",
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                query={"labelSelector": f"app={plain_name}"},
            )["items"]
            return items or None

        (pod, *_) = wait_until(plain_pods, timeout=60, what=f"the plain {kind}'s Pod")
        assert pod["spec"]["containers"][0]["env"] == [VOID]
        forged_pods = admin.request(
            "GET",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            query={"labelSelector": f"app={forged_name}"},
        )["items"]
        assert forged_pods == []
    finally:
        for doc in created:
            admin.delete(doc["apiVersion"], doc["kind"], doc["metadata"]["name"], NAMESPACE)
        if kind == "DaemonSet":
            delete_fake_nodes(admin, [node])


CLAIMS: dict[str, dict[str, Any]] = {
    "ResourceClaim": {
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        }
    },
    "ResourceClaimTemplate": {
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                }
            }
        }
    },
}


@pytest.mark.parametrize("kind", CLAIMS)
def test_tenant_claims_are_refused(control_plane: ControlPlane, installer: Kube, kind: str) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": f"tenant-{uuid.uuid4().hex[:6]}", "namespace": NAMESPACE},
        **CLAIMS[kind],
    }
    # Refused to the namespace admin, whether by RBAC or by the policy, and by the policy to
    # anyone RBAC lets through.
    with pytest.raises(ApiError) as as_tenant:
        installer.create(claim, dry_run=True)
    assert as_tenant.value.status == 403, as_tenant.value
    with pytest.raises(ApiError) as as_admin:
        control_plane.kube("admin").create(claim, dry_run=True)
    assert as_admin.value.status == 403, as_admin.value
    # With no dra binding the owner published no class, so every claim is refused.
    assert (
        f"tenant-mode inference: {kind} {claim['metadata']['name']} names a DeviceClass the "
        "owner did not publish for this namespace; the owner's classes here are none"
    ) in as_admin.value.message


# -- uninstall and upgrade never block the namespace ---------------------------------------------


def _uninstall(installer: Kube, tenant: Rendered, kamiwaza_pods: Any) -> ApiError:
    """The tenant part's objects deleted by its installer; then a plain Pod is created,
    shielded, and an engine Pod refused: its refusal."""
    for doc in tenant.applied():
        meta = doc["metadata"]
        installer.delete(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))
    pod = named(plain_pod(), "tenant")
    pod["metadata"]["name"] = kamiwaza_pods("tenant")
    assert installer.create(pod)["spec"]["containers"][0]["env"] == [VOID]
    return refusal(installer, engine_pod(request(), name=f"engine-{uuid.uuid4().hex[:6]}"))


def test_with_the_tenant_part_uninstalled_plain_pods_are_created_and_engine_pods_refused(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube, kamiwaza_pods: Any
) -> None:
    """`helm uninstall` of the tenant release by its installer: the webhook's objects and its
    server are gone, the owner's configuration and policies stay. Engine Pods are refused (the
    owner's entry still fails closed) and every other Pod is created, shielded."""
    hook = webhook.hook
    tenant = render_tenant(chart_values_for(hook.settings), NAMESPACE)
    hook.stop_process()
    try:
        err = _uninstall(installer, tenant, kamiwaza_pods)
        assert err.status == 500 and "failed calling webhook" in err.message, err
    finally:
        apply_webhook_rbac(control_plane, hook.settings)
        hook.start()
        wait_until(lambda: plans(hook), timeout=60, what="the reinstalled webhook to plan")


def test_the_tenant_uninstall_hook_removes_its_webhook_configuration_and_no_other(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube, kamiwaza_pods: Any
) -> None:
    """`helm uninstall` of the tenant release runs its pre-delete Job first: `tmi
    remove-webhooks`, as the Job's ServiceAccount under the owner's grant, deletes the owner's
    configuration that calls this namespace's webhook, so no entry outlives its server. It may
    read and delete that one only. Afterwards plain Pods are created, shielded, and engine Pods
    are refused by the owner's guard (no plan, no shield), not by a webhook that is gone."""
    hook = webhook.hook
    assert hook.configuration is not None
    name = hook.configuration["metadata"]["name"]
    tenant = render_tenant(chart_values_for(hook.settings), NAMESPACE)
    admin = control_plane.kube("admin")
    owner = render_owner_admission(tenant_namespace=NAMESPACE)
    grant = [d for d in owner.docs if d["metadata"]["name"].startswith("kamiwaza-tmi-webhook-")]
    assert {d["kind"] for d in grant} == {"ClusterRole", "ClusterRoleBinding"}
    for doc in grant:
        admin.apply(doc)
    user = f"system:serviceaccount:{NAMESPACE}:{CLEANUP_HOOK}"
    wait_allowed(
        control_plane,
        user,
        [
            {
                "group": "admissionregistration.k8s.io",
                "resource": "mutatingwebhookconfigurations",
                "verb": "delete",
                "name": name,
            }
        ],
    )
    try:
        done = run_uninstall_hook(control_plane, tenant)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"removed MutatingWebhookConfiguration {name}", done.stdout
        as_hook = control_plane.kube(f"sa:{NAMESPACE}:{CLEANUP_HOOK}")
        with pytest.raises(ApiError) as other:
            as_hook.request(
                "DELETE",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                f"kamiwaza-tenant-inference-{uuid.uuid4().hex[:4]}",
            )
        assert other.value.status == 403
        with pytest.raises(ApiError) as gone:
            admin.get("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", name)
        assert gone.value.status == 404
        hook.configuration = None
        hook.stop_process()
        err = _uninstall(installer, tenant, kamiwaza_pods)
        assert err.status == 403 and guard_prefix(hook) in err.message, err
        # Run again (a retried uninstall): nothing left to remove, and it says so.
        again = run_uninstall_hook(control_plane, tenant)
        assert again.returncode == 0 and "no webhook configuration selects" in again.stdout
    finally:
        installer.delete("v1", "ServiceAccount", CLEANUP_HOOK, NAMESPACE)
        for doc in grant:
            admin.delete(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
        apply_webhook_rbac(control_plane, hook.settings)
        hook.start()
        # The owner's `helm upgrade` restores the configuration.
        hook.install_configuration(policies=hook.policies)
        wait_until(lambda: plans(hook), timeout=60, what="the reinstalled webhook to plan")


def test_an_owner_upgrade_under_a_stream_of_creates_fails_none(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube
) -> None:
    """`helm upgrade` of the owner release (every owner object applied again, here with a new
    chart label, and each policy changed so that the API server compiles it again) while the
    tenant creates plain Pods without pause: none is refused, every one is shielded."""
    hook = webhook.hook
    assert hook.configuration is not None
    stop = threading.Event()
    created: list[str] = []
    failures: list[str] = []

    def stream() -> None:
        while not stop.is_set():
            try:
                stored = installer.create(named(plain_pod(), "stream"), dry_run=True)
            except ApiError as exc:
                failures.append(exc.message)
                continue
            if stored["spec"]["containers"][0].get("env") != [VOID]:
                failures.append(f"{stored['metadata']['name']} was not shielded")
            created.append(stored["metadata"]["name"])

    upgraded = [copy.deepcopy(doc) for doc in hook.policies]
    configuration = webhook_configuration(
        f"{hook.url}/mutate", control_plane.ca_bundle, namespace=hook.settings.namespace
    )
    for doc in [*upgraded, configuration]:
        doc["metadata"].setdefault("labels", {})["helm.sh/chart"] = "tmi-upgraded"
        if doc["kind"] in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"):
            conditions = doc["spec"].setdefault("matchConditions", [])
            conditions.append({"name": "upgraded", "expression": "true"})
    admin = control_plane.kube("admin")
    worker = threading.Thread(target=stream, daemon=True)
    worker.start()
    try:
        wait_until(lambda: len(created) >= 20, timeout=60, what="the stream to run")
        for doc in [*upgraded, configuration]:
            admin.apply(doc)
        applied_at = len(created)
        wait_until(
            lambda: len(created) >= applied_at + 100, timeout=120, what="creates after the upgrade"
        )
    finally:
        stop.set()
        worker.join(timeout=30)
    assert failures == []


def _per_tenant(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A policy object as the releases before policies were bound once rendered it for one
    tenant: named for the namespace, its parameters the cluster-scoped TenantAdmission of that
    name, bound to the namespace by name as well as by the opt-in label."""
    old = copy.deepcopy(doc)
    metadata = old["metadata"]
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        metadata.pop(key, None)
    metadata["name"] = f"{metadata['name']}-{namespace}"
    spec = old["spec"]
    if "policyName" in spec:
        spec["policyName"] = f"{spec['policyName']}-{namespace}"
    if "paramKind" in spec:
        spec["paramKind"]["kind"] = "TenantAdmission"
    if "paramRef" in spec:
        spec["paramRef"]["name"] = namespace
    selector = (spec.get("matchResources") or {}).get("namespaceSelector")
    if selector is not None:
        selector.setdefault("matchExpressions", []).append(
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}
        )
    return old


def test_an_upgrade_from_per_tenant_policies_admits_nothing_unchecked_and_fails_no_create(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube
) -> None:
    """From the per-tenant shape (a copy of each policy and binding per tenant, reading the
    cluster-scoped TenantAdmission) to policies bound once reading the TenantPolicy in the
    namespace, as `helm upgrade` makes it: new objects in order of kind name (Helm's order for
    kinds it does not know, so the TenantPolicy comes before the validating bindings that read
    it), then the old ones deleted. Through it all, a plain Pod is created and shielded and a
    Pod reaching for a GPU is refused by a guard: nothing admitted unchecked, nothing refused
    for want of parameters."""
    hook = webhook.hook
    admin = control_plane.kube("admin")
    shared = [d for d in hook.policies if d["kind"].endswith(("AdmissionPolicy", "Binding"))]
    params = [d for d in hook.policies if d["kind"] == "TenantPolicy"]
    assert shared and params
    old = [_per_tenant(d, NAMESPACE) for d in shared]
    # The state before the upgrade: the per-tenant objects only.
    for doc in old:
        admin.apply(doc)
    for doc in [*shared, *params]:
        metadata = doc["metadata"]
        admin.delete(doc["apiVersion"], doc["kind"], metadata["name"], metadata.get("namespace"))
    forged = plain_pod()
    forged["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}

    def old_guard_acts() -> bool:
        try:
            installer.create(named(forged, "probe"), dry_run=True)
        except ApiError as exc:
            return f"'kamiwaza-tmi-guard-{NAMESPACE}'" in exc.message
        return False

    wait_until(old_guard_acts, timeout=60, what="the per-tenant guard to act alone")
    stop = threading.Event()
    created: list[str] = []
    failures: list[str] = []

    def stream() -> None:
        while not stop.is_set():
            try:
                stored = installer.create(named(plain_pod(), "stream"), dry_run=True)
            except ApiError as exc:
                failures.append(exc.message)
            else:
                if stored["spec"]["containers"][0].get("env") != [VOID]:
                    failures.append(f"{stored['metadata']['name']} was not shielded")
                created.append(stored["metadata"]["name"])
            try:
                installer.create(named(forged, "forged"), dry_run=True)
            except ApiError as exc:
                if exc.status != 403 or "ValidatingAdmissionPolicy 'kamiwaza-tmi-guard" not in (
                    exc.message
                ):
                    failures.append(exc.message)
            else:
                failures.append("a Pod reaching for a GPU was admitted")

    worker = threading.Thread(target=stream, daemon=True)
    worker.start()
    try:
        wait_until(lambda: len(created) >= 20, timeout=60, what="the stream to run")
        for doc in sorted([*params, *shared], key=lambda d: str(d["kind"])):
            admin.apply(copy.deepcopy(doc))
        for doc in old:
            admin.delete(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
        upgraded_at = len(created)
        wait_until(lambda: len(created) >= upgraded_at + 100, timeout=120, what="creates after it")
    finally:
        stop.set()
        worker.join(timeout=30)
    assert failures == []

    # The shared guard alone refuses, once the API server has let the deleted ones go (it
    # drops a policy asynchronously, like a webhook configuration).
    def refused_by_the_shared_guard_alone() -> bool:
        try:
            installer.create(named(forged, "after"), dry_run=True)
        except ApiError as exc:
            return "ValidatingAdmissionPolicy 'kamiwaza-tmi-guard' " in exc.message
        raise AssertionError("a Pod reaching for a GPU was admitted after the upgrade")

    wait_until(refused_by_the_shared_guard_alone, timeout=60, what="the shared guard alone")
