"""What the chart does on another Kubernetes release, once its objects are admitted there.

A server-side dry run says an owner can install the chart on a release; it does not say that
the release enforces what the chart installs, or speaks the wire the servers speak. So on each
release whose dry run passes, the whole stack is brought up as users install it (the chart's
both parts, the webhook, the extender, the allocation controller, and that release's own
kube-scheduler, which the chart's scheduler image follows) on one KWOK GPU node, and the
tenant's namespace admin makes four attempts, each of which fails on a release that lacks what
it needs:

* ``shield``: a plain Pod is stored shielded (``NVIDIA_VISIBLE_DEVICES=void``): the
  MutatingAdmissionPolicy, or in the fallback the webhook configuration's guard entry;
* ``guard``: a Pod that asks for a GPU outside a plan is refused with the guard's message: the
  ValidatingAdmissionPolicy's CEL on that release, or the guard entry's matchConditions;
* ``webhook``: an engine Pod comes back planned (admission.k8s.io/v1 AdmissionReview);
* ``extender``: that Pod is bound by the release's kube-scheduler after it called the extender's
  filter (ExtenderArgs v1), and the controller sets AllocationVerified True.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_policy.admission.access_cel import FORGERY_PREFIX
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME, public_identity, sign_envelope
from localcluster.demo.workflow import DEMO_FLEET
from localcluster.install.install import INSTALLER
from localcluster.install.stack import TenantStack, deploy_stack
from localcluster.install.stack_settings import StackSettings
from localcluster.nodes.kwok import create_fake_nodes
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import ApiError, Kube
from localcluster.plane.metrics import metric
from localcluster.servers.admission_policies import denied_by_guard, policy_docs
from localcluster.servers.engine_pods import CONDITION, condition, engine_pod
from localcluster.servers.webhook import PLAN_ANNOTATION
from localcluster.servers.webhook_objects import CONFIGURATION_NAME
from policy_io.catalog import packaged_catalog

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CLUSTER = "version-check"
WAIT = 60.0
# The example profile's whole-H200 binding, on the demo's node GPU Feature Discovery labels so.
NODE = next(node for node in DEMO_FLEET if node.gpu_product == "NVIDIA-H200")
REQUEST = EXAMPLES / "request-llama70b-vllm.json"
PROBES = ("shield", "guard", "webhook", "extender")


def _catalog_image(engine: str, vendor: str, cuda: str) -> str:
    for row in packaged_catalog().rows():
        if row[:4] == (engine, vendor, "amd64", cuda):
            return row[4]
    raise LookupError(f"the catalog has no {engine} {vendor} amd64 image for CUDA {cuda}")


def signed_example(now: datetime) -> tuple[str, dict[str, Any]]:
    """A fresh owner key's public half and the example profile signed with it, valid now."""
    key = Ed25519PrivateKey.generate()
    identity = public_identity(key)
    template = (EXAMPLES / "profile-envelope.template.json").read_text()
    envelope = json.loads(
        template.replace("<KEY_ID>", identity["keyId"])
        .replace("<LLAMACPP_CPU_IMAGE>", _catalog_image("llamacpp", "cpu", "-"))
        .replace("<LLAMACPP_CUDA_IMAGE>", _catalog_image("llamacpp", "nvidia", "13"))
    )
    envelope["clusterBindingId"] = CLUSTER
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    envelope["issuedAt"] = (now - timedelta(days=1)).strftime(stamp)
    envelope["expiresAt"] = (now + timedelta(days=30)).strftime(stamp)
    return identity["publicKey"], sign_envelope(envelope, key, DEFAULT_CONFIGMAP_NAME)


def _probe_pod(namespace: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"tmi-version-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {
            "containers": [{"name": "probe", "image": "placeholder.invalid/probe:1", **container}]
        },
    }


