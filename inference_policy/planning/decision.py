"""What a decision is: a plan or a refusal with its stable code, and what it is decided from.

Every edge (the webhook, the plan API, the CLI, the extender, the controller) receives a
`Decision` and maps it to its own wire format in one place; the planner raises a `Refusal`
inside and turns it into one. `PlanContext` is everything a decision depends on besides the
request: immutable data only. What a server keeps between decisions (`gpu_plan.GpuOptions`) is
no part of it; the planner's entry takes it beside the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from inference_policy.base.codes import RefusalCode
from inference_policy.planning.catalog import EngineCatalog
from inference_policy.planning.plan import Plan
from inference_policy.planning.recipe_inputs import RecipeInput
from inference_policy.trust.signing import ProfileRefused, VerifiedProfile

if TYPE_CHECKING:
    from inference_policy.planning.room import Room


@dataclass(frozen=True, slots=True)
class Decision:
    """A plan (status 200) or a refusal with its stable code; `body` is the JSON object every
    edge returns, the contract's plan or refusal."""

    status: int
    plan: Plan | None = None
    detail: str = ""
    code: RefusalCode | None = None
    wire_code: str | None = None

    @property
    def allowed(self) -> bool:
        return self.plan is not None

    @property
    def body(self) -> dict[str, Any]:
        # Not a cached property: a plan's wire form is kept on the plan already.
        if self.plan is not None:
            return self.plan.wire()
        body: dict[str, Any] = {"status": self.status, "detail": self.detail}
        # The runbook's code beside the seed's text; the contract's own `NoFit` where it gives
        # one (a request with its own block that no binding holds).
        code = self.wire_code or (self.code.value if self.code is not None else None)
        if code:
            body["code"] = code
        return body

    @classmethod
    def planned(cls, plan: Plan) -> Decision:
        return cls(200, plan)

    @classmethod
    def refused(
        cls, status: int, detail: str, code: RefusalCode, wire_code: str | None = None
    ) -> Decision:
        return cls(status, None, detail, code, wire_code)


class Refusal(Exception):
    """A refusal raised inside the planner: the HTTP status, the exact text and its code."""

    def __init__(
        self, status: int, detail: str, code: RefusalCode, wire_code: str | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = code
        self.wire_code = wire_code

    def decision(self) -> Decision:
        return Decision.refused(self.status, self.detail, self.code, self.wire_code)


class PlanContext(NamedTuple):
    """Everything a decision depends on besides the request: the configuration a server holds
    and the clock's reading for this decision (the profile's time window is checked against it).

    Immutable, and a named tuple rather than a frozen dataclass: a server makes one per
    decision, and a frozen dataclass's constructor sets each field through `object.__setattr__`
    (about 1 microsecond for these nine, a tenth of planning a request)."""

    catalog: EngineCatalog
    now: datetime
    enabled: bool = True
    profile: VerifiedProfile | None = None
    profile_refusal: ProfileRefused | None = None
    catalog_refusal: str | None = None
    gpu_recipes: RecipeInput = None
    cpu_recipes: RecipeInput = None
    """Each configured recipe catalog, or why it cannot be used (`recipe_inputs`): a decision
    that would plan locally is then refused (`planner.decide`)."""
    room: Room | None = None
    """The owner's room figures to choose among compatible device-plugin bindings with, or a
    plan's recorded choice to replay (`inference_policy.planning.room`); None: the smallest binding
    that fits, and the plan records no choice."""


__all__ = ["Decision", "PlanContext", "Refusal"]
