"""The planner: a deployment request in, a plan or the seed's exact refusal out.

This is the single decision procedure behind `POST /mutate`, `POST /v1/plan`, `tmi plan`, the
extender's view of a Pod and the controller's re-check of a grant. It never raises for bad
input: every outcome, including a malformed request, is a `Decision` with an HTTP status, so each
edge maps decisions to its own wire format in one place.

Its parts, one job each: what a decision is (`decision`), the request rules (`request_rules`),
the GPU path and its binding choice (`gpu_plan`); this module is the entry, the external and
tenant-mode-off answers, the profile's authority, and the CPU path. Each is functions over one
frozen value, `request_rules.Planning`: the request, its context and what follows from them.
"""

from __future__ import annotations

from typing import Any

from inference_policy.base.codes import WIRE_NO_FIT
from inference_policy.base.codes import RefusalCode as C
from inference_policy.base.quantity import (
    QuantityError,
    format_bytes,
    format_millicores,
    parse_bytes,
    parse_millicores,
)
from inference_policy.planning.catalog import Engine, cc_text
from inference_policy.planning.decision import Decision, PlanContext, Refusal
from inference_policy.planning.gpu_plan import GpuOptions, bundle_of, plan_gpu, planned
from inference_policy.planning.recipe_inputs import unavailable
from inference_policy.planning.request import RequestError, parse_request
from inference_policy.planning.request_rules import (
    DERIVE_PREFIX,
    NO_GPU,
    PROFILE_PREFIX,
    Planning,
    recipe_of,
    unservable,
    validate,
    wants_cpu,
)
from inference_policy.planning.sizing import cpu_memory_bytes
from inference_policy.trust.profile import ARCH_KEY, CpuBinding, Profile
from inference_policy.trust.signing import VerifiedProfile, usable_profile

EXTERNAL_BLOCK = "external endpoints allocate no local resources; omit inferenceResources"
EXTERNAL_ALLOCATION = (
    "external endpoints allocate no local resources; omit gpu_allocation and vram_allocation"
)


def decide(document: Any, ctx: PlanContext, options: GpuOptions | None = None) -> Decision:
    """Plan one request (an already strictly-decoded JSON value). `options` is where a server
    keeps the per-revision part of GPU decisions between them (`GpuOptions`; it changes no
    decision); None works it out for this decision alone."""
    try:
        request = parse_request(document)
        decision = _plan(Planning.of(request, ctx, options))
    except RequestError as exc:
        decision = Refusal(422, str(exc), C.REQUEST_INVALID).decision()
    except Refusal as refusal:
        decision = refusal.decision()
    if ctx.enabled and (decision.plan is None or decision.plan.local):
        # A configured catalog that cannot be used outranks every other answer but an external
        # plan: without it no local plan, and no refusal of one, is what the owner pinned.
        missing = unavailable(ctx.gpu_recipes, ctx.cpu_recipes)
        if missing:
            return Refusal(503, missing[0].refusal, C.CATALOG_UNAVAILABLE).decision()
    return decision


def _plan(p: Planning) -> Decision:
    """One request's decision: the rules, then the CPU or the GPU path."""
    req = p.req
    if req.external:
        return _external(p)
    if not p.ctx.enabled:
        return _disabled(p)
    if p.ctx.catalog_refusal:
        raise Refusal(503, p.ctx.catalog_refusal, C.IMAGE_MAP)
    engine = p.ctx.catalog.qualified(req.engine)
    if engine is None:
        reason = f"engine '{req.engine}' is not qualified in this release"
        raise Refusal(422, DERIVE_PREFIX + reason if p.derived else reason, C.ENGINE_NOT_QUALIFIED)
    # Made anew rather than `_replace`d: this is on every decision, and `_replace` is slower.
    p = Planning(p.req, p.ctx, p.options, p.block, p.derived, validate(p, engine))
    profile = _profile(p)
    if wants_cpu(p, engine, profile):
        return _cpu(p, engine, profile)
    return plan_gpu(p, engine, profile)


def _external(p: Planning) -> Decision:
    req = p.req
    if p.ctx.enabled:
        if p.block is not None:
            raise Refusal(422, EXTERNAL_BLOCK, C.EXTERNAL)
        if req.gpu_allocation or req.vram_allocation:
            raise Refusal(422, EXTERNAL_ALLOCATION, C.EXTERNAL)
    return planned({"status": 200, "path": "external", "derived": p.derived, "engine": req.engine})


def _disabled(p: Planning) -> Decision:
    engine = p.ctx.catalog.engines.get(p.req.engine)
    asks_cpu = p.req.config.force_cpu or (p.block is not None and p.block.cpu)
    if engine is None or not engine.cpu_capable:
        raise Refusal(422, NO_GPU, C.TENANT_MODE_OFF)
    if not (asks_cpu or not engine.gpu_capable):
        raise Refusal(422, NO_GPU, C.TENANT_MODE_OFF)
    validate(p, engine)
    arch = p.block.cpu.architecture if p.block and p.block.cpu else "amd64"
    image = p.ctx.catalog.cpu_image(engine, arch)
    if image is None:
        raise Refusal(422, f"no {engine.name} image is published for cpu/{arch}", C.NO_FIT)
    requests = _cpu_requests(p, engine)
    return planned(
        _cpu_body(p, engine, None, None, image.reference, image.variant_id, arch, requests)
    )


