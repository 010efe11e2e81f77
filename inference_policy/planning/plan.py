"""What a plan is: one typed model, one wire form, one parser.

The planner produces a `Plan`; the webhook writes `Plan.text()` into the Pod's
`kamiwaza.ai/plan` annotation; the extender, the allocation controller and `tmi plan` read it
back through `parse_plan` and nothing else. Keeping every reader on this one function is what
keeps them agreeing on what a valid plan is (its status, its size cap, which fields each path
must and must not carry, that every quantity is a quantity), so a plan one component accepts is
never one another refuses.

The wire form is the contract's (section 3) and does not change: fields appear in the contract's
order, an external plan carries only `status`, `path`, `derived` and `engine`, a CPU plan has no
`limits`, `recipe` appears only when a recipe pinned the plan, `claim` only on a plan for a
DRA binding (whose `resources` then name no device: the claim does), and `choice` only on a GPU
plan made with the owner's room figures in view (`inference_policy.planning.room`). Serialisation
therefore dumps exactly the fields that were set, and parsing records exactly the fields that
were present.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
)
from pydantic import model_validator as _model_validator

from inference_policy.base import strictjson
from inference_policy.base.bounded import keep
from inference_policy.base.errors import describe
from inference_policy.base.quantity import UNSIGNED_PATTERN, QuantityError, resource_units
from inference_policy.base.strict import Strict
from inference_policy.base.wire import PLAN_ANNOTATION
from inference_policy.planning.request import InferenceResources
from inference_policy.trust.profile import ARCH_KEY, MAX_VERSION

MAX_PLAN_BYTES = 64 * 1024
LOCAL_FIELDS = (
    "profile",
    "bindingId",
    "variantId",
    "image",
    "runtimeClassName",
    "nodeSelector",
    "resources",
    "deviceCount",
    "engineArgs",
    "inferenceResources",
    "bundle",
)
_PARSE_MEMO = 1024
_WIRE = "_wire_form"
_TEXT = "_wire_text"

Name = Annotated[str, Field(min_length=1, max_length=253)]
Quantities = dict[Name, Annotated[str, Field(max_length=64, pattern=UNSIGNED_PATTERN)]]


class PlanError(ValueError):
    """A plan annotation that is not a plan; the message names what is wrong."""


class PlanResources(Strict):
    requests: Quantities
    limits: Quantities | None = None


class PlanClaim(Strict):
    """A DRA plan's device claim: the owner's ResourceClaimTemplate the engine container's claim
    comes from, the DeviceClasses it may be allocated from (its binding's first, then the ones
    it spills to, in order), how many devices, and which rule chose the template."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    template: Name
    deviceClasses: Annotated[list[Name], Field(min_length=1, max_length=16)]
    count: Annotated[int, Field(ge=1, le=8)]
    spill: Literal["none", "firstAvailable"]


class PlanChoice(Strict):
    """Which rule chose the binding among the compatible ones (`inference_policy.planning.room`):
    `smallest-with-room` passed over the smaller bindings the owner's figures showed full,
    `smallest-that-fits` took the smallest because the figures were missing, stale or showed
    none with room."""

    rule: Literal["smallest-with-room", "smallest-that-fits"]
    passed: Annotated[list[Name], Field(max_length=32)]


