"""Generated inputs through the owner's admission policies in a real API server, as the tenant's
namespace admin: a short sample of the fuzz targets' status patches and device Pods.

The fuzz targets (`tests/fuzz`) judge the Python side at length, but the policies are CEL inside
kube-apiserver and no CEL evaluator is installed here, so this module sends a sample of what the
generators make (`tests.fuzz.statuskit`, `tests.fuzz.devicekit`) to the chart's own policies for
a fresh opted-in namespace, with no webhook and no other tmi server: every decision below is the
API server's. Each request is a server-side dry run, so nothing changes between them, and the
whole module stays well under a minute once the session's control plane is up.

* Status patches (merge patches of `pods/status`, as `tmi-installer`, who holds the seed's
  `pods/status` patch): whatever the API server stores changes nothing but the tenant's own
  conditions (the rule restated in `statuskit.judge`); a patch the rule allows is never refused
  by a policy; a refusal names an owner policy; and enough of the sample reaches the policy to
  mean something.
* Device Pods (plain Pods with device variables of every vendor, envFrom prefixes and CDI or
  lookalike annotation keys): the guard refuses exactly what the access predicate
  (`engine_pod.admission_refusal`) refuses, and no stored Pod carries a device variable, envFrom
  source or CDI annotation the rule restated in `devicekit` refuses.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from inference_policy.admission.engine_pod import admission_refusal
from inference_policy.admission.status_cel import STATUS_REFUSAL
from inference_policy.base.wire import ALLOCATION_VERIFIED
from localcluster import ApiError, ControlPlane, Kube
from localcluster.install.install import grant_installer
from localcluster.plane.kube import JSON
from localcluster.servers.admission_policies import (
    denied_by_guard,
    install_policies,
    remove_policies,
    render_policies,
    verdict_writer,
)
from localcluster.servers.webhook_objects import set_opt_in
from tests.e2e.policykit import SCHEDULER
from tests.fuzz.devicekit import add_one_device_surface, device_findings
from tests.fuzz.fuzzkit import chance
from tests.fuzz.statuskit import judge, merged, status_patches

pytestmark = pytest.mark.e2e
SAMPLE = 80
MERGE_PATCH = "application/merge-patch+json"
INSTALLER = "tmi-installer"
IMAGE = "placeholder.invalid/app:1"


def _sample(examples: int = SAMPLE) -> settings:
    # Generation only: a disagreement is collected and reported whole, not shrunk against a
    # live API server. The same examples every run (derandomized): the mix each test asserts
    # (a quarter refused, say) is the corpus's, not a draw's, so a run never fails by chance;
    # `make fuzz` draws afresh, at scale.
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )


@pytest.fixture(scope="module")
def tenant(control_plane: ControlPlane) -> Iterator[tuple[str, list[JSON]]]:
    """A fresh namespace, opted in, with the chart's policies for it and `tmi-installer` as its
    installer (admin and `pods/status` patch); the policies go afterwards."""
    namespace = f"tmi-gen-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(namespace)
    set_opt_in(control_plane, namespace, True)
    docs = render_policies(namespace, SCHEDULER)
    install_policies(control_plane, docs, namespace)
    grant_installer(control_plane, namespace)
    try:
        yield namespace, docs
    finally:
        remove_policies(control_plane, docs, namespace)
        set_opt_in(control_plane, namespace, False)


def _pod(namespace: str, name: str) -> dict[str, Any]:
    # A scheduler nobody runs: nothing but this test writes the Pod's status.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": {}},
        "spec": {
            "schedulerName": "tmi-nobody",
            "containers": [{"name": "app", "image": IMAGE}],
        },
    }


# -- status patches ----------------------------------------------------------------------------

RICH_STATUS = {
    "message": "waiting for a scheduler",
    "reason": "Waiting",
    # So that a patch of `hostIPs` alone is valid (its first must be `hostIP`).
    "hostIP": "10.0.0.1",
    "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
        {"type": "kamiwaza.ai/AllocationVerified", "status": "False", "reason": "Pending"},
        {"type": "tmi.kamiwaza.ai/Anything", "status": "True"},
        {"type": "example.com/Warm", "status": "True", "reason": "Loaded"},
    ],
}


def _refused_by_owner(message: str) -> bool:
    return "ValidatingAdmissionPolicy 'kamiwaza-tmi-" in message


def test_generated_status_patches_change_only_the_tenants_own_conditions(
    control_plane: ControlPlane, tenant: tuple[str, list[JSON]]
) -> None:
    namespace, _ = tenant
    admin = control_plane.kube("admin")
    installer = control_plane.kube(INSTALLER)
    name = f"status-sample-{uuid.uuid4().hex[:6]}"
    installer.create(_pod(namespace, name))
    try:
        # The old status is made rich by a writer the policy trusts (the owner's controller),
        # so that patches find system, owner and tenant conditions to change.
        verdict_writer(control_plane, namespace).request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            body={"status": RICH_STATUS},
            content_type=MERGE_PATCH,
        )
        old = installer.get("v1", "Pod", name, namespace)["status"]
        assert {c["type"] for c in old["conditions"]} >= {"example.com/Warm", "PodScheduled"}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        wrong: list[tuple[str, Any, str]] = []
        fell: Counter[str] = Counter()

        @_sample()
        @given(status_patches(old))
        def run(patch: dict[str, Any]) -> None:
            intended = judge(old, merged(old, patch))
            changes = (*intended.fields, *intended.conditions)
            try:
                stored = installer.request(
                    "PATCH",
                    path,
                    body={"status": patch},
                    content_type=MERGE_PATCH,
                    query={"dryRun": "All"},
                )
            except ApiError as exc:
                if exc.status == 403 and _refused_by_owner(exc.message):
                    fell["refused"] += 1
                    if intended.allowed:
                        wrong.append(("refused what the rule allows", patch, exc.message))
                    elif ALLOCATION_VERIFIED not in intended.conditions and not (
                        STATUS_REFUSAL in exc.message
                        and any(change in exc.message for change in changes)
                    ):
                        # (A change to the verdict may be refused by the verdict policy first;
                        # the status policy names the fields it sees changed, else the
                        # conditions, and a field the API server drops it does not see.)
                        wrong.append(("refused without naming what", patch, exc.message))
                elif exc.status in (400, 422):
                    fell["invalid"] += 1  # refused by validation, before any policy
                else:
                    wrong.append((f"HTTP {exc.status}", patch, exc.message))
                return
            after = judge(old, stored["status"])
            if not after.allowed:
                wrong.append(("stored a change the rule refuses", patch, str(after)))
            fell["stored" if intended.allowed else "stored-after-the-server-dropped-it"] += 1

        run()
        assert wrong == [], json.dumps(wrong, indent=1)[:6000]
        # The sample is worth something only if it reaches the policy both ways.
        assert fell["refused"] >= SAMPLE // 4, fell
        assert fell["stored"] >= 1, fell
        assert installer.get("v1", "Pod", name, namespace)["status"] == old
    finally:
        admin.delete("v1", "Pod", name, namespace, grace_period_seconds=0)


# -- device Pods ---------------------------------------------------------------------------------


@st.composite
def device_pods(draw: st.DrawFn, namespace: str) -> dict[str, Any]:
    """A plain Pod (one or two containers, maybe an init container) with one device variable,
    envFrom source or CDI or lookalike annotation key (sometimes two), which the API server
    would accept as a Pod: one surface at a time, so that a namespace or prefix the guard
    misses is not hidden behind another the guard refuses."""
    pod = _pod(namespace, "device-sample")
    spec = pod["spec"]
    if draw(st.booleans()):
        spec["containers"].append({"name": "sidecar", "image": IMAGE})
    if chance(draw, 30):
        spec["initContainers"] = [{"name": "init", "image": IMAGE}]
    for _ in range(1 + chance(draw, 20)):
        add_one_device_surface(draw, spec, pod["metadata"]["annotations"], valid=True)
    return pod


def test_generated_device_pods_are_refused_exactly_as_the_predicate_refuses(
    control_plane: ControlPlane, tenant: tuple[str, list[JSON]]
) -> None:
    namespace, docs = tenant
    installer: Kube = control_plane.kube(INSTALLER)
    wrong: list[tuple[str, Any, str]] = []
    fell: Counter[str] = Counter()

    @_sample()
    @given(device_pods(namespace))
    def run(pod: dict[str, Any]) -> None:
        expected = admission_refusal(pod, None, SCHEDULER)
        try:
            stored = installer.create(pod, dry_run=True)
        except ApiError as exc:
            if exc.status == 403 and denied_by_guard(exc.message, docs):
                fell["refused"] += 1
                if expected is None:
                    wrong.append(("refused what the predicate allows", pod, exc.message))
            elif exc.status == 422:
                fell["invalid"] += 1
            else:
                wrong.append((f"HTTP {exc.status}", pod, exc.message))
            return
        fell["stored"] += 1
        if expected is not None:
            wrong.append(("stored a Pod the predicate refuses", pod, expected.message))
        found = device_findings(stored)
        if found:
            wrong.append(("stored a Pod with device variables", pod, str(found)))

    run()
    assert wrong == [], json.dumps(wrong, indent=1)[:6000]
    assert fell["refused"] >= SAMPLE // 4 and fell["stored"] >= 1, fell
