"""Spill across device-plugin bindings: the room figures the owner publishes, and the rule that
picks a binding with them.

The planner's default is the smallest compatible binding (`gpu_plan`). When that binding is full
a planned Pod waits Pending even though a larger compatible binding has room: the webhook
cannot see Nodes. A DRA plan spills by itself (its claim lists the compatible bindings as
`firstAvailable` sub-requests); a device-plugin plan names one resource, so the choice has to be
made at admission. The owner's extender, which does see Nodes, publishes into each tenant
namespace how much of each binding's resource is free on the hardware the binding vouches for:
counts only, the total and the largest amount free on one node, no node names. The webhook
then plans the smallest compatible binding whose largest free amount holds the Pod, and falls
back to the smallest that fits when the figures are missing, stale, for another profile revision
or show no binding with room. The plan records which rule chose and which bindings it passed
over (`Plan.choice`).

The check of a plan against the core (the extender's grant check, the allocation controller)
cannot see the figures the webhook saw, so it replays the recorded choice: the same passed-over
bindings are skipped, and the plan must come out identical. A choice that passed over a binding
the request could not use, or one not smaller than the chosen one, does not replay to the same
plan. What the tenant can do with a forged choice (or forged figures, since the figures live in
its namespace) is take a larger compatible binding that its request would have got had the
smaller ones been full: the same binding it could get by pinning the isolation or profile, within
its quota, never a binding the profile does not grant for the request.

Pure: the figures are parsed from text, and the choice is a function of the ranked candidates.
This is the part the planner reads; the figures are computed from the nodes by the extender's
side, in placing (`inference_policy.placing.room_figures`), which the planner never imports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Annotated, Any, Final, Literal

from pydantic import Field, ValidationError

from inference_policy.base import strictjson
from inference_policy.base.errors import describe
from inference_policy.base.strict import Strict
from inference_policy.planning.plan import PlanChoice
from inference_policy.trust.profile import parse_timestamp

ROOM_CONFIGMAP = "tmi-binding-room"
ROOM_KEY = "room.json"
WITH_ROOM: Final = "smallest-with-room"
SMALLEST: Final = "smallest-that-fits"
DEFAULT_MAX_AGE = timedelta(seconds=90)
# What a reader of the figures takes at most (the tenant can write the ConfigMap too): the
# text, and one entry per device-plugin binding of the profile.
MAX_ROOM_BYTES = 64 * 1024
MAX_ROOM_BINDINGS = 256
# A clock a little ahead of the writer's is not a figure from the future.
_SKEW = timedelta(seconds=30)

Name = Annotated[str, Field(min_length=1, max_length=253)]
Count = Annotated[int, Field(ge=0, le=1 << 40)]


class RoomError(ValueError):
    """Room figures that cannot be read; the message says what is wrong."""


class BindingRoom(Strict):
    """One binding's free capacity in its resource's units: the total, and the most on one
    node (what a one-node Pod needs)."""

    free: Count
    largestOnNode: Count


class RoomFigures(Strict):
    """The figures for one tenant namespace under one profile revision (by bundle sha256)."""

    schemaVersion: Literal[1]
    bundle: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    observedAt: Annotated[str, Field(max_length=64)]
    bindings: Annotated[dict[Name, BindingRoom], Field(max_length=MAX_ROOM_BINDINGS)]

    def text(self) -> str:
        return strictjson.dumps_compact(self.model_dump(mode="json"))

    @cached_property
    def observed(self) -> datetime:
        """`observedAt` parsed, once per figures (the webhook asks on every review)."""
        return parse_timestamp(self.observedAt)

    @cached_property
    def largest(self) -> Mapping[str, int]:
        """Each binding's most free on one node: what a choice reads."""
        return {k: v.largestOnNode for k, v in self.bindings.items()}


