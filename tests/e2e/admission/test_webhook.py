"""The admission webhook behind a real 1.36 API server, configured by the shipped manifests.

The webhook runs as its own process with the ``tmi-webhook`` identity under the shipped Role
(``localcluster.servers.webhook``); the API server calls it through the owner's
MutatingWebhookConfiguration with only ``clientConfig`` rewritten. Pods are created as
``tmi-installer``, the kamiwaza namespace admin, so what reaches the client is what a platform
install would see: the stored Pod after admission, or the API server's rendering of a denial
(HTTP status from the webhook, message prefixed with the webhook entry's name).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from inference_policy.base.access import is_accelerator_resource
from kits.profilekit import CLUSTER, EXAMPLES, NAMESPACE, Owner, request
from kits.stackkit import refusal
from kits.webhookkit import asking_for, engine_pod, plain_pod
from localcluster import ApiError, ControlPlane, FakeNode, Kube, pod_condition, wait_until
from localcluster.servers.admission_policies import verdict_writer
from localcluster.servers.webhook import (
    DEFAULT_BUNDLE_CONFIGMAP,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
    LocalWebhook,
    delete_profile,
    is_planned,
    publish_profile,
    webhook_configuration,
)
from tmi_cli.main import main as tmi

if TYPE_CHECKING:
    # Only for annotations: pytest_plugins must be the first to import the fixture module, so
    # that pytest can rewrite its asserts.
    from tests.e2e.webhook_fixtures import Deployed

pytest_plugins = ["tests.e2e.webhook_fixtures"]
pytestmark = pytest.mark.e2e
VERDICT_REFUSALS = (
    "only the owner's allocation controller may write",
    "only the cluster's own components may change",
)

ENGINE_HOOK = "pods.tenant-inference.kamiwaza.ai"
GUARD_HOOK = "guard.tenant-inference.kamiwaza.ai"
GATE = "kamiwaza.ai/AllocationVerified"
MLX_DETAIL = (
    "cannot derive inference resources for this deployment: engine 'mlx' is not qualified in "
    "this release"
)
PROFILE_PREFIX = "owner profile bundle: invalid inference profile authorization: "
FORGERY_PREFIX = "tenant-mode inference: this Pod asks for accelerator access outside a plan ("
MERGE_PATCH = "application/merge-patch+json"


def denied_by(hook: str) -> str:
    """How the API server prefixes a webhook's denial message."""
    return f'admission webhook "{hook}" denied the request: '


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _named(pod: dict[str, Any], name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] = name
    pod["metadata"]["namespace"] = namespace
    return pod


