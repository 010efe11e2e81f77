"""Builders for the extender's tests and benchmarks: a fleet profile, planned Pods, ExtenderArgs.

Pods are planned by the real planner from a profile signed by the real signing code, and
annotated the way the webhook annotates them, so a test exercises exactly what the scheduler
would send; nodes come from `localcluster.nodes.kwok.FakeNode`, which carries GFD's labels.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from aiohttp import web

from extender.app import create_app
from inference_policy.admission.engine_pod import planned_pod as core_planned_pod
from inference_policy.base.wire import ENGINE_LABEL as DEPLOYMENT_LABEL
from inference_policy.base.wire import PLAN_ANNOTATION, REQUEST_ANNOTATION
from inference_policy.planning.plan import parse_plan
from kits.memory_sources import ExtenderMemorySource as MemorySource
from kits.profilekit import NAMESPACE, NOW, Owner, gpu_binding, gpu_profile, request, with_profiles
from localcluster.nodes.kwok import FakeNode

SCHEDULER = "kamiwaza-inference-scheduler"
WHOLE = "nvidia-whole-amd64"
MIG = "nvidia-mig-3g40gb-amd64"
SHARE = "nvidia-vram-l40s-amd64"
VRAM = "kamiwaza.ai/vram-gb-gpu-0"


def fleet_envelope(owner: Owner, *, mig: bool = True) -> dict[str, Any]:
    """Whole H100-class GPUs, A100 3g.40gb MIG slices and L40S accounted shares, plus CPU."""
    profiles = [
        gpu_profile("nvidia-whole", "whole-device", [gpu_binding(WHOLE, cc="8.0", memory="79Gi")]),
        gpu_profile(
            "nvidia-vram-share",
            "accounted-share",
            [
                gpu_binding(
                    SHARE,
                    allocator="vram-plugin",
                    resource=VRAM,
                    cc="8.9",
                    cuda=12,
                    memory="44Gi",
                )
            ],
        ),
    ]
    if mig:
        profiles.insert(
            1,
            gpu_profile(
                "nvidia-mig-3g40gb",
                "mig",
                [gpu_binding(MIG, resource="nvidia.com/mig-3g.40gb", memory="38Gi")],
            ),
        )
    return with_profiles(owner, *profiles)


def published(configmap: Mapping[str, Any], resource_version: str = "1001") -> dict[str, Any]:
    out = copy.deepcopy(dict(configmap))
    out["metadata"]["uid"] = str(uuid.uuid4())
    out["metadata"]["resourceVersion"] = resource_version
    return out


def block(profile: str, memory: str = "8Gi") -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "accelerator": {
            "capability": "gpu",
            "count": 1,
            "memory": {"minimum": memory},
            "isolation": "any-qualified",
            "profile": profile,
        },
        "runtime": {"selection": "automatic"},
    }


class PlanBody(dict[str, Any]):
    """A plan as the webhook answers it, remembering the deployment request it was made for, so
    that `planned_pod` writes the Pod the webhook would (the extender checks the grant)."""

    request: dict[str, Any]


def plan_for(
    owner: Owner, envelope: dict[str, Any], document: dict[str, Any], **settings: Any
) -> PlanBody:
    """The webhook's plan for `document` under `envelope` (`settings`: the tenant's, say its
    namespace)."""
    decision = owner.state(envelope, **settings).decide(document, NOW)
    assert decision.allowed, decision.body
    body = PlanBody(decision.body)
    body.request = copy.deepcopy(document)
    return body


def planned_pod(
    plan: Mapping[str, Any] | str | None,
    *,
    name: str | None = None,
    namespace: str = NAMESPACE,
    node: str | None = None,
    phase: str = "Pending",
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An engine Pod as the webhook leaves it (plan annotation, label, resources, scheduler):
    exactly, by the core's own rewrite, for a plan from `plan_for` without other `resources`;
    otherwise a Pod made by hand, as a replaced webhook would make it."""
    name = name or f"tmi-{uuid.uuid4().hex[:8]}"
    if isinstance(plan, PlanBody) and resources is None:
        return _as_the_webhook_leaves_it(name, namespace, plan, node, phase)
    annotations: dict[str, str] = {}
    if plan is not None:
        annotations[PLAN_ANNOTATION] = (
            plan if isinstance(plan, str) else json.dumps(plan, separators=(",", ":"))
        )
    if resources is None:
        resources = plan["resources"] if isinstance(plan, Mapping) else {}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "engine", "image": "engine", "resources": dict(resources)}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "labels": {DEPLOYMENT_LABEL: name},
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def _as_the_webhook_leaves_it(
    name: str, namespace: str, plan: PlanBody, node: str | None, phase: str
) -> dict[str, Any]:
    """The core's own rewrite of an engine Pod that asks for nothing itself, so that what the
    ledger holds is exactly the plan's."""
    parsed = parse_plan(plan)
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "labels": {DEPLOYMENT_LABEL: name},
            "annotations": {REQUEST_ANNOTATION: json.dumps(plan.request, separators=(",", ":"))},
        },
        "spec": {"containers": [{"name": "engine", "image": "placeholder.invalid/engine:1"}]},
    }
    pod = core_planned_pod(
        pod, 0, parsed, parsed.text(), scheduler_name=SCHEDULER, pull_secret=None
    )
    pod["status"] = {"phase": phase}
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def bound(pod: Mapping[str, Any], node: str, phase: str = "Running") -> dict[str, Any]:
    out = copy.deepcopy(dict(pod))
    out["metadata"]["name"] = f"{out['metadata']['name']}-{uuid.uuid4().hex[:6]}"
    out["spec"]["nodeName"] = node
    out["status"] = {"phase": phase}
    return out


def cache_args(pod: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}


def full_args(pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    items = []
    for node in nodes:
        item = copy.deepcopy(dict(node))
        # Informer objects carry no TypeMeta; the scheduler sends them that way.
        item.pop("apiVersion", None)
        item.pop("kind", None)
        items.append(item)
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}


def extender_app(
    owner: Owner,
    nodes: Iterable[FakeNode | Mapping[str, Any]] = (),
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    envelope: dict[str, Any] | None = None,
    configmap: Mapping[str, Any] | bool | None = True,
    now: datetime = NOW,
    source: MemorySource | None = None,
    pod_namespaces: Iterable[str] | None = None,
    allocation_controller: str | None = None,
) -> tuple[web.Application, MemorySource]:
    """An extender app fed from memory: the owner's fleet profile published, nodes and pods;
    with `allocation_controller`, its rights checked (the test records them on the view)."""
    if source is None:
        manifests = [n.manifest() if isinstance(n, FakeNode) else dict(n) for n in nodes]
        if configmap is True:
            configmap = published(owner.sign(envelope or fleet_envelope(owner)))
        source = MemorySource(
            manifests, pods, configmap if isinstance(configmap, Mapping) else None
        )
    app = create_app(
        owner.settings(scheduler_name=SCHEDULER),
        source,
        pod_namespaces=pod_namespaces,
        clock=lambda: now,
        allocation_controller=allocation_controller,
    )
    return app, source


__all__ = [
    "MIG",
    "NAMESPACE",
    "SHARE",
    "VRAM",
    "WHOLE",
    "PlanBody",
    "block",
    "bound",
    "cache_args",
    "extender_app",
    "fleet_envelope",
    "full_args",
    "plan_for",
    "planned_pod",
    "published",
    "request",
]
