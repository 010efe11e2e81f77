"""Engine Pods as the webhook and the scheduler leave them, for the tests and the benchmarks that
drive the allocation controller: planned as the core plans them, bound to a node, or reported
unschedulable, without an API server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from allocation_controller.ports import JSON
from inference_policy.admission.engine_pod import planned_pod as _planned
from inference_policy.planning.plan import parse_plan


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def planned_pod(
    name: str,
    request: Mapping[str, Any],
    plan: Mapping[str, Any],
    *,
    namespace: str = "kamiwaza",
    created: str | None = None,
    sidecar: bool = True,
) -> JSON:
    """An engine Pod with the plan applied as the admission webhook applies it (the core's own
    rewrite, `inference_policy.admission.engine_pod.planned_pod`). Unbound."""
    parsed = parse_plan(plan)
    containers: list[JSON] = [
        {"name": "engine", "image": "placeholder.invalid/engine:latest", "resources": {}}
    ]
    containers[0]["resources"] = {"requests": {"cpu": "2", "memory": "8Gi"}}
    if sidecar:
        containers.append({"name": "metrics", "image": "registry.invalid/exporter:1"})
    pod: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kamiwaza.ai/deployment-id": f"dep-{name}"},
            "annotations": {
                "kamiwaza.ai/deployment-request": json.dumps(request, separators=(",", ":")),
            },
            **({"creationTimestamp": created} if created else {}),
        },
        "spec": {"containers": containers},
        "status": {"phase": "Pending"},
    }
    return _planned(
        pod,
        0,
        parsed,
        parsed.text(),
        scheduler_name="kamiwaza-inference-scheduler",
        pull_secret=None,
    )


def bind(pod: JSON, node: str = "gpu-node-1", at: str | None = None) -> None:
    """What the scheduler's binding does: spec.nodeName and PodScheduled=True (in place)."""
    pod["spec"]["nodeName"] = node
    _set_condition(
        pod,
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at or _now_text()},
    )


def unschedulable(pod: JSON, message: str, at: str | None = None) -> None:
    """What a failed scheduling attempt records: PodScheduled=False with the reason (in place)."""
    _set_condition(
        pod,
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": at or _now_text(),
        },
    )


def _set_condition(pod: JSON, entry: JSON) -> None:
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    conditions[:] = [c for c in conditions if c.get("type") != entry["type"]] + [entry]