def pod_path(name: str, namespace: str = NAMESPACE) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def tmi_plan(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    owner: Owner,
    profile: dict[str, Any],
    body: dict[str, Any],
) -> dict[str, Any]:
    """What `tmi plan` answers for the deployed profile and settings."""
    bundle, req = tmp_path / "bundle.json", tmp_path / "request.json"
    bundle.write_text(json.dumps(profile))
    req.write_text(json.dumps(body))
    capsys.readouterr()
    status = tmi(
        [
            "plan",
            f"--bundle={bundle}",
            f"--owner-public-key={owner.public_key}",
            f"--cluster-binding-id={CLUSTER}",
            f"--namespace={NAMESPACE}",
            f"--bundle-configmap={DEFAULT_BUNDLE_CONFIGMAP}",
            f"--request={req}",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    plan: dict[str, Any] = json.loads(out)
    return plan


# -- engine Pods are stored as planned ------------------------------------------------------------


PLANNED = {
    "gguf-on-gpu": request(),
    "forced-cpu": request(config__force_cpu=True),
    "vllm": request("vllm"),
}


@pytest.mark.parametrize("body", PLANNED.values(), ids=PLANNED.keys())
def test_engine_pod_is_stored_as_tmi_plan_says(
    webhook: Deployed,
    installer: Kube,
    kamiwaza_pods: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    body: dict[str, Any],
) -> None:
    settings = webhook.hook.settings
    plan = tmi_plan(tmp_path, capsys, webhook.owner, webhook.profile, body)
    # What the platform set itself is replaced: its nodeSelector always, and a RuntimeClass
    # that a CPU plan does not want.
    spec: dict[str, Any] = {"nodeSelector": {"disk": "ssd"}}
    if plan["path"] == "cpu":
        spec["runtimeClassName"] = "nvidia"
    sent = engine_pod(body, name=kamiwaza_pods("engine"), **spec)
    installer.create(sent)
    stored = installer.request("GET", pod_path(sent["metadata"]["name"]))

    annotations = stored["metadata"]["annotations"]
    assert json.loads(annotations[PLAN_ANNOTATION]) == plan
    assert annotations[REQUEST_ANNOTATION] == sent["metadata"]["annotations"][REQUEST_ANNOTATION]
    assert stored["metadata"]["labels"] == sent["metadata"]["labels"]

    spec = stored["spec"]
    engine = spec["containers"][0]
    assert engine["image"] == plan["image"]
    assert engine["args"] == sent["spec"]["containers"][0]["args"]
    own = sent["spec"]["containers"][0]["resources"]
    expected: dict[str, Any] = {
        "requests": {
            **{k: v for k, v in own.get("requests", {}).items() if not is_accelerator_resource(k)},
            **plan["resources"]["requests"],
        }
    }
    if plan["path"] == "gpu":
        expected["limits"] = plan["resources"]["limits"]
    assert engine["resources"] == expected
    if plan["path"] == "gpu":
        assert spec["runtimeClassName"] == plan["runtimeClassName"] == "nvidia"
        assert spec["imagePullSecrets"] == [{"name": settings.gpu_registry_credentials_secret}]
    else:
        assert "runtimeClassName" not in spec
        assert spec["imagePullSecrets"] == [{"name": settings.cpu_registry_credentials_secret}]
    assert spec["nodeSelector"] == plan["nodeSelector"]
    assert spec["schedulerName"] == settings.scheduler_name
    assert spec["readinessGates"] == [{"conditionType": GATE}]


def test_pods_of_a_namespace_not_opted_in_are_stored_as_sent(
    control_plane: ControlPlane, webhook: Deployed, new_namespace: Callable[[str], str]
) -> None:
    other = new_namespace("not-opted-in")
    admin = control_plane.kube("admin")
    before = webhook.hook.reviews()
    engine = _named(engine_pod(request()), _name("engine"), other)
    # Not refused either: outside the opted-in namespaces the guard does not apply.
    forged = _named(plain_pod(runtimeClassName="nvidia"), _name("forged"), other)
    for sent in (engine, forged):
        admin.create(sent)
        stored = admin.request("GET", pod_path(sent["metadata"]["name"], other))
        assert stored["metadata"]["labels"] == sent["metadata"]["labels"]
        assert stored["metadata"].get("annotations", {}) == sent["metadata"]["annotations"]
        sent_spec, spec = sent["spec"], stored["spec"]
        for key, value in sent_spec.items():
            if key == "containers":
                continue
            assert spec[key] == value, key
        for mine, theirs in zip(sent_spec["containers"], spec["containers"], strict=True):
            assert {k: theirs[k] for k in mine} == mine
        assert spec["schedulerName"] == "default-scheduler"
        assert "readinessGates" not in spec and "imagePullSecrets" not in spec
        assert "nodeSelector" not in spec
    assert webhook.hook.reviews() == before, "the API server called the webhook"


# -- refusals reach the client with the plan's status and the seed's words -----------------------


def test_mlx_is_refused_422_with_the_seed_detail(installer: Kube) -> None:
    mlx = json.loads((EXAMPLES / "request-mlx.json").read_text())
    err = refusal(installer, engine_pod(mlx, name=_name("mlx")))
    assert err.status == 422, err
    assert err.message == denied_by(ENGINE_HOOK) + MLX_DETAIL


def _refused_with(kube: Kube, status: int, message: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            kube.create(engine_pod(request(), name=_name("probe")), dry_run=True)
        except ApiError as exc:
            return exc.status == status and exc.message == message
        return False

    return probe


def test_profile_refusals_reach_the_client_as_503(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube
) -> None:
    hook = webhook.hook
    stranger = Owner()
    expected = denied_by(ENGINE_HOOK) + PROFILE_PREFIX
    try:
        publish_profile(control_plane, stranger.sign(stranger.envelope(), DEFAULT_BUNDLE_CONFIGMAP))
        wait_until(
            _refused_with(
                installer, 503, expected + "bundle is signed by a key this cluster does not trust"
            ),
            timeout=30,
            what="the profile signed by another key to be refused with 503",
        )
        delete_profile(control_plane, NAMESPACE, DEFAULT_BUNDLE_CONFIGMAP)
        wait_until(
            _refused_with(
                installer, 503, expected + "bundle did not arrive from the configured ConfigMap"
            ),
            timeout=30,
            what="the deleted profile to be refused with 503",
        )
        publish_profile(control_plane, webhook.profile)
        hook.restart(cluster_binding_id="another-cluster")
        wait_until(
            _refused_with(
                installer,
                503,
                expected + "bundle targets another cluster binding, namespace, or a version "
                "below the configured floor",
            ),
            timeout=30,
            what="the profile of another cluster binding to be refused with 503",
        )
    finally:
        publish_profile(control_plane, webhook.profile)
        if hook.settings.cluster_binding_id != CLUSTER:
            hook.restart(cluster_binding_id=CLUSTER)
        wait_until(
            lambda: is_planned(hook.probe()), timeout=30, what="the profile to be planned again"
        )


# -- an engine Pod reaches only through its plan ------------------------------------------------


def test_engine_pod_sidecar_asking_for_a_gpu_is_refused_403(installer: Kube) -> None:
    pod = engine_pod(request(), name=_name("engine"))
    pod["spec"]["containers"].append(
        {"name": "miner", "image": "busybox:1.37", **asking_for("miner", "nvidia.com/gpu")}
    )
    err = refusal(installer, pod)
    assert err.status == 403, err
    assert err.message.startswith(denied_by(ENGINE_HOOK) + FORGERY_PREFIX), err.message
    assert "spec.containers[miner].resources.limits[nvidia.com/gpu]" in err.message


def test_plan_annotation_cannot_change_on_update(
    installer: Kube, kamiwaza_pods: Callable[[str], str]
) -> None:
    name = kamiwaza_pods("engine")
    installer.create(engine_pod(request(), name=name))
    stored = installer.request("GET", pod_path(name))
    admitted = stored["metadata"]["annotations"][PLAN_ANNOTATION]
    changed = json.loads(admitted)
    changed["resources"]["limits"] = {"nvidia.com/gpu": "8"}
    fixed = (
        denied_by(ENGINE_HOOK) + f"the {PLAN_ANNOTATION} annotation is fixed when the Pod is "
        "admitted; it cannot be changed or removed"
    )
    for value in (json.dumps(changed), None):
        with pytest.raises(ApiError) as denied:
            installer.request(
                "PATCH",
                pod_path(name),
                body={"metadata": {"annotations": {PLAN_ANNOTATION: value}}},
                content_type=MERGE_PATCH,
            )
        assert denied.value.status == 403, denied.value
        assert denied.value.message == fixed
    # Metadata that is not the plan may change.
    updated = installer.request(
        "PATCH",
        pod_path(name),
        body={"metadata": {"labels": {"rollout": "2"}}},
        content_type=MERGE_PATCH,
    )
    assert updated["metadata"]["labels"]["rollout"] == "2"
    assert updated["metadata"]["annotations"][PLAN_ANNOTATION] == admitted


# -- a certificate rotated under load -----------------------------------------------------------


def test_certificate_rotation_fails_no_request(webhook: Deployed, installer: Kube) -> None:
    hook = webhook.hook
    first = hook.served_serial()
    stop = threading.Event()
    results: list[tuple[float, str | None]] = []

    def load() -> None:
        while not stop.is_set():
            pod = engine_pod(request(), name=_name("rotation"))
            try:
                stored = installer.create(pod, dry_run=True)
                outcome = None if is_planned(stored) else "admitted without a plan"
            except Exception as exc:
                outcome = repr(exc)
            results.append((time.monotonic(), outcome))

    thread = threading.Thread(target=load, name="pod-create-load", daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(results) >= 20, timeout=60, what="20 creates before the rotation")
        rotated = hook.rotate_certificate()
        assert rotated != first
        hook.wait_serving(rotated, timeout=30)
        served = time.monotonic()
        wait_until(
            lambda: sum(1 for at, _ in results if at > served) >= 50,
            timeout=60,
            what="50 creates after the new certificate is served",
        )
    finally:
        stop.set()
        thread.join(timeout=30)
    failures = [outcome for _, outcome in results if outcome is not None]
    assert failures == [], f"{len(failures)} of {len(results)} creates failed: {failures[:3]}"
    assert hook.served_serial() == rotated


# -- the readiness gate ---------------------------------------------------------------------------


def test_planned_pod_is_not_ready_until_allocation_verified(
    control_plane: ControlPlane,
    webhook: Deployed,
    installer: Kube,
    kamiwaza_pods: Callable[[str], str],
    fake_nodes: Callable[..., list[dict[str, object]]],
) -> None:
    node = FakeNode(
        _name("a100-mig"),
        gpu_product="NVIDIA-A100-SXM4-80GB",
        compute_capability="8.0",
        mig={"3g.40gb": 2},
    )
    fake_nodes(node)
    # The webhook hands engine Pods to the owner's scheduler; a plain profile under that name
    # stands in for it (the extender has its own e2e tests).
    scheduler = webhook.hook.settings.scheduler_name
    assert scheduler
    control_plane.start_scheduler({"profiles": [{"schedulerName": scheduler}]}, name="webhook-e2e")
    admin = control_plane.kube("admin")
    name = kamiwaza_pods("gated")
    try:
        installer.create(engine_pod(request(), name=name))
        running = admin.wait_for(
            "v1",
            "Pod",
            name,
            NAMESPACE,
            lambda p: (
                p.get("status", {}).get("phase") == "Running"
                and pod_condition(p, "Ready") is not None
            ),
            timeout=60,
            what=f"Pod {name} to run",
        )
        assert running["spec"]["nodeName"] == node.name
        assert running["spec"]["readinessGates"] == [{"conditionType": GATE}]
        assert pod_condition(running, GATE) is None
        ready = next(c for c in running["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ReadinessGatesNotReady")

        verdict = {
            "status": {
                "conditions": [
                    {
                        "type": GATE,
                        "status": "True",
                        "reason": "Verified",
                        "message": "allocation matches the plan",
                    }
                ]
            }
        }
        # The condition is the owner's controller's alone: not even a cluster admin writes it.
        with pytest.raises(ApiError) as refused:
            admin.patch_status("v1", "Pod", name, NAMESPACE, verdict)
        assert refused.value.status == 403
        # Two owner policies refuse it, each naming the condition: the verdict policy and the
        # status allow-list (which of them the API server reports first is its own affair).
        assert GATE in refused.value.message
        assert any(text in refused.value.message for text in VERDICT_REFUSALS)
        verdict_writer(control_plane, NAMESPACE).patch_status("v1", "Pod", name, NAMESPACE, verdict)
        verified = admin.wait_for(
            "v1",
            "Pod",
            name,
            NAMESPACE,
            lambda p: pod_condition(p, "Ready") == "True",
            timeout=60,
            what=f"Pod {name} to become Ready",
        )
        assert pod_condition(verified, GATE) == "True"
    finally:
        control_plane.stop_scheduler("webhook-e2e")


# -- the CEL and the predicate agree ----------------------------------------------------------


@contextlib.contextmanager
def fallback_guard(hook: LocalWebhook) -> Iterator[None]:
    """The chart as installed on a cluster without admission policies: no policies, and the
    webhook configuration's guard entry in their place."""
    policies = list(hook.policies)
    hook.remove_configuration()
    hook.install_configuration(
        webhook_configuration(
            f"{hook.url}/mutate",
            hook.plane.ca_bundle,
            admission_policies=False,
            namespace=hook.settings.namespace,
        ),
        policies=[],
    )
    try:
        yield
    finally:
        hook.remove_configuration()
        hook.install_configuration(policies=policies)


def test_without_admission_policies_the_guard_entry_is_sent_exactly_what_the_predicate_refuses(
    webhook: Deployed, installer: Kube
) -> None:
    """The fallback for clusters older than 1.36: every Pod of the shared corpus through the real
    API server's CEL matchConditions (generated from `inference_policy.base.access`), as sent and
    again with every container shielded. A Pod that reaches for an accelerator is sent to the
    webhook and refused; one with a container to shield is sent and stored shielded; any other
    is not sent at all."""
    with fallback_guard(webhook.hook):
        _the_guard_entry_agrees_with_the_predicate(webhook, installer)


def _the_guard_entry_agrees_with_the_predicate(webhook: Deployed, installer: Kube) -> None:
    from inference_policy.admission.engine_pod import to_shield
    from inference_policy.base.access import reaches as reaching
    from tests.podcorpus import CORPUS, shielded

    disagreements = []
    cases = {**CORPUS, **{f"{k}-shielded": (shielded(p), r) for k, (p, r) in CORPUS.items()}}
    for case, (pod, reaches) in cases.items():
        assert bool(reaching(pod)) is reaches, case
        sent = _named(pod, _name(case))
        before = webhook.hook.reviews()
        stored: dict[str, Any] | None = None
        refused: ApiError | None = None
        try:
            stored = installer.create(sent, dry_run=True)
        except ApiError as exc:
            refused = exc
        reviewed = webhook.hook.reviews() - before
        if reaches:
            ok = (
                reviewed == 1
                and refused is not None
                and refused.status == 403
                and str(refused.message).startswith(denied_by(GUARD_HOOK) + FORGERY_PREFIX)
            )
        else:
            ok = (
                reviewed == (1 if to_shield(pod) else 0)
                and stored is not None
                and to_shield(stored) == []
            )
        if not ok:
            disagreements.append((case, reaches, reviewed, refused and refused.message))
    assert disagreements == []
