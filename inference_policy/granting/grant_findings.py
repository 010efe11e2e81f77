"""The Pod as stored against its own plan: every way it differs, each with its reason.

The webhook wrote a plan and shielded the other containers at admission, but annotations are
mutable and a later writer can add a container, change an image or a resource, or hand devices
in through the environment. This compares what the API holds now with what the plan says, field
by field, and reports every difference in the order of the reasons, so the condition names the
first thing an operator can see and fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inference_policy.admission.engine_pod import (
    engine_container_name,
    planned_pod_claims,
    to_shield,
)
from inference_policy.base.access import (
    NO_DEVICE,
    NVIDIA_DEVICE_ENV,
    is_accelerator_resource,
    reaches,
)
from inference_policy.base.codes import (
    ALLOCATION_REASONS,
    IMAGE_MISMATCH,
    NODE_SELECTOR_MISMATCH,
    RESOURCES_MISMATCH,
    RUNTIME_CLASS_MISMATCH,
    UNPLANNED_DEVICE_ACCESS,
)
from inference_policy.base.pod_view import PodView, text_at
from inference_policy.base.quantity import same_quantity
from inference_policy.planning.plan import Plan
from inference_policy.trust.profile import ARCH_KEY


def _resource_findings(resources: Mapping[str, Any], plan: Plan, engine: str) -> list[str]:
    planned = {"requests": plan.requests, "limits": plan.limits}
    names = set(plan.requests) | set(plan.limits)
    found: list[str] = []
    for part in ("requests", "limits"):
        want = planned[part]
        have = _strings_or_values(resources.get(part))
        for name in sorted(names | {k for k in have if is_accelerator_resource(k)}):
            wanted, actual = want.get(name), have.get(name)
            if wanted is None and actual is None:
                continue
            if wanted is None or actual is None or not same_quantity(wanted, actual):
                found.append(
                    f"container {engine} {part}[{name}] is {_show(actual)}, the plan says "
                    f"{_show(wanted)}"
                )
    return found


def _claim_findings(spec: Mapping[str, Any], resources: Mapping[str, Any], plan: Plan) -> list[str]:
    # A DRA plan's devices are its claim: the Pod's claims and the engine container's must be
    # exactly the plan's (from the owner's template), and a plan without one has none.
    found: list[str] = []
    want = planned_pod_claims(plan)
    have = spec.get("resourceClaims") or None
    if have != want:
        found.append(f"spec.resourceClaims is {_compact(have)}, the plan says {_compact(want)}")
    want_own = [{"name": plan.claim.name}] if plan.claim is not None else None
    own = resources.get("claims") or None
    if own != want_own:
        found.append(
            f"the engine container's resources.claims is {_compact(own)}, the plan says "
            f"{_compact(want_own)}"
        )
    return found


def _compact(value: Any) -> str:
    return "absent" if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _strings_or_values(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str)}


def _show(value: Any) -> str:
    return "absent" if value is None else str(value)


def pod_findings(pod: Mapping[str, Any], plan: Plan) -> list[tuple[str, str]]:
    """Every way the stored Pod differs from its plan, as (reason, sentence), in reason order."""
    view = PodView(pod)
    spec = view.spec
    engine = engine_container_name(pod)
    found: list[tuple[str, str]] = []
    engine_container = view.container_named(engine)
    if engine_container is None:
        found.append((IMAGE_MISMATCH, f"the engine container {engine!r} is not in the Pod"))
    else:
        image = engine_container.get("image")
        if image != plan.image:
            found.append(
                (
                    IMAGE_MISMATCH,
                    f"container {engine} runs {_show(image)}, the plan names {plan.image}",
                )
            )
        resources = engine_container.get("resources")
        resources = resources if isinstance(resources, Mapping) else {}
        found.extend(
            (RESOURCES_MISMATCH, text) for text in _resource_findings(resources, plan, str(engine))
        )
        found.extend((RESOURCES_MISMATCH, text) for text in _claim_findings(spec, resources, plan))
    # Everything else that reaches for an accelerator is outside the plan: the one predicate the
    # webhook refuses with, with the engine container's own asks left to the comparison above.
    for reach in reaches(pod, engine if engine_container is not None else None):
        if reach.kind == "resource":
            found.append(
                (RESOURCES_MISMATCH, f"{reach.field} asks for an accelerator outside the plan")
            )
        elif reach.kind in ("env", "claim", "annotation"):
            found.append(
                (
                    UNPLANNED_DEVICE_ACCESS,
                    f"{reach.field} hands devices to the Pod outside the device plugin's grant",
                )
            )
    for kind, index in to_shield(pod, plan, engine=engine):
        name = view.container_at(kind, index).get("name")
        found.append(
            (
                UNPLANNED_DEVICE_ACCESS,
                f"spec.{kind}[{name}] does not set {NVIDIA_DEVICE_ENV}={NO_DEVICE}, so an image "
                "whose environment asks for every GPU gets them",
            )
        )
    runtime_class = spec.get("runtimeClassName") or None
    if runtime_class != plan.runtimeClassName:
        found.append(
            (
                RUNTIME_CLASS_MISMATCH,
                f"runtimeClassName is {_show(runtime_class)}, the plan says "
                f"{_show(plan.runtimeClassName)}",
            )
        )
    selector = text_at(view.node_selector, ARCH_KEY)
    if selector != plan.arch:
        found.append(
            (
                NODE_SELECTOR_MISMATCH,
                f"nodeSelector {ARCH_KEY} is {_show(selector)}, the plan says {_show(plan.arch)}",
            )
        )
    order = {reason: i for i, reason in enumerate(ALLOCATION_REASONS)}
    return sorted(found, key=lambda item: order[item[0]])
