"""The planner: a deployment request in, a plan or the seed's exact refusal out.

This is the single decision procedure behind `POST /mutate`, `POST /v1/plan`, `tmi plan`, the
extender's view of a Pod and the controller's re-check of a grant. It never raises for bad
input: every outcome, including a malformed request, is a `Decision` with an HTTP status, so each
edge maps decisions to its own wire format in one place.

Its parts, one job each: what a decision is (`decision`), the request rules (`request_rules`),
the GPU path and its binding choice (`gpu_plan`); this module is the entry, the external and
tenant-mode-off answers, the profile's authority, and the CPU path.
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
from inference_policy.planning.gpu_plan import GpuOptions, GpuPath, bundle_of, planned
from inference_policy.planning.recipe_inputs import unavailable
from inference_policy.planning.request import RequestError, parse_request
from inference_policy.planning.request_rules import (
    DERIVE_PREFIX,
    NO_GPU,
    PROFILE_PREFIX,
    RequestRules,
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
        decision = _Planner(request, ctx, options).plan()
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


class _Planner(RequestRules, GpuPath):
    """One request's decision: the rules, then the CPU or the GPU path."""

    def plan(self) -> Decision:
        req = self.req
        if req.external:
            return self._external()
        if not self.ctx.enabled:
            return self._disabled()
        if self.ctx.catalog_refusal:
            raise Refusal(503, self.ctx.catalog_refusal, C.IMAGE_MAP)
        engine = self.ctx.catalog.qualified(req.engine)
        if engine is None:
            reason = f"engine '{req.engine}' is not qualified in this release"
            raise Refusal(
                422, DERIVE_PREFIX + reason if self.derived else reason, C.ENGINE_NOT_QUALIFIED
            )
        self._validate(engine)
        profile = self._profile()
        if self._wants_cpu(engine, profile):
            return self._cpu(engine, profile)
        return self._gpu(engine, profile)

    def _external(self) -> Decision:
        req = self.req
        if self.ctx.enabled:
            if self.block is not None:
                raise Refusal(422, EXTERNAL_BLOCK, C.EXTERNAL)
            if req.gpu_allocation or req.vram_allocation:
                raise Refusal(422, EXTERNAL_ALLOCATION, C.EXTERNAL)
        return planned(
            {"status": 200, "path": "external", "derived": self.derived, "engine": req.engine}
        )

    def _disabled(self) -> Decision:
        engine = self.ctx.catalog.engines.get(self.req.engine)
        wants_cpu = self.req.config.force_cpu or (self.block is not None and self.block.cpu)
        if engine is None or not engine.cpu_capable:
            raise Refusal(422, NO_GPU, C.TENANT_MODE_OFF)
        if not (wants_cpu or not engine.gpu_capable):
            raise Refusal(422, NO_GPU, C.TENANT_MODE_OFF)
        self._validate(engine)
        arch = self.block.cpu.architecture if self.block and self.block.cpu else "amd64"
        image = self.ctx.catalog.cpu_image(engine, arch)
        if image is None:
            raise Refusal(422, f"no {engine.name} image is published for cpu/{arch}", C.NO_FIT)
        requests = self._cpu_requests(engine)
        return planned(
            self._cpu_body(engine, None, None, image.reference, image.variant_id, arch, requests)
        )

    def _profile(self) -> VerifiedProfile:
        ctx = self.ctx
        usable = usable_profile(ctx.profile, ctx.profile_refusal, ctx.now)
        if isinstance(usable, str):
            raise Refusal(503, PROFILE_PREFIX + usable, C.PROFILE_REFUSED)
        return usable

    # -- CPU path -------------------------------------------------------------------------------

    def _cpu_requests(self, engine: Engine) -> dict[str, str]:
        floor = engine.cpu_floor
        assert floor is not None
        model = self.req.model
        assert model is not None
        floor_mc, floor_mem = parse_millicores(floor.cpu), parse_bytes(floor.memory)
        memory = cpu_memory_bytes(model.weightsBytes, floor_mem)
        if self.block is not None and self.block.cpu is not None:
            asked = self.block.cpu.requests
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

    def _cpu(self, engine: Engine, profile: VerifiedProfile) -> Decision:
        if not engine.cpu_capable:  # pragma: no cover - _wants_cpu refuses first
            raise Refusal(422, f"{engine.name} runs on GPU only", C.ENGINE_CAPABILITY)
        wanted_arch = self.block.cpu.architecture if self.block and self.block.cpu else None
        recipe = self._recipe("cpu")
        requests = self._cpu_requests(engine)
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
                img = self.ctx.catalog.cpu_image(engine, binding.architecture)
                if img is None:
                    reasons.append(
                        f"no {engine.name} image is published for cpu/{binding.architecture}"
                    )
                    continue
                image, variant = img.reference, img.variant_id
            body = self._cpu_body(
                engine, prof, binding, image, variant, binding.architecture, requests
            )
            body["bundle"] = bundle_of(profile)
            if recipe is not None:
                body["recipe"] = recipe.id
            return planned(body)
        if reasons:
            raise self._unservable(reasons[0])
        where = f" for {wanted_arch}" if wanted_arch else ""
        raise self._unservable(f"the profile declares no cpu binding{where}")

    def _cpu_body(
        self,
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
            "derived": self.derived,
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
