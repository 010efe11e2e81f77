"""What a planned engine Pod looks like, and what may change on a Pod once it is admitted.

These are decisions, not wire handling, so they live in the core beside the planner: the
admission webhook applies them (and turns the difference into a JSON Patch), the allocation
controller checks a running Pod against the same plan, and the tests state them without a
server.

* `planned_pod`: the plan replaces what it governs. The engine container gets the plan's image
  and accelerator asks (its own cpu and memory asks stay; a CPU plan drops its limits, as the
  seed says) and, for a DRA binding, the claim; the Pod gets the plan's RuntimeClass (removed
  for a CPU plan) and resource claims (a DRA plan's, from the owner's template; else none), the
  whole nodeSelector, the owner's scheduler, the staging pull Secret and the AllocationVerified
  readiness gate, and carries the plan as its annotation.
* `admission_refusal`: an engine Pod may not reach for an accelerator outside its engine
  container's plan, nor name its node (which would bypass the scheduler that checks the
  grant); any other Pod may not reach for one at all.
* `update_refusal`: on UPDATE the plan annotation is frozen, the engine container keeps the
  image its plan names, and no reach may be added or changed.
* `to_shield` / `shield_edits`: every container that holds no grant gets
  `NVIDIA_VISIBLE_DEVICES=void`, so an image whose environment asks the NVIDIA runtime for every
  GPU gets none (see `inference_policy.base.access`). That is every container of a Pod without a
  plan, every container but the engine container of a GPU plan, all of a CPU plan's, and on
  UPDATE each ephemeral container the update adds (nothing else may change then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from inference_policy.base.access import (
    NO_DEVICE,
    NVIDIA_DEVICE_ENV,
    Reach,
    is_accelerator_resource,
    new_reaches,
    reaches,
    unshielded,
)
from inference_policy.base.codes import RefusalCode
from inference_policy.base.pod_view import PodView, as_mapping, is_map, text_at
from inference_policy.base.wire import (
    ALLOCATION_VERIFIED,
    ENGINE_CONTAINER_ANNOTATION,
    PLAN_ANNOTATION,
)
from inference_policy.planning.plan import Plan, PlanError, parse_plan

READINESS_GATE = ALLOCATION_VERIFIED
_PLANNED_PARTS = frozenset(("requests", "limits", "claims"))


@dataclass(frozen=True, slots=True)
class PodRefusal:
    """A Pod refused by admission policy: HTTP status, stable code and the message."""

    status: int
    code: RefusalCode
    message: str


def engine_container_name(pod: Mapping[str, Any]) -> str | None:
    """The container a plan governs: the one the annotation names, else the first."""
    view = PodView(pod)
    named = view.annotation(ENGINE_CONTAINER_ANNOTATION)
    if named:
        return named
    return text_at(view.container_at("containers", 0), "name")


def forgery_message(found: Sequence[Reach]) -> str:
    fields = [reach.field for reach in found]
    return (
        "tenant-mode inference: this Pod asks for accelerator access outside a plan ("
        + ", ".join(fields)
        + "); only an engine Pod planned by this webhook may, so remove "
        + ("it" if len(fields) == 1 else "them")
    )


def admission_refusal(
    pod: Mapping[str, Any], engine: str | None, scheduler_name: str
) -> PodRefusal | None:
    """A CREATE's forgery check: `engine` is the engine container of an engine Pod, None for
    any other Pod."""
    found = reaches(pod, engine)
    fields = list(found)
    if engine is not None and PodView(pod).spec.get("nodeName"):
        fields.append(
            Reach(f"spec.nodeName (engine Pods are placed by {scheduler_name})", "", "node")
        )
    if fields:
        return PodRefusal(403, RefusalCode.FORGERY, forgery_message(fields))
    return None


def update_refusal(pod: Mapping[str, Any], old: Mapping[str, Any]) -> PodRefusal | None:
    """An UPDATE: the plan annotation frozen, the planned image kept, no reach added or raised."""
    was, now = PodView(old), PodView(pod)
    before = was.annotations.get(PLAN_ANNOTATION)
    after = now.annotations.get(PLAN_ANNOTATION)
    if before != after:
        if before is None:
            message = (
                f"the {PLAN_ANNOTATION} annotation is written by the admission webhook when "
                "it plans a Pod; it cannot be added afterwards"
            )
        else:
            message = (
                f"the {PLAN_ANNOTATION} annotation is fixed when the Pod is admitted; it "
                "cannot be changed or removed"
            )
        return PodRefusal(403, RefusalCode.PLAN_ANNOTATION, message)
    if isinstance(before, str):
        named_before = was.annotations.get(ENGINE_CONTAINER_ANNOTATION)
        if now.annotations.get(ENGINE_CONTAINER_ANNOTATION) != named_before:
            return PodRefusal(
                403,
                RefusalCode.PLAN_ANNOTATION,
                f"the {ENGINE_CONTAINER_ANNOTATION} annotation is fixed when the Pod is "
                "admitted, as its plan is; it cannot be added, changed or removed",
            )
        image = _planned_image(before)
        engine = engine_container_name(old)
        now_image, was_image = _image(pod, engine), _image(old, engine)
        if image is not None and now_image not in (was_image, image):
            return PodRefusal(
                403,
                RefusalCode.PLAN_ANNOTATION,
                f"container {engine} runs the image its plan names ({image}); it cannot be "
                "changed on an admitted Pod",
            )
    added = new_reaches(pod, old)
    if added:
        return PodRefusal(403, RefusalCode.FORGERY, forgery_message(added))
    return None


def _image(pod: Mapping[str, Any], container: str | None) -> Any:
    entry = PodView(pod).container_named(container)
    return None if entry is None else entry.get("image")


def _planned_image(text: str) -> str | None:
    try:
        plan = parse_plan(text)
    except PlanError:
        return None
    return plan.image


class Edit(NamedTuple):
    """One field the plan sets (or, with `remove`, takes away), by its path in the Pod.

    A named tuple rather than a frozen dataclass: a planned Pod takes eight or more, made on
    every admission, and a frozen dataclass's constructor costs three times as much."""

    path: tuple[str | int, ...]
    value: Any = None
    remove: bool = False