class PlanBundle(Strict):
    # A profile version, bounded as the profile bounds it.
    version: Annotated[int, Field(ge=1, le=MAX_VERSION)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Plan(Strict):
    """A plan (HTTP 200): the binding, image and resources a deployment request is granted."""

    status: Literal[200]
    path: Literal["gpu", "cpu", "external"]
    derived: bool
    profile: Name | None = None
    bindingId: Name | None = None
    engine: Annotated[str, Field(min_length=1, max_length=64)]
    variantId: Name | None = None
    image: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    runtimeClassName: Name | None = None
    nodeSelector: dict[Name, Annotated[str, Field(max_length=63)]] | None = None
    resources: PlanResources | None = None
    deviceCount: Annotated[int, Field(ge=0, le=8)] | None = None
    engineArgs: dict[Name, int | float] | None = None
    inferenceResources: InferenceResources | None = None
    bundle: PlanBundle | None = None
    recipe: Name | None = None
    claim: PlanClaim | None = None
    choice: PlanChoice | None = None

    @_model_validator(mode="after")
    def _shape(self) -> Plan:
        present = self.model_fields_set
        if self.path == "external":
            extra = [
                name for name in (*LOCAL_FIELDS, "recipe", "claim", "choice") if name in present
            ]
            if extra:
                raise ValueError(
                    "an external plan carries no local fields; found " + ", ".join(extra)
                )
            return self
        missing = [name for name in LOCAL_FIELDS if name not in present]
        if missing:
            raise ValueError(f"a {self.path} plan must carry " + ", ".join(missing))
        if not (self.nodeSelector or {}).get(ARCH_KEY):
            raise ValueError(f"nodeSelector must name {ARCH_KEY}")
        if self.resources is None or not (self.resources.requests or self.claim):
            raise ValueError("resources.requests must name what the Pod is granted")
        if self.claim is not None and self.path != "gpu":
            raise ValueError("only a gpu plan claims devices")
        if self.choice is not None and self.path != "gpu":
            raise ValueError("only a gpu plan records a binding choice")
        if not self.image or not self.variantId:
            raise ValueError(f"a {self.path} plan must name its image and variantId")
        if self.path == "gpu":
            if not self.bindingId or self.bundle is None:
                raise ValueError("a gpu plan must name its bindingId and bundle")
            if self.resources.limits != self.resources.requests:
                raise ValueError("a gpu plan's limits must equal its requests")
        elif self.resources.limits is not None or self.runtimeClassName is not None:
            raise ValueError("a cpu plan has no limits and no runtimeClassName")
        return self

    # -- reading -------------------------------------------------------------------------------

    @property
    def local(self) -> bool:
        """The plan creates a workload (a gpu or cpu plan)."""
        return self.path != "external"

    @property
    def arch(self) -> str | None:
        return (self.nodeSelector or {}).get(ARCH_KEY)

    @property
    def bundle_sha256(self) -> str | None:
        return self.bundle.sha256 if self.bundle is not None else None

    @property
    def requests(self) -> Mapping[str, str]:
        return self.resources.requests if self.resources is not None else {}

    @property
    def limits(self) -> Mapping[str, str]:
        limits = self.resources.limits if self.resources is not None else None
        return limits or {}

    def request_units(self) -> dict[str, int]:
        """The granted requests in the scheduler's units (millicores for cpu); PlanError for an
        amount past the range any resource has."""
        try:
            return {name: resource_units(name, value) for name, value in self.requests.items()}
        except QuantityError as exc:
            raise PlanError(f"the {PLAN_ANNOTATION} annotation grants {exc}") from None

    # -- writing -------------------------------------------------------------------------------

    # The wire object and its text are kept in the instance's dict once made: a plan is written
    # into every replica's annotation and compared by the controller, and a frozen plan's wire
    # form cannot change. (Pydantic's private attributes would cost a microsecond per read.)

    def wire(self) -> dict[str, Any]:
        """The plan as the contract's JSON object: exactly the fields that were set. Shared,
        not copied: treat it as read-only."""
        cached: dict[str, Any] | None = self.__dict__.get(_WIRE)
        if cached is None:
            cached = self.__dict__[_WIRE] = self.model_dump(mode="json", exclude_unset=True)
        return cached

    def text(self) -> str:
        """The annotation's text: compact JSON, the same bytes for the same plan."""
        cached: str | None = self.__dict__.get(_TEXT)
        if cached is None:
            cached = self.__dict__[_TEXT] = strictjson.dumps_compact(self.wire())
        return cached

    def __eq__(self, other: object) -> bool:
        # Two plans are the same plan when their wire forms are: that is what a Pod carries.
        return isinstance(other, Plan) and self.wire() == other.wire()

    __hash__ = None  # type: ignore[assignment]

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Plan:
        # A copy with changes is another plan: its wire form is made afresh.
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop(_WIRE, None)
        copied.__dict__.pop(_TEXT, None)
        return copied

    @classmethod
    def from_planner(cls, body: Mapping[str, Any]) -> Plan:
        """A plan the planner built, validated like any other, keeping the planner's object as
        its wire form (the same fields in the same order) instead of dumping it again.

        Many requests share a plan (replicas, and distinct deployments that land on the same
        binding with the same image and size), and a plan is immutable, so one plan object is
        kept per wire text: the same text validates once."""
        text = strictjson.dumps_compact(body)
        return _from_text(text, body)


_PLANS: dict[str, Plan] = {}
_MAX_PLANS = 1024


def _from_text(text: str, body: Mapping[str, Any]) -> Plan:
    plan = _PLANS.get(text)
    if plan is None:
        plan = Plan.model_validate(body)
        plan.__dict__[_WIRE] = dict(body)
        plan.__dict__[_TEXT] = text
        # Plans change with each profile revision.
        keep(_PLANS, text, plan, _MAX_PLANS)
    return plan


def parse_plan(annotation: str | bytes | Mapping[str, Any]) -> Plan:
    """The one reader of a plan: strict JSON, the size cap, the model. PlanError says why not."""
    if isinstance(annotation, Mapping):
        return _validate(annotation)
    if isinstance(annotation, bytes):
        try:
            annotation = annotation.decode("utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"the {PLAN_ANNOTATION} annotation is not UTF-8") from None
    if not isinstance(annotation, str):
        raise PlanError(f"the {PLAN_ANNOTATION} annotation is not a string")
    return _parse_text(annotation)


@lru_cache(maxsize=_PARSE_MEMO)
def _parse_text(text: str) -> Plan:
    # Replicas of one deployment carry the same plan text and every informer event re-reads it;
    # the result is immutable, so the same text is validated once, and a plan this process
    # planned itself is not validated again.
    known = _PLANS.get(text)
    if known is not None:
        return known
    try:
        document = strictjson.loads(text, max_bytes=MAX_PLAN_BYTES, what=PLAN_ANNOTATION)
    except strictjson.StrictJSONError as exc:
        raise PlanError(f"the {PLAN_ANNOTATION} annotation cannot be read: {exc}") from None
    return _validate(document)


def _validate(document: Any) -> Plan:
    if not isinstance(document, Mapping):
        raise PlanError(f"the {PLAN_ANNOTATION} annotation is not a JSON object")
    if document.get("status") != 200:
        raise PlanError(f"the {PLAN_ANNOTATION} annotation is not a plan (status is not 200)")
    try:
        plan = Plan.model_validate(document)
    except ValidationError as exc:
        raise PlanError(
            f"the {PLAN_ANNOTATION} annotation is not a plan: {describe(exc)}"
        ) from None
    # A plan read is a plan that can be written again (compared, re-annotated, logged): JSON
    # text may hold an integer wider than 64 bits, which the model takes and no encoder here
    # writes back, so such a text is refused here rather than failing whoever writes it.
    try:
        plan.text()
    except strictjson.StrictJSONError as exc:
        raise PlanError(
            f"the {PLAN_ANNOTATION} annotation is not a plan: it holds a value that cannot be "
            f"written back ({exc})"
        ) from None
    return plan


__all__ = [
    "MAX_PLAN_BYTES",
    "Plan",
    "PlanBundle",
    "PlanChoice",
    "PlanClaim",
    "PlanError",
    "PlanResources",
    "parse_plan",
]