def _profile(p: Planning) -> VerifiedProfile:
    ctx = p.ctx
    usable = usable_profile(ctx.profile, ctx.profile_refusal, ctx.now)
    if isinstance(usable, str):
        raise Refusal(503, PROFILE_PREFIX + usable, C.PROFILE_REFUSED)
    return usable


# -- CPU path -------------------------------------------------------------------------------


def _cpu_requests(p: Planning, engine: Engine) -> dict[str, str]:
    floor = engine.cpu_floor
    assert floor is not None
    model = p.req.model
    assert model is not None
    floor_mc, floor_mem = parse_millicores(floor.cpu), parse_bytes(floor.memory)
    memory = cpu_memory_bytes(model.weightsBytes, floor_mem)
    if p.block is not None and p.block.cpu is not None:
        asked = p.block.cpu.requests
        try:
            asked_mc, asked_mem = parse_millicores(asked.cpu), parse_bytes(asked.memory)
        except QuantityError as exc:
            raise Refusal(
                422,
                f"invalid deployment request: inferenceResources.cpu.requests: {exc}",
                C.REQUEST_INVALID,
            ) from None
        if asked_mc < floor_mc:
            raise Refusal(
                422,
                f"cpu request {asked.cpu} is below {engine.name}'s floor {floor.cpu}",
                C.CPU_REQUEST,
            )
        if asked_mem < memory:
            raise Refusal(
                422,
                f"memory request {asked.memory} is below what {engine.name} needs for "
                f"these weights ({format_bytes(memory)})",
                C.NO_FIT,
                WIRE_NO_FIT,
            )
        return {"cpu": asked.cpu, "memory": asked.memory}
    return {"cpu": format_millicores(floor_mc), "memory": format_bytes(memory)}


def _cpu(p: Planning, engine: Engine, profile: VerifiedProfile) -> Decision:
    if not engine.cpu_capable:  # pragma: no cover - _wants_cpu refuses first
        raise Refusal(422, f"{engine.name} runs on GPU only", C.ENGINE_CAPABILITY)
    wanted_arch = p.block.cpu.architecture if p.block and p.block.cpu else None
    recipe = recipe_of(p, "cpu")
    requests = _cpu_requests(p, engine)
    reasons: list[str] = []
    for prof, binding in profile.envelope.cpu_bindings():
        if wanted_arch and binding.architecture != wanted_arch:
            continue
        if recipe is not None:
            if binding.runtime.image != recipe.image:
                reasons.append(
                    f"binding {binding.id} runs {binding.runtime.image}, not the image "
                    f"recipe {recipe.id} pins"
                )
                continue
            image, variant = recipe.image, recipe.variantId
        else:
            img = p.ctx.catalog.cpu_image(engine, binding.architecture)
            if img is None:
                reasons.append(
                    f"no {engine.name} image is published for cpu/{binding.architecture}"
                )
                continue
            image, variant = img.reference, img.variant_id
        body = _cpu_body(p, engine, prof, binding, image, variant, binding.architecture, requests)
        body["bundle"] = bundle_of(profile)
        if recipe is not None:
            body["recipe"] = recipe.id
        return planned(body)
    if reasons:
        raise unservable(p, reasons[0])
    where = f" for {wanted_arch}" if wanted_arch else ""
    raise unservable(p, f"the profile declares no cpu binding{where}")


def _cpu_body(
    p: Planning,
    engine: Engine,
    profile: Profile | None,
    binding: CpuBinding | None,
    image: str,
    variant: str,
    arch: str,
    requests: dict[str, str],
) -> dict[str, Any]:
    return {
        "status": 200,
        "path": "cpu",
        "derived": p.derived,
        "profile": profile.name if profile else None,
        "bindingId": binding.id if binding else None,
        "engine": engine.name,
        "variantId": variant,
        "image": image,
        "runtimeClassName": None,
        "nodeSelector": {ARCH_KEY: arch},
        "resources": {"requests": dict(requests)},
        "deviceCount": 0,
        "engineArgs": {},
        "inferenceResources": {
            "schemaVersion": 1,
            "cpu": {"architecture": arch, "requests": dict(requests)},
            "runtime": {"selection": "automatic"},
        },
        "bundle": None,
    }


__all__ = [
    "DERIVE_PREFIX",
    "NO_GPU",
    "PROFILE_PREFIX",
    "Decision",
    "GpuOptions",
    "PlanContext",
    "Refusal",
    "cc_text",
    "decide",
]