class PlanFields(NamedTuple):
    """The fields a plan sets that depend on the plan and the install only, not on the Pod:
    made once per plan and container index and reused for every Pod planned so (the edits on
    either side of the engine container's resources, in the patch's order)."""

    head: tuple[Edit, ...]
    tail: tuple[Edit, ...]


def plan_fields(
    index: int, plan: Plan, plan_text: str, *, scheduler_name: str, pull_secret: str | None
) -> PlanFields:
    """The plan's own fields for its engine container at `index`, with this install's
    scheduler and pull Secret."""
    head = (
        Edit(("metadata", "annotations", PLAN_ANNOTATION), plan_text),
        Edit(("spec", "containers", index, "image"), plan.image),
    )
    tail = [
        Edit(("spec", "runtimeClassName"), plan.runtimeClassName, not plan.runtimeClassName),
        Edit(("spec", "resourceClaims"), planned_pod_claims(plan), plan.claim is None),
        Edit(("spec", "nodeSelector"), dict(plan.nodeSelector or {})),
        Edit(("spec", "schedulerName"), scheduler_name),
    ]
    if pull_secret:
        # The seed: engine Pods carry only the staging credential as their pull Secret.
        tail.append(Edit(("spec", "imagePullSecrets"), [{"name": pull_secret}]))
    return PlanFields(head, tuple(tail))


def plan_edits(pod: Mapping[str, Any], index: int, plan: Plan, fields: PlanFields) -> list[Edit]:
    """Every field the plan governs, with the value the planned Pod holds there: the plan's
    own fields (`plan_fields` for this plan and container index) and the ones that depend on
    the Pod. Fields already holding that value are included too: the caller compares, so a
    planned Pod (a reinvoked webhook) comes out unchanged."""
    view = PodView(pod)
    container = view.container_at("containers", index)
    edits = [
        *fields.head,
        Edit(
            ("spec", "containers", index, "resources"),
            planned_resources(as_mapping(container.get("resources")), plan),
        ),
        *fields.tail,
    ]
    gates = view.spec.get("readinessGates") or []
    if not any(is_map(g) and g.get("conditionType") == READINESS_GATE for g in gates):
        edits.append(Edit(("spec", "readinessGates"), [*gates, {"conditionType": READINESS_GATE}]))
    return edits


