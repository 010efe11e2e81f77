"""Builders for the webhook's integration tests: Pods, AdmissionReviews, published ConfigMaps.

The profiles themselves come from `kits.profilekit`, signed with a fresh key by the real signing
code; this module adds what the API server would add (uid, resourceVersion) and what the webhook
receives (an AdmissionReview), and applies the patches the webhook returns (with the `jsonpatch`
library), so a test asserts on the Pod that would be stored rather than on the patch's wording.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jsonpatch
from aiohttp import web

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from kits.memory_sources import WebhookMemorySource as MemorySource
from kits.profilekit import NAMESPACE, NOW, Owner
from webhook.app import create_app
from webhook.profile_source import PolicyStore

ENGINE_LABEL = "kamiwaza.ai/deployment-id"
REQUEST_ANNOTATION = "kamiwaza.ai/deployment-request"
PLAN_ANNOTATION = "kamiwaza.ai/plan"
GPU_SECRET = "gpu-staging-pull"
CPU_SECRET = "cpu-staging-pull"
SCHEDULER = "kamiwaza-inference-scheduler"


def published(
    configmap: dict[str, Any], uid: str | None = None, resource_version: str = "1001"
) -> dict[str, Any]:
    """A ConfigMap as the API server returns it: with a uid and a resourceVersion."""
    out = copy.deepcopy(configmap)
    out["metadata"]["uid"] = uid or str(uuid.uuid4())
    out["metadata"]["resourceVersion"] = resource_version
    return out


def engine_pod(
    request: dict[str, Any] | str | None,
    *,
    name: str = "tmi-3f2a9c",
    containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An engine Pod as the platform creates it, before the webhook has planned it."""
    all_annotations = dict(annotations or {})
    if request is not None:
        all_annotations[REQUEST_ANNOTATION] = (
            request if isinstance(request, str) else json.dumps(request)
        )
    all_labels = {ENGINE_LABEL: "631e7142-3417-487c-be65-d7715ba6cbf2", **(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": all_labels,
            "annotations": all_annotations,
        },
        "spec": {
            "containers": containers
            if containers is not None
            else [
                {
                    "name": "engine",
                    "image": "placeholder.invalid/engine:latest",
                    "args": ["--port", "8080"],
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                }
            ],
            "restartPolicy": "Always",
            **spec,
        },
    }


def plain_pod(**spec: Any) -> dict[str, Any]:
    """A Pod without the engine label, e.g. a tenant's own workload."""
    pod = engine_pod(None, name="tenant-app", **spec)
    pod["metadata"]["labels"] = {"app": "tenant"}
    return pod


def plain_pod_with(kind: str, container: dict[str, Any]) -> dict[str, Any]:
    """A tenant Pod with one more container of `kind` (containers, initContainers, ...)."""
    pod = plain_pod()
    pod["spec"].setdefault(kind, []).append({"image": "busybox:1.37", **container})
    return pod


def asking_for(name: str, resource: str, quantity: str = "1") -> dict[str, Any]:
    """A container that asks for `quantity` of `resource` (the API server defaults an extended
    resource's request to its limit)."""
    return {"name": name, "resources": {"limits": {resource: quantity}}}


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    namespace: str = NAMESPACE,
    old: dict[str, Any] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """The AdmissionReview v1 the API server posts for a Pod."""
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    # In the API server's order: kind before apiVersion, the uid first in the request.
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "subResource": "",
            "requestKind": gvk,
            "requestResource": gvr,
            "requestSubResource": "",
            "name": obj.get("metadata", {}).get("name", "") if isinstance(obj, dict) else "",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kamiwaza:core", "groups": []},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def apply_patch(document: Any, ops: list[dict[str, Any]]) -> Any:
    """The document with a JSON Patch applied by the `jsonpatch` library, an RFC 6902
    implementation independent of the webhook's generator; the document is left as it was."""
    return jsonpatch.apply_patch(document, ops)


def patch_of(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The decoded JSON Patch of an AdmissionReview response ([] when there is none)."""
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(body["patch"]))
    return ops


def webhook_app(
    owner: Owner,
    configmaps: dict[str, dict[str, Any]] | None = None,
    *,
    now: datetime = NOW,
    max_body_bytes: int | None = None,
    **settings: Any,
) -> tuple[web.Application, MemorySource, PolicyStore]:
    """A webhook app fed from memory; by default the owner's profile is published."""
    values: dict[str, Any] = {
        "gpu_registry_credentials_secret": GPU_SECRET,
        "cpu_registry_credentials_secret": CPU_SECRET,
        "scheduler_name": SCHEDULER,
    }
    values.update(settings)
    policy = owner.settings(**values)
    if configmaps is None:
        configmaps = {DEFAULT_CONFIGMAP_NAME: published(owner.sign())}
    source = MemorySource(configmaps)
    store = PolicyStore(policy, clock=lambda: now)
    extra: dict[str, Any] = {}
    if max_body_bytes is not None:
        extra["max_body_bytes"] = max_body_bytes
    app = create_app(policy, source, store=store, clock=lambda: now, **extra)
    return app, source, store
