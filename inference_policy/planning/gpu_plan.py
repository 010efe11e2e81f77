"""The GPU path of a decision: which bindings can run the engine, which one holds the request
best, and the plan on it.

Binding choice is deterministic. Among the bindings that can run the engine's image and hold the
request, the smallest usable memory wins; ties go to the stronger isolation (the allocation
classes' rank), then to the order of the envelope. With the owner's room figures in the context
the first of that order with room wins instead (`inference_policy.planning.room`), unless the
request pins its isolation or profile. What a revision offers each engine is kept in
`GpuOptions` between decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from inference_policy.allocation import AllocationClass, Fit
from inference_policy.base.bounded import keep
from inference_policy.base.codes import RefusalCode as C
from inference_policy.base.quantity import QuantityError, format_bytes, format_gib, parse_bytes
from inference_policy.planning.catalog import Engine, EngineCatalog
from inference_policy.planning.decision import Decision, PlanContext, Refusal
from inference_policy.planning.plan import Plan, PlanChoice
from inference_policy.planning.recipes import Recipe
from inference_policy.planning.request_rules import (
    Planning,
    context_length,
    recipe_of,
    unservable,
)
from inference_policy.planning.room import choose
from inference_policy.planning.sizing import estimate_gpu
from inference_policy.trust.dra_claims import template_for
from inference_policy.trust.profile import (
    ARCH_KEY,
    GpuBinding,
    Profile,
    as_claimed,
    as_counted,
)
from inference_policy.trust.signing import VerifiedProfile

T = TypeVar("T")


class _Option(NamedTuple):
    """One GPU binding as a decision for an engine sees it, whatever the request: its place in
    the envelope, isolation, and image (or why the engine's image cannot run there)."""

    order: int
    profile: Profile
    binding: GpuBinding
    allocation: AllocationClass
    chosen: tuple[str, str] | str


class GpuOptions:
    """The bindings' options per engine and recipe, and the plans made on them, for one profile
    revision and catalog.

    Which image an engine runs on a binding, the binding's isolation, and the plan a sizing
    gets on it depend on the revision only, yet were worked out on every decision; a server
    decides many requests per revision, so it keeps them here. An entry is used only for the
    very profile, catalog and recipe objects it was made from (a new revision or catalog is a
    new object), so a stale entry can never be read, and the tables are bounded.
    """

    __slots__ = ("_catalog", "_options", "_plans", "_profile")
    MAX_ENTRIES = 1024

    def __init__(self) -> None:
        self._profile: VerifiedProfile | None = None
        self._catalog: EngineCatalog | None = None
        self._options: dict[Any, tuple[Recipe | None, tuple[_Option, ...]]] = {}
        self._plans: dict[Any, tuple[Recipe | None, Decision]] = {}

    def options(self, p: Planning, engine: Engine, recipe: Recipe | None) -> tuple[_Option, ...]:
        """What each binding offers this engine and recipe under the decision's revision."""
        return self._kept(
            p.ctx,
            self._options,
            engine.name,
            recipe,
            lambda: gpu_options(p, engine, recipe),
        )

    def plan(
        self,
        ctx: PlanContext,
        option: _Option,
        recipe: Recipe | None,
        sizing: GpuSizing,
        profile: VerifiedProfile,
        choice: PlanChoice | None = None,
    ) -> Decision:
        """The plan for this sizing on this option (and the choice that took it): distinct
        requests that size alike (the same model in another deployment) share it."""
        chosen = None if choice is None else (choice.rule, tuple(choice.passed))
        return self._kept(
            ctx,
            self._plans,
            (option.order, sizing, chosen),
            recipe,
            lambda: planned(_gpu_body(sizing, option, profile, recipe, choice)),
        )

    def _kept(
        self,
        ctx: PlanContext,
        table: dict[Any, tuple[Recipe | None, T]],
        key: Any,
        recipe: Recipe | None,
        make: Callable[[], T],
    ) -> T:
        if ctx.profile is not self._profile or ctx.catalog is not self._catalog:
            self._profile, self._catalog = ctx.profile, ctx.catalog
            self._options.clear()
            self._plans.clear()
        # The recipe is held with what was made for it, so its id cannot be reused meanwhile.
        found = table.get((key, id(recipe)))
        if found is not None and found[0] is recipe:
            return found[1]
        value = make()
        keep(table, (key, id(recipe)), (recipe, value), self.MAX_ENTRIES)
        return value


class GpuSizing(NamedTuple):
    """What a GPU plan holds besides the binding's option it lands on and the revision: the
    request's part of it. With the option and the revision it determines the plan entirely
    (`_gpu_body` reads nothing else), so it is what a kept plan is found by."""

    engine: str
    derived: bool
    devices: int
    request_bytes: int
    quantity: int
    engine_args: tuple[tuple[str, Any], ...]
    isolation: str
    pinned_profile: bool


def _need_per_device(p: Planning, engine: Engine) -> int:
    """The memory one device must hold: the request's own minimum, or the model's estimate."""
    block = p.block
    if block is not None and block.accelerator is not None:
        try:
            return parse_bytes(block.accelerator.memory.minimum)
        except QuantityError as exc:
            raise Refusal(
                422,
                f"invalid deployment request: inferenceResources.accelerator.memory.minimum: {exc}",
                C.REQUEST_INVALID,
            ) from None
    model = p.req.model
    assert model is not None
    context = context_length(p) if "text-generation" in engine.serves else None
    assert engine.working_memory is not None  # the catalog requires it of a GPU engine
    return estimate_gpu(
        engine.working_memory,
        model.weightsBytes,
        context,
        model.layers,
        model.kvHeads,
        model.headDim,
        p.devices,
    ).per_device


def gpu_options(p: Planning, engine: Engine, recipe: Recipe | None) -> tuple[_Option, ...]:
    """Every GPU binding of the profile with what this engine (and recipe) makes of it."""
    profile = p.ctx.profile
    assert profile is not None
    return tuple(
        _Option(
            order,
            prof,
            binding,
            binding.allocation,
            _binding_image(p, engine, prof, binding, recipe),
        )
        for order, (prof, binding) in enumerate(profile.envelope.gpu_bindings())
    )


def plan_gpu(p: Planning, engine: Engine, profile: VerifiedProfile) -> Decision:
    """The GPU path: the need per device, each binding's option, and the best fit among them."""
    need = _need_per_device(p, engine)
    recipe = recipe_of(p, "gpu")
    # A decision made without a server's table keeps its own, for this decision only.
    kept = p.options if p.options is not None else GpuOptions()
    options = kept.options(p, engine, recipe)
    image_reasons: list[str] = []
    count_reasons: list[str] = []
    memory_misses: list[tuple[int, str]] = []
    fits: list[tuple[tuple[int, int, int], _Option, Fit]] = []
    accel = p.block.accelerator if p.block else None
    for option in options:
        order, prof, binding, allocation, chosen = option
        if accel is not None:
            if accel.profile is not None and prof.name != accel.profile:
                continue
            if accel.isolation not in ("any-qualified", allocation.guarantee):
                continue
        if isinstance(chosen, str):
            image_reasons.append(chosen)
            continue
        count_reason = _count_reason(p, binding, allocation)
        if count_reason:
            count_reasons.append(count_reason)
            continue
        fit = allocation.fit(binding, engine.gpu_memory_utilization, p.devices, need)
        if fit is None:
            memory_misses.append((binding.usable_memory_bytes, binding.id))
            continue
        # The smallest usable memory, then the stronger isolation, then envelope order
        # (unique, so no two keys tie).
        fits.append(((binding.usable_memory_bytes, allocation.rank, order), option, fit))
    if not fits:
        raise _no_fit(p, engine, need, image_reasons, count_reasons, memory_misses)
    fits.sort(key=lambda entry: entry[0])
    pinned = accel is not None and (accel.profile is not None or accel.isolation != "any-qualified")
    index, choice = 0, None
    if p.ctx.room is not None and not pinned:
        index, choice = choose(
            p.ctx.room,
            [(o.binding.id, f[1], not o.binding.allocation.room_published) for _, o, f in fits],
        )
    _, best, best_fit = fits[index]
    request_bytes, quantity, args = best_fit
    sizing = GpuSizing(
        engine.name,
        p.derived,
        p.devices,
        request_bytes,
        quantity,
        tuple(args.items()),
        accel.isolation if accel else "any-qualified",
        accel is not None and accel.profile is not None,
    )
    return kept.plan(p.ctx, best, recipe, sizing, profile, choice)


def _binding_image(
    p: Planning,
    engine: Engine,
    prof: Profile,
    binding: GpuBinding,
    recipe: Recipe | None,
) -> tuple[str, str] | str:
    vendor, arch = binding.accelerator.vendor, binding.architecture
    if recipe is not None:
        if binding.runtime.image != recipe.image:
            return (
                f"binding {binding.id} runs {binding.runtime.image}, not the image recipe "
                f"{recipe.id} pins"
            )
        if recipe.variantId not in prof.compatibleVariantIds:
            return f"profile {prof.name} does not list variant {recipe.variantId}"
        return recipe.image, recipe.variantId
    selection = p.ctx.catalog.select_gpu_image(
        engine,
        vendor,
        arch,
        binding.accelerator.capability_tuple,
        binding.accelerator.cudaDriverMajor,
    )
    if selection.image is None:
        assert selection.refusal is not None
        return selection.refusal
    variant = selection.image.variant_id
    if variant not in prof.compatibleVariantIds:
        return f"profile {prof.name} does not list variant {variant}"
    return selection.image.reference, variant


def _count_field(p: Planning) -> str:
    """Where the request said how many devices: what the tenant changes to fit a binding
    of one device."""
    recipe = recipe_of(p, "gpu")
    if recipe is not None and recipe.tensorParallelSize is not None:
        return f"tensorParallelSize in the owner's GPU recipe {recipe.id}"
    block = p.block
    if block is not None and block.accelerator is not None:
        return "inferenceResources.accelerator.count"
    return "config.tensor_parallel_size"


def _count_reason(p: Planning, binding: GpuBinding, allocation: AllocationClass) -> str | None:
    if p.devices == 1:
        return None
    if not allocation.multi_device:
        return (
            f"{p.devices} devices were requested, but {allocation.single_device}: "
            f"binding {binding.id} serves one device (set {_count_field(p)} to 1 for it)"
        )
    if "p2p" not in binding.accelerator.features:
        return (
            f"{p.devices} devices were requested, but binding {binding.id} does not "
            "attest p2p, which tensor parallelism needs"
        )
    return None


def _no_fit(
    p: Planning,
    engine: Engine,
    need: int,
    image_reasons: list[str],
    count_reasons: list[str],
    memory_misses: list[tuple[int, str]],
) -> Refusal:
    if memory_misses:
        largest, binding_id = max(memory_misses)
        reason = (
            f"no binding holds {engine.name} at {format_gib(need)} per device; the largest "
            f"eligible binding, {binding_id}, offers {format_bytes(largest)}: lower "
            "max_model_len or choose a smaller model"
        )
        return unservable(p, reason)
    if count_reasons:
        return unservable(p, count_reasons[0])
    if image_reasons:
        return unservable(p, image_reasons[0])
    accel = p.block.accelerator if p.block else None
    if accel is not None:
        wanted = f"profile {accel.profile!r}" if accel.profile else "the profile"
        return unservable(p, f"no binding in {wanted} offers isolation {accel.isolation}")
    return unservable(p, "the profile declares no GPU binding")  # pragma: no cover


def _gpu_body(
    sizing: GpuSizing,
    option: _Option,
    profile: VerifiedProfile,
    recipe: Recipe | None,
    choice: PlanChoice | None = None,
) -> dict[str, Any]:
    """The GPU plan's body, from exactly what `GpuSizing` says it depends on."""
    binding = option.binding
    assert not isinstance(option.chosen, str)
    image, variant = option.chosen
    quantity = str(sizing.quantity)
    claimed = as_claimed(binding)
    counted = as_counted(binding)
    if claimed is not None:
        # The devices come through the claim; the container's resources name none.
        granted: dict[str, str] = {}
        spill = sizing.isolation == "any-qualified" and not sizing.pinned_profile
        claim = template_for(profile.envelope, claimed, sizing.devices, spill).plan_claim()
    else:
        assert counted is not None
        granted = {counted.resource.name: quantity}
        claim = None
    body: dict[str, Any] = {
        "status": 200,
        "path": "gpu",
        "derived": sizing.derived,
        "profile": option.profile.name,
        "bindingId": binding.id,
        "engine": sizing.engine,
        "variantId": variant,
        "image": image,
        "runtimeClassName": binding.runtimeClassName,
        "nodeSelector": {ARCH_KEY: binding.architecture},
        "resources": {"requests": granted, "limits": dict(granted)},
        "deviceCount": sizing.devices,
        "engineArgs": dict(sizing.engine_args),
        "inferenceResources": {
            "schemaVersion": 1,
            "accelerator": {
                "capability": "gpu",
                "count": sizing.devices,
                "memory": {"minimum": format_gib(sizing.request_bytes)},
                "isolation": sizing.isolation,
                "profile": option.profile.name,
            },
            "runtime": {"selection": "automatic"},
        },
        "bundle": bundle_of(profile),
    }
    if recipe is not None:
        body["recipe"] = recipe.id
    if claim is not None:
        body["claim"] = claim
    if choice is not None:
        body["choice"] = choice.model_dump(mode="json")
    return body


def planned(body: dict[str, Any]) -> Decision:
    # Every plan goes through the one model, so a body the planner builds wrongly is caught
    # here rather than by the extender or the controller in a cluster.
    return Decision.planned(Plan.from_planner(body))


def bundle_of(profile: VerifiedProfile) -> dict[str, Any]:
    return {"version": profile.version, "sha256": profile.sha256}