def apply_edits(pod: Mapping[str, Any], edits: Sequence[Edit]) -> dict[str, Any]:
    """The Pod with the edits made, copying only the objects on their paths."""
    new = dict(pod)
    for edit in edits:
        parent: Any = new
        for token in edit.path[:-1]:
            if isinstance(parent, list) and isinstance(token, int):
                child = parent[token]
            else:
                child = parent.get(token)
            child = list(child) if isinstance(child, list) else dict(child or {})
            parent[token] = child
            parent = child
        last = edit.path[-1]
        if edit.remove:
            parent.pop(last, None)
        else:
            parent[last] = edit.value
    return new


def planned_pod(
    pod: Mapping[str, Any],
    index: int,
    plan: Plan,
    plan_text: str,
    *,
    scheduler_name: str,
    pull_secret: str | None,
) -> dict[str, Any]:
    """The Pod as the plan wants it (what the webhook's patch makes of it)."""
    fields = plan_fields(
        index, plan, plan_text, scheduler_name=scheduler_name, pull_secret=pull_secret
    )
    edits = plan_edits(pod, index, plan, fields)
    edits += shield_edits(pod, to_shield(pod, plan))
    return apply_edits(pod, edits)


def to_shield(
    pod: Mapping[str, Any],
    plan: Plan | None = None,
    old: Mapping[str, Any] | None = None,
    engine: str | None = None,
) -> list[tuple[str, int]]:
    """(kind, index) of the containers to shield. `plan` is the engine Pod's plan (its engine
    container, `engine` when the caller knows it already, keeps the device plugin's grant on a
    GPU plan); `old` is the Pod before an UPDATE."""
    view = PodView(pod)
    if old is not None:
        known = {c.get("name") for c in PodView(old).ephemeral_containers}
        return [
            (kind, index)
            for kind, index in unshielded(pod, ("ephemeralContainers",))
            if view.container_at(kind, index).get("name") not in known
        ]
    granted = None
    if plan is not None and plan.path == "gpu":
        granted = engine if engine is not None else engine_container_name(pod)
    return [
        (kind, index)
        for kind, index in unshielded(pod)
        if not (kind == "containers" and view.container_at(kind, index).get("name") == granted)
    ]


def shield_edits(pod: Mapping[str, Any], targets: Sequence[tuple[str, int]]) -> list[Edit]:
    """Set NVIDIA_VISIBLE_DEVICES=void on each target container, after its own variables (an
    explicit `env` entry wins over the image's environment and over `envFrom`)."""
    view = PodView(pod)
    edits = []
    for kind, index in targets:
        env = view.container_at(kind, index).get("env")
        entries = list(env) if isinstance(env, list) else []
        entries.append({"name": NVIDIA_DEVICE_ENV, "value": NO_DEVICE})
        edits.append(Edit(("spec", kind, index, "env"), entries))
    return edits


def planned_resources(current: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The engine container's resources: its own cpu/memory kept, accelerators from the plan.

    A CPU plan sets requests only and the seed says no limits, so limits go: a limit the
    platform had set below the planned request would otherwise make the Pod invalid.
    """
    # Loops rather than comprehensions and helpers: this runs for every planned Pod, and each
    # comprehension is a function call of its own.
    out: dict[str, Any] = {}
    for key, value in current.items():
        if key not in _PLANNED_PARTS:
            out[key] = value
    for part in ("requests",) if plan.path == "cpu" else ("requests", "limits"):
        kept: dict[str, Any] = {}
        asks = current.get(part)
        if asks:
            for key, value in as_mapping(asks).items():
                if not is_accelerator_resource(str(key)):
                    kept[key] = value
        kept.update(plan.requests if part == "requests" else plan.limits)
        if kept:
            out[part] = kept
    if plan.claim is not None:
        out["claims"] = [{"name": plan.claim.name}]
    return out


def planned_pod_claims(plan: Plan) -> list[dict[str, str]] | None:
    """The Pod's `spec.resourceClaims` under this plan: its claim from the owner's template."""
    if plan.claim is None:
        return None
    return [{"name": plan.claim.name, "resourceClaimTemplateName": plan.claim.template}]


__all__ = [
    "READINESS_GATE",
    "Edit",
    "PlanFields",
    "PodRefusal",
    "admission_refusal",
    "apply_edits",
    "engine_container_name",
    "forgery_message",
    "plan_edits",
    "plan_fields",
    "planned_pod",
    "planned_pod_claims",
    "planned_resources",
    "shield_edits",
    "to_shield",
    "update_refusal",
]