def parse_figures(text: str) -> RoomFigures:
    """The one reader of the published figures: strict JSON, a size cap, the model."""
    try:
        document = strictjson.loads(text, max_bytes=MAX_ROOM_BYTES, what=ROOM_KEY)
    except strictjson.StrictJSONError as exc:
        raise RoomError(f"{ROOM_CONFIGMAP} {ROOM_KEY} cannot be read: {exc}") from None
    try:
        figures = RoomFigures.model_validate(document)
        parse_timestamp(figures.observedAt)
    except ValidationError as exc:
        raise RoomError(
            f"{ROOM_CONFIGMAP} {ROOM_KEY} is not room figures: {describe(exc)}"
        ) from None
    except ValueError as exc:
        raise RoomError(f"{ROOM_CONFIGMAP} {ROOM_KEY} observedAt: {exc}") from None
    return figures


@dataclass(frozen=True)
class Room:
    """What a decision knows of room: the largest free amount per binding from fresh figures
    (None: no usable figures), or a recorded choice to replay (`replay`)."""

    largest: Mapping[str, int] | None
    replay: PlanChoice | None = None
    why: str = ""


def live(
    figures: RoomFigures | None,
    bundle_sha256: str | None,
    now: datetime,
    max_age: timedelta = DEFAULT_MAX_AGE,
    unreadable: str | None = None,
) -> Room:
    """The room a webhook plans with, from the figures last read (None: none were)."""
    if figures is None:
        return Room(None, why=unreadable or f"no {ROOM_CONFIGMAP} figures were published")
    if figures.bundle != bundle_sha256:
        return Room(None, why="the figures are for another profile revision")
    observed = figures.observed
    if now - observed > max_age or observed - now > _SKEW:
        return Room(None, why=f"the figures, observed at {figures.observedAt}, are stale")
    return Room(figures.largest)


def replaying(choice: PlanChoice | None) -> Room | None:
    """The room a plan's check replays: its recorded choice, or none when it recorded none."""
    return None if choice is None else Room(None, replay=choice)


def choose(room: Room, ranked: Sequence[tuple[str, int, bool]]) -> tuple[int, PlanChoice]:
    """Which of the ranked candidates (binding id, the Pod's quantity of its resource, whether its
    class publishes no room: a claimed binding) the rule takes, and the choice to record. The
    candidates are in the planner's order, smallest first, and there is at least one."""
    if room.replay is not None:
        if room.replay.rule == SMALLEST:
            return 0, PlanChoice(rule=SMALLEST, passed=[])
        skip = set(room.replay.passed)
        passed: list[str] = []
        for index, (binding_id, _, _) in enumerate(ranked):
            if binding_id not in skip:
                return index, PlanChoice(rule=WITH_ROOM, passed=passed)
            passed.append(binding_id)
        return 0, PlanChoice(rule=SMALLEST, passed=[])
    if room.largest is None:
        return 0, PlanChoice(rule=SMALLEST, passed=[])
    passed = []
    for index, (binding_id, quantity, claimed) in enumerate(ranked):
        # A claimed (DRA) binding's room is the scheduler's to find: its claim spills itself.
        if claimed or room.largest.get(binding_id, 0) >= quantity:
            return index, PlanChoice(rule=WITH_ROOM, passed=passed)
        passed.append(binding_id)
    return 0, PlanChoice(rule=SMALLEST, passed=[])


def configmap(namespace: str, figures: RoomFigures) -> dict[str, Any]:
    """The ConfigMap the owner's extender writes into a tenant namespace."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROOM_CONFIGMAP,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "tmi-extender"},
        },
        "data": {ROOM_KEY: figures.text()},
    }


__all__ = [
    "DEFAULT_MAX_AGE",
    "MAX_ROOM_BINDINGS",
    "MAX_ROOM_BYTES",
    "ROOM_CONFIGMAP",
    "ROOM_KEY",
    "SMALLEST",
    "WITH_ROOM",
    "BindingRoom",
    "Room",
    "RoomError",
    "RoomFigures",
    "choose",
    "configmap",
    "live",
    "parse_figures",
    "replaying",
]