def _shield(stack: TenantStack, installer: Kube) -> str | None:
    stored = installer.create(_probe_pod(stack.settings.namespace), dry_run=True)
    env = stored["spec"]["containers"][0].get("env") or []
    if {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in env:
        return None
    return f"a plain Pod was stored unshielded (env {env})"


def _by_guard(stack: TenantStack, message: str) -> bool:
    """Refused by the guard policy, or without the policies by the webhook's guard entry."""
    assert stack.owner is not None
    docs = policy_docs(stack.owner)
    try:
        return denied_by_guard(message, docs)
    except ValueError:
        pass
    hooks = stack.owner.get("MutatingWebhookConfiguration", CONFIGURATION_NAME)["webhooks"]
    return any(
        message.startswith(f'admission webhook "{hook["name"]}" denied the request: ')
        and FORGERY_PREFIX in message
        for hook in hooks
        if hook["name"].startswith("guard.")
    )


def _guard(stack: TenantStack, installer: Kube) -> str | None:
    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    try:
        installer.create(_probe_pod(stack.settings.namespace, **gpu), dry_run=True)
    except ApiError as exc:
        if exc.status == 403 and _by_guard(stack, exc.message):
            return None
        return f"refused, but not by the guard: HTTP {exc.status} {exc.message}"
    return "a Pod asking for nvidia.com/gpu outside a plan was admitted"


def _engine(stack: TenantStack, installer: Kube) -> tuple[str | None, str | None]:
    """(the webhook's failure, the extender's failure): one engine Pod, planned then placed."""
    assert stack.extender is not None
    body = json.loads(REQUEST.read_text())
    pod = engine_pod(stack.settings.namespace, body, deployment_id="version-check")
    # Read first: the Pod may be bound before its create returns.
    filters = metric(stack.extender.metrics(), "tmi_extender_requests_total", verb="filter")
    try:
        stored = installer.create(pod)
    except ApiError as exc:
        return f"the engine Pod was refused: HTTP {exc.status} {exc.message}", "not reached"
    if PLAN_ANNOTATION not in stored["metadata"].get("annotations", {}):
        return "the engine Pod was stored without a plan", "not reached"
    name = stored["metadata"]["name"]

    def verified(p: dict[str, Any]) -> bool:
        return bool(p["spec"].get("nodeName")) and (
            (condition(p, CONDITION) or {}).get("status") == "True"
        )

    try:
        stack.plane.kube("admin").wait_for(
            "v1", "Pod", name, stack.settings.namespace, verified, timeout=WAIT
        )
    except TimeoutError as exc:
        return None, f"not placed and verified: {exc}"
    if metric(stack.extender.metrics(), "tmi_extender_requests_total", verb="filter") <= filters:
        return None, "bound without a filter call to the extender"
    return None, None


def behaviour(plane: ControlPlane, *, policies: bool) -> dict[str, str | None]:
    """Each probe's failure (None where it passed) on a plane of the release under check."""
    public_key, configmap = signed_example(datetime.now(UTC))
    settings = StackSettings(
        owner_public_keys=(public_key,),
        cluster_binding_id=CLUSTER,
        admission_policies=policies,
    )
    create_fake_nodes(plane.kube("admin"), [NODE])
    with deploy_stack(plane, settings, configmap) as stack:
        assert stack.extender is not None
        stack.extender.wait_nodes([NODE.name])
        installer = plane.kube(INSTALLER)
        checks: dict[str, Callable[[TenantStack, Kube], str | None]] = {
            "shield": _shield,
            "guard": _guard,
        }
        found = {probe: check(stack, installer) for probe, check in checks.items()}
        found["webhook"], found["extender"] = _engine(stack, installer)
    return found


def summary(found: dict[str, str | None]) -> str:
    """One report cell: pass, or each failed probe with what it met."""
    failed = [f"{probe}: {why}" for probe, why in found.items() if why is not None]
    return "pass" if not failed else "fail: " + "; ".join(failed)


__all__ = ["PROBES", "behaviour", "signed_example", "summary"]
