"""Engine Pods as the platform creates them, and the seed's Step 7 reading of them.

The e2e tests, the benchmarks and `make demo` create engine Pods the way the platform does (the
deployment label and request annotation, nothing planned yet) and report the rows the seed's
Step 7 check prints: node, RuntimeClass, grant and the AllocationVerified status.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from inference_policy.base.access import is_accelerator_resource
from inference_policy.base.wire import ALLOCATION_VERIFIED, ENGINE_LABEL, REQUEST_ANNOTATION
from localcluster.plane.kube import JSON

CONDITION = ALLOCATION_VERIFIED


def engine_pod(
    namespace: str,
    request: Mapping[str, Any],
    *,
    name: str | None = None,
    deployment_id: str | None = None,
    container: Mapping[str, Any] | None = None,
) -> JSON:
    """An engine Pod as the platform creates it, before the webhook has planned it."""
    deployment = deployment_id or str(uuid.uuid4())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"tmi-{uuid.uuid4().hex[:10]}",
            "namespace": namespace,
            "labels": {ENGINE_LABEL: deployment},
            "annotations": {REQUEST_ANNOTATION: json.dumps(request)},
        },
        "spec": {
            "containers": [
                dict(container)
                if container is not None
                else {"name": "engine", "image": "placeholder.invalid/engine:1"}
            ],
            # No kubelet confirms termination here; nothing is gained by waiting for one.
            "terminationGracePeriodSeconds": 0,
        },
    }


def engine_deployment(
    namespace: str,
    name: str,
    request: Mapping[str, Any],
    *,
    replicas: int,
    max_surge: int,
    max_unavailable: int,
    grace_seconds: int = 0,
) -> JSON:
    """An engine Deployment as the platform's installer creates it (each Pod as ``engine_pod``
    makes one, its deployment id the Deployment's name)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
            },
            "template": {
                "metadata": {
                    "labels": {"app": name, ENGINE_LABEL: name},
                    "annotations": {REQUEST_ANNOTATION: json.dumps(request)},
                },
                "spec": {
                    "containers": [{"name": "engine", "image": "placeholder.invalid/engine:1"}],
                    "terminationGracePeriodSeconds": grace_seconds,
                },
            },
        },
    }


def condition(pod: Mapping[str, Any], kind: str) -> JSON | None:
    for entry in pod.get("status", {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def granted(pod: Mapping[str, Any]) -> str:
    """The accelerator resources the Pod's containers were granted (limits, else requests)."""
    parts: list[str] = []
    for c in pod.get("spec", {}).get("containers") or []:
        resources = c.get("resources") or {}
        source = resources.get("limits") or resources.get("requests") or {}
        parts.extend(f"{k}={v}" for k, v in sorted(source.items()) if is_accelerator_resource(k))
    return ",".join(parts) or "-"


def step7_row(pod: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    """The columns of the seed's Step 7 check: pod, node, RuntimeClass, grant, verified."""
    spec = pod.get("spec", {})
    verified = condition(pod, CONDITION)
    return (
        str(pod["metadata"]["name"]),
        str(spec.get("nodeName") or "-"),
        str(spec.get("runtimeClassName") or "-"),
        granted(pod),
        str(verified["status"]) if verified else "-",
    )


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


__all__ = [
    "CONDITION",
    "condition",
    "engine_deployment",
    "engine_pod",
    "granted",
    "step7_row",
    "table",
]
