"""The owner's admission policies in a real 1.36 API server, acting as the tenant's admin.

The shield (MutatingAdmissionPolicy) and the guard (ValidatingAdmissionPolicy) are the chart's
own objects (``localcluster.servers.admission_policies``), installed with the webhook configuration;
the webhook is a local process (``localcluster.servers.webhook``) so that a test can stop it or take
its configuration away precisely. Pods are created as ``tmi-installer``, the namespace's admin,
which is the identity every attack here is made as: what it can change must not widen a grant,
and what it breaks must refuse engine Pods only.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from inference_policy.admission.access_cel import FORGERY_PREFIX
from inference_policy.admission.engine_pod import admission_refusal
from kits.profilekit import NAMESPACE, request
from kits.stackkit import refusal
from kits.webhookkit import asking_for, engine_pod, plain_pod, plain_pod_with
from localcluster import ApiError, ControlPlane, Kube, wait_until
from localcluster.servers.admission_policies import denied_by_guard
from localcluster.servers.webhook import (
    PLAN_ANNOTATION,
    LocalWebhook,
    webhook_configuration,
)
from localcluster.servers.webhook_objects import CONFIGURATION_NAME, set_opt_in
from tests.e2e.policykit import SCHEDULER, VOID, guard_prefix, named, plans

if TYPE_CHECKING:
    from tests.e2e.webhook_fixtures import Deployed

pytest_plugins = ["tests.e2e.webhook_fixtures"]
pytestmark = pytest.mark.e2e


def _plan_annotated() -> dict[str, Any]:
    pod = plain_pod()
    pod["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps({"status": 200, "path": "gpu"})
    return pod


@contextlib.contextmanager
def webhook_down(hook: LocalWebhook) -> Iterator[None]:
    """Every replica of the tenant's webhook gone; its configuration stays (failurePolicy
    Fail), as after a scale to zero or a crash loop."""
    hook.stop_process()
    try:
        yield
    finally:
        hook.start()


@contextlib.contextmanager
def webhook_that_plans_nothing(control_plane: ControlPlane, hook: LocalWebhook) -> Iterator[None]:
    """The tenant replaced its webhook with one that admits every engine Pod unchanged: the
    owner's configuration is gone, so engine Pods reach the guard exactly as the tenant wrote
    them. The policies stay."""
    admin = control_plane.kube("admin")
    configuration = hook.configuration
    assert configuration is not None
    admin.delete(
        "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", CONFIGURATION_NAME
    )
    wait_until(
        lambda: not plans(hook),
        timeout=60,
        what="engine Pods to stop being sent to the webhook",
    )
    try:
        yield
    finally:
        admin.apply(
            webhook_configuration(
                f"{hook.url}/mutate", control_plane.ca_bundle, namespace=hook.settings.namespace
            )
        )
        wait_until(lambda: plans(hook), timeout=60, what="the webhook to plan engine Pods again")


def _granted_engine_pod(**spec: Any) -> dict[str, Any]:
    """An engine Pod as a webhook that grants two GPUs would leave it: labelled, a plan of its
    own making, its engine container asking for the devices."""
    pod = engine_pod(request(), name="engine")
    pod["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps({"status": 200, "path": "gpu"})
    pod["spec"].update({"schedulerName": SCHEDULER, "runtimeClassName": "nvidia", **spec})
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    return pod


# -- plain Pods never depend on a tmi server ------------------------------------------------------


def test_plain_pods_are_shielded_by_the_api_server_without_the_webhook(
    webhook: Deployed, installer: Kube
) -> None:
    before = webhook.hook.reviews()
    sent = plain_pod_with("initContainers", {"name": "init"})
    stored = installer.create(named(sent, "tenant"), dry_run=True)
    for kind in ("containers", "initContainers"):
        assert [c.get("env") for c in stored["spec"][kind]] == [[VOID]], kind
    assert webhook.hook.reviews() == before, "the API server called the webhook for a plain Pod"


def test_with_the_webhook_down_plain_pods_are_created_shielded_and_engine_pods_refused(
    webhook: Deployed, installer: Kube, kamiwaza_pods: Any
) -> None:
    with webhook_down(webhook.hook):
        pod = named(plain_pod(), "tenant")
        pod["metadata"]["name"] = kamiwaza_pods("tenant")
        stored = installer.create(pod)
        assert stored["spec"]["containers"][0]["env"] == [VOID]
        err = refusal(installer, engine_pod(request(), name=f"engine-{uuid.uuid4().hex[:6]}"))
        assert err.status == 500 and "failed calling webhook" in err.message, err
        forged = refusal(
            installer, named(plain_pod_with("containers", asking_for("x", "nvidia.com/gpu")), "f")
        )
        assert forged.status == 403 and denied_by_guard(forged.message, webhook.hook.policies)


def test_an_opted_in_namespace_without_the_owners_parameters_admits_no_pod(
    control_plane: ControlPlane, webhook: Deployed
) -> None:
    """The policies are bound once to every opted-in namespace and read their parameters (the
    TenantPolicy) in the namespace of the request: a namespace the owner opts in before it has
    written them gets no Pod admitted unchecked, and one not opted in is not touched."""
    admin = control_plane.kube("admin")
    namespace = f"tmi-unparamed-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(namespace)
    try:
        pod = {**named(plain_pod(), "probe"), "metadata": {"name": "probe", "namespace": namespace}}
        stored = admin.create(pod, dry_run=True)
        assert "env" not in stored["spec"]["containers"][0]
        set_opt_in(control_plane, namespace, True)

        def refused() -> bool:
            try:
                admin.create(pod, dry_run=True)
            except ApiError as exc:
                # The API server answers 422 for a binding it cannot configure.
                return denied_by_guard(exc.message, webhook.hook.policies) and (
                    "no params found" in exc.message
                )
            return False

        wait_until(refused, timeout=60, what="the guard to refuse Pods without parameters")
    finally:
        admin.delete("v1", "Namespace", namespace)


# -- the guard refuses what the tenant forges ----------------------------------------------------


FORGERIES: dict[str, tuple[dict[str, Any], str]] = {
    "nvidia-gpu": (
        plain_pod_with("containers", asking_for("miner", "nvidia.com/gpu")),
        "spec.containers[miner].resources.limits[nvidia.com/gpu]",
    ),
    "mig-slice": (
        plain_pod_with("containers", asking_for("miner", "nvidia.com/mig-3g.40gb")),
        "spec.containers[miner].resources.limits[nvidia.com/mig-3g.40gb]",
    ),
    "vram-share": (
        plain_pod_with("containers", asking_for("miner", "kamiwaza.ai/vram-gb-gpu-0", "8")),
        "spec.containers[miner].resources.limits[kamiwaza.ai/vram-gb-gpu-0]",
    ),
    "amd-gpu": (
        plain_pod_with("containers", asking_for("miner", "amd.com/gpu")),
        "spec.containers[miner].resources.limits[amd.com/gpu]",
    ),
    "init-nvidia-gpu": (
        plain_pod_with("initContainers", asking_for("warm", "nvidia.com/gpu")),
        "spec.initContainers[warm].resources.limits[nvidia.com/gpu]",
    ),
    "init-mig-slice": (
        plain_pod_with("initContainers", asking_for("warm", "nvidia.com/mig-3g.40gb")),
        "spec.initContainers[warm].resources.limits[nvidia.com/mig-3g.40gb]",
    ),
    "init-vram-share": (
        plain_pod_with("initContainers", asking_for("warm", "kamiwaza.ai/vram-gb-gpu-0", "8")),
        "spec.initContainers[warm].resources.limits[kamiwaza.ai/vram-gb-gpu-0]",
    ),
    "init-amd-gpu": (
        plain_pod_with("initContainers", asking_for("warm", "amd.com/gpu")),
        "spec.initContainers[warm].resources.limits[amd.com/gpu]",
    ),
    "device-env": (
        plain_pod_with(
            "containers",
            {"name": "env", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
        ),
        "spec.containers[env].env[NVIDIA_VISIBLE_DEVICES]",
    ),
    "runtime-class": (plain_pod(runtimeClassName="nvidia"), "spec.runtimeClassName (nvidia)"),
    # Default-deny: whatever the device, whoever made the plugin.
    "dra-extended-resource": (
        plain_pod_with(
            "containers", asking_for("miner", "deviceclass.resource.kubernetes.io/gpu.nvidia.com")
        ),
        "spec.containers[miner].resources.limits[deviceclass.resource.kubernetes.io/gpu.nvidia.com]",
    ),
    "neuron-core": (
        plain_pod_with("initContainers", asking_for("warm", "aws.amazon.com/neuroncore")),
        "spec.initContainers[warm].resources.limits[aws.amazon.com/neuroncore]",
    ),
    "unlisted-device-plugin": (
        plain_pod_with("containers", asking_for("miner", "example.com/fpga")),
        "spec.containers[miner].resources.limits[example.com/fpga]",
    ),
    "resource-claim": (
        plain_pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "tenant-claim"}]),
        "spec.resourceClaims",
    ),
    "plan-annotation": (_plan_annotated(), f"metadata.annotations[{PLAN_ANNOTATION}]"),
}


@pytest.mark.parametrize(("pod", "field"), FORGERIES.values(), ids=FORGERIES.keys())
def test_forgeries_are_refused_by_the_guard(
    webhook: Deployed, installer: Kube, pod: dict[str, Any], field: str
) -> None:
    err = refusal(installer, named(pod, "forged"))
    assert err.status == 403, err
    assert guard_prefix(webhook.hook) + FORGERY_PREFIX in err.message, err.message
    assert field in err.message, err.message


def test_a_webhook_that_plans_nothing_grants_nothing_the_guard_can_see(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube
) -> None:
    prefix = guard_prefix(webhook.hook)
    with webhook_that_plans_nothing(control_plane, webhook.hook):
        cases = {
            "default scheduler": (
                _granted_engine_pod(schedulerName="default-scheduler"),
                f"scheduled by {SCHEDULER}, not default-scheduler",
            ),
            "preset node": (_granted_engine_pod(nodeName="gpu-1"), "spec.nodeName (gpu-1) is set"),
            "envFrom on the granted container": (
                _granted_engine_pod(),
                "spec.containers[engine].envFrom",
            ),
            "unshielded sidecar": (_granted_engine_pod(), "container(s) sidecar hold no"),
            "no plan": (_granted_engine_pod(), f"carries the plan ({PLAN_ANNOTATION})"),
            "a claim by name": (
                _granted_engine_pod(
                    resourceClaims=[{"name": "gpu", "resourceClaimName": "tenant-claim"}]
                ),
                "resource claims come from the claim templates the owner published",
            ),
            "a claim from a template of the tenant's": (
                _granted_engine_pod(
                    resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "tenant-own"}]
                ),
                "resource claims come from the claim templates the owner published",
            ),
        }
        del cases["no plan"][0]["metadata"]["annotations"][PLAN_ANNOTATION]
        cases["envFrom on the granted container"][0]["spec"]["containers"][0]["envFrom"] = [
            {"configMapRef": {"name": "all-gpus"}}
        ]
        cases["unshielded sidecar"][0]["spec"]["containers"].append(
            {"name": "sidecar", "image": "registry.invalid/tool:1"}
        )
        for case, (pod, words) in cases.items():
            err = refusal(installer, named(pod, "engine"))
            assert err.status == 403, (case, err)
            assert prefix in err.message and words in err.message, (case, err.message)
        # Shaped like a plan, the guard cannot tell it from one: the owner's extender checks
        # the grant against the signed profile before any node passes (test_placement).
        installer.create(named(_granted_engine_pod(), "engine"), dry_run=True)


def test_a_webhook_that_names_another_scheduler_gets_no_pod(
    webhook: Deployed, installer: Kube
) -> None:
    hook = webhook.hook
    hook.restart(scheduler_name="default-scheduler")
    try:
        err = refusal(installer, engine_pod(request(), name=f"engine-{uuid.uuid4().hex[:6]}"))
        assert err.status == 403, err
        assert f"scheduled by {SCHEDULER}, not default-scheduler" in err.message, err.message
    finally:
        hook.restart(scheduler_name=SCHEDULER)


def test_debug_containers_are_shielded_and_may_not_reach(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube, kamiwaza_pods: Any
) -> None:
    name = kamiwaza_pods("tenant")
    pod = named(plain_pod(), "tenant")
    pod["metadata"]["name"] = name
    installer.create(pod)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/ephemeralcontainers"
    # The namespace admin may not add debug containers at all (the admin ClusterRole leaves
    # pods/ephemeralcontainers out); a cluster admin may, and is still refused the devices.
    with pytest.raises(ApiError) as forbidden:
        installer.request(
            "PATCH",
            path,
            body={"spec": {"ephemeralContainers": [{"name": "x", "image": "busybox:1.37"}]}},
            content_type="application/strategic-merge-patch+json",
        )
    assert forbidden.value.status == 403 and "denied request" not in forbidden.value.message
    admin = control_plane.kube("admin")
    forged = {
        "name": "dbg-gpu",
        "image": "busybox:1.37",
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
    }
    with pytest.raises(ApiError) as denied:
        admin.request(
            "PATCH",
            path,
            body={"spec": {"ephemeralContainers": [forged]}},
            content_type="application/strategic-merge-patch+json",
        )
    assert denied.value.status == 403, denied.value
    assert "spec.ephemeralContainers[dbg-gpu].env[NVIDIA_VISIBLE_DEVICES]" in denied.value.message
    patched = admin.request(
        "PATCH",
        path,
        body={"spec": {"ephemeralContainers": [{"name": "dbg", "image": "busybox:1.37"}]}},
        content_type="application/strategic-merge-patch+json",
    )
    (debug,) = patched["spec"]["ephemeralContainers"]
    assert debug["env"] == [VOID]


# -- the CEL and the predicate agree ----------------------------------------------------------


def test_the_policies_refuse_exactly_what_the_predicate_refuses(
    webhook: Deployed, installer: Kube
) -> None:
    """Every Pod of the shared corpus through the real API server, as sent and with every
    container shielded: the guard refuses exactly those `admission_refusal` refuses, naming the
    same fields, and stores every other one with every container shielded, the webhook never
    called."""
    from tests.podcorpus import CORPUS, shielded

    prefix = guard_prefix(webhook.hook) + FORGERY_PREFIX
    disagreements = []
    cases = {**CORPUS, **{f"{k}-shielded": (shielded(p), r) for k, (p, r) in CORPUS.items()}}
    before = webhook.hook.reviews()
    for case, (pod, _) in cases.items():
        expected = admission_refusal(pod, None, SCHEDULER)
        try:
            stored = installer.create(named(pod, case), dry_run=True)
        except ApiError as exc:
            fields_named = expected is not None and all(
                field in exc.message for field in _fields(expected.message)
            )
            # A claim no Pod-level claim declares is invalid, refused before any admission
            # policy runs; the Pod can never exist, which is all the predicate asks.
            invalid = expected is not None and exc.status == 422 and "resourceClaims" in exc.message
            if not (invalid or (exc.status == 403 and prefix in exc.message and fields_named)):
                disagreements.append((case, expected and expected.message, exc.message))
            continue
        envs = [
            c.get("env") or []
            for k in ("containers", "initContainers")
            for c in stored["spec"].get(k, [])
        ]
        if expected is not None or not all(VOID in env for env in envs):
            disagreements.append((case, expected and expected.message, envs))
    assert [case for case, *_ in disagreements] == [], disagreements
    assert webhook.hook.reviews() == before


def _fields(message: str) -> list[str]:
    inside = message[len(FORGERY_PREFIX) : message.rindex(");")]
    return inside.split(", ")


def test_the_detect_job_runs_in_the_owners_namespace_and_is_refused_in_the_tenants(
    control_plane: ControlPlane, webhook: Deployed, installer: Kube
) -> None:
    """manifests/detect-job.yaml as shipped: the API server accepts the Job itself in the
    owner's namespace (no placeholder to fill first); its Pod reaches for every GPU outside a
    plan, so the guard refuses it in the opted-in tenant namespace (the seed's re-detect would
    break there), and the owner's namespace, which no tenant guard covers, admits it."""
    from pathlib import Path

    import yaml

    job = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "manifests" / "detect-job.yaml").read_text()
    )
    template = job["spec"]["template"]
    spec = dict(template["spec"])
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tmi-detect-probe", "namespace": NAMESPACE},
        "spec": spec,
    }
    err = refusal(installer, pod)
    assert err.status == 403 and FORGERY_PREFIX in err.message, err.message
    assert "NVIDIA_VISIBLE_DEVICES" in err.message or "runtimeClassName" in err.message
    owner_ns = job["metadata"]["namespace"]
    admin = control_plane.kube("admin")
    with contextlib.suppress(ApiError):
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": owner_ns}})
    stored_job = admin.create(job, dry_run=True)
    assert stored_job["metadata"]["name"] == "tmi-detect-gpu-node-1"
    admitted = admin.create(
        {**pod, "metadata": {**pod["metadata"], "namespace": owner_ns}}, dry_run=True
    )
    assert admitted["spec"]["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in admitted["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
