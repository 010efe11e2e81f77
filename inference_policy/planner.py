"""The planner: a deployment request in, a plan or the seed's exact refusal out.

This is the single decision procedure behind `POST /mutate`, `POST /v1/plan`, `tmi plan`, the
extender's view of a Pod and the controller's re-check of a grant. It never raises for bad
input: every outcome, including a malformed request, is a `Decision` with an HTTP status, so each
edge maps decisions to its own wire format in one place.

Binding choice is deterministic. Among the bindings that can run the engine's image and hold the
request, the smallest usable memory wins; ties go to the stronger isolation (MIG, then whole
device, then accounted share), then to the order of the envelope.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from inference_policy.allocation import WHOLE_DEVICE, AllocationClass
from inference_policy.bounded import keep
from inference_policy.catalog import Engine, EngineCatalog, cc_text
from inference_policy.plan import Plan
from inference_policy.profile import (
    ARCH_KEY,
    CpuBinding,
    ExtendedResourceBinding,
    Profile,
    VramPluginBinding,
)
from inference_policy.quantity import (
    GI,
    QuantityError,
    ceil_div,
    format_bytes,
    format_gib,
    format_millicores,
    gib_ceil,
    parse_bytes,
    parse_millicores,
)
from inference_policy.recipes import Recipe, RecipeCatalog
from inference_policy.refusals import WIRE_NO_FIT, RefusalCode
from inference_policy.refusals import RefusalCode as C
from inference_policy.request import DeploymentRequest, RequestError, parse_request
from inference_policy.signing import ProfileRefused, VerifiedProfile
from inference_policy.sizing import cpu_memory_bytes, estimate_gpu

DERIVE_PREFIX = "cannot derive inference resources for this deployment: "
NO_GPU = "Core cannot see a GPU on this install"
PROFILE_PREFIX = "owner profile bundle: "
EXTERNAL_BLOCK = "external endpoints allocate no local resources; omit inferenceResources"
EXTERNAL_ALLOCATION = (
    "external endpoints allocate no local resources; omit gpu_allocation and vram_allocation"
)
GB10 = (12, 1)
T = TypeVar("T")
MAX_DEVICES = 8


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
        if self.wire_code:
            body["code"] = self.wire_code
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
    gpu_recipes: RecipeCatalog | None = None
    cpu_recipes: RecipeCatalog | None = None
    options: GpuOptions | None = None
    """Where the per-revision part of a GPU decision is kept between decisions (a server's
    state holds one); None works it out for each decision."""


class _Option(NamedTuple):
    """One GPU binding as a decision for an engine sees it, whatever the request: its place in
    the envelope, isolation, and image (or why the engine's image cannot run there)."""

    order: int
    profile: Profile
    binding: ExtendedResourceBinding | VramPluginBinding
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

    def options(
        self, planner: _Planner, engine: Engine, recipe: Recipe | None
    ) -> tuple[_Option, ...]:
        """What each binding offers this engine and recipe under the planner's revision."""
        return self._kept(
            planner.ctx,
            self._options,
            engine.name,
            recipe,
            lambda: planner.gpu_options(engine, recipe),
        )

    def plan(
        self,
        ctx: PlanContext,
        option: _Option,
        recipe: Recipe | None,
        sizing: GpuSizing,
        profile: VerifiedProfile,
    ) -> Decision:
        """The plan for this sizing on this option: distinct requests that size alike (the same
        model in another deployment) share it."""
        return self._kept(
            ctx,
            self._plans,
            (option.order, sizing),
            recipe,
            lambda: _planned(_gpu_body(sizing, option, profile, recipe)),
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


def decide(document: Any, ctx: PlanContext) -> Decision:
    """Plan one request (an already strictly-decoded JSON value)."""
    try:
        request = parse_request(document)
        return _Planner(request, ctx).plan()
    except RequestError as exc:
        return Refusal(422, str(exc), C.REQUEST_INVALID).decision()
    except Refusal as refusal:
        return refusal.decision()


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


class _Planner:
    def __init__(self, request: DeploymentRequest, ctx: PlanContext) -> None:
        self.req = request
        self.ctx = ctx
        self.block = request.inferenceResources
        self.derived = self.block is None

    # -- refusals -----------------------------------------------------------------------------

    def _unservable(self, reason: str) -> Refusal:
        """Card, driver or catalog rule out the request: the seed's derived/NoFit split."""
        if self.derived:
            return Refusal(422, DERIVE_PREFIX + reason, C.NO_FIT)
        return Refusal(422, reason, C.NO_FIT, WIRE_NO_FIT)

    # -- entry ----------------------------------------------------------------------------------

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
        return _planned(
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
        return _planned(
            self._cpu_body(engine, None, None, image.reference, image.variant_id, arch, requests)
        )

    def _profile(self) -> VerifiedProfile:
        ctx = self.ctx
        if ctx.profile_refusal is not None or ctx.profile is None:
            refusal = ctx.profile_refusal
            message = (
                refusal.authorization_message
                if refusal
                else (
                    "invalid inference profile authorization: "
                    "bundle did not arrive from the configured ConfigMap"
                )
            )
            raise Refusal(503, PROFILE_PREFIX + message, C.PROFILE_REFUSED)
        try:
            ctx.profile.check_window(ctx.now)
        except ProfileRefused as refusal:
            raise Refusal(
                503, PROFILE_PREFIX + refusal.authorization_message, C.PROFILE_REFUSED
            ) from None
        return ctx.profile

    # -- request rules ----------------------------------------------------------------------------

    def _validate(self, engine: Engine) -> None:
        req = self.req
        model = req.model
        if model is None:
            raise Refusal(
                422,
                "invalid deployment request: model is required for a local deployment",
                C.REQUEST_INVALID,
            )
        config = req.config
        refused = engine.format_refused(model.format)
        if refused is not None:
            raise Refusal(422, refused, C.MODEL_FORMAT)
        self._validate_config(engine)
        if config.embedding:
            if "embeddings" not in engine.serves:
                raise Refusal(
                    422,
                    f"{engine.name} does not serve embeddings; set config.embedding to false "
                    "or deploy with llamacpp",
                    C.ENGINE_CAPABILITY,
                )
            if not config.pooling:
                raise Refusal(
                    422,
                    "an embedding configuration must state its pooling: set config.pooling "
                    "(for example mean, cls or last)",
                    C.CONFIG_MISSING,
                )
        if "text-generation" in engine.serves and self._context() is None:
            raise Refusal(
                422,
                "no context length is declared: set config.max_model_len or the model's "
                "contextLength",
                C.CONFIG_MISSING,
            )
        self.devices = self._device_count(engine)

    def _validate_config(self, engine: Engine) -> None:
        """The configuration keys tenant mode refuses for this engine (its catalog entry), and
        the spans an engine of one device per replica cannot serve."""
        model, config = self.req.model, self.req.config
        assert model is not None
        for key in engine.unsupported_config:
            value = getattr(config, key)
            if value not in (None, False, "", [], {}):
                raise Refusal(
                    422,
                    f"{engine.name} in tenant mode does not support {key}; remove {key} from "
                    "the model configuration",
                    C.CONFIG_UNSUPPORTED,
                )
        if engine.max_devices != 1:
            return
        for key in ("tensor_parallel_size", "gpu_count"):
            value = getattr(config, key)
            if _number(value) is not None and _number(value) > 1:  # type: ignore[operator]
                raise Refusal(
                    422,
                    f"{engine.name} serves one device per replica; set {key} to 1",
                    C.CONFIG_UNSUPPORTED,
                )
        lowered = model.name.lower()
        if "dfloat11" in lowered or "df11" in lowered:
            raise Refusal(
                422,
                "DFloat11 models need more than one device; "
                f"{engine.name} serves one device per replica in tenant mode",
                C.CONFIG_UNSUPPORTED,
            )

    def _context(self) -> int | None:
        model = self.req.model
        return self.req.config.max_model_len or (model.contextLength if model else None)

    def _device_count(self, engine: Engine) -> int:
        config_value = self.req.config.tensor_parallel_size
        block = self.block
        recipe = self._recipe("gpu")
        if recipe is not None and recipe.tensorParallelSize is not None:
            return recipe.tensorParallelSize
        if block is not None and block.accelerator is not None:
            count = _whole_count(block.accelerator.count, "inferenceResources.accelerator.count")
            if config_value is not None:
                configured = _whole_count(config_value, "config.tensor_parallel_size")
                if configured != count:
                    raise Refusal(
                        422,
                        f"inferenceResources.accelerator.count {count} and "
                        f"config.tensor_parallel_size {configured} disagree; the request and "
                        "the Pod must agree",
                        C.DEVICE_COUNT,
                    )
        elif config_value is None:
            count = 1
        else:
            count = _whole_count(config_value, "config.tensor_parallel_size")
        if engine.gpu_capable and count > max(engine.max_devices, 1):
            raise Refusal(
                422,
                f"{engine.name} serves at most {engine.max_devices} device per replica; "
                f"set the device count to {engine.max_devices}",
                C.ENGINE_CAPABILITY,
            )
        return count

    def _recipe(self, capability: str) -> Recipe | None:
        catalog = self.ctx.gpu_recipes if capability == "gpu" else self.ctx.cpu_recipes
        model = self.req.model
        if catalog is None or model is None:
            return None
        return catalog.find(self.req.engine, model.name, self.req.config.model_dump())

    def _wants_cpu(self, engine: Engine, profile: VerifiedProfile) -> bool:
        block, config = self.block, self.req.config
        has_gpu = bool(profile.envelope.gpu_bindings())
        if block is not None and block.accelerator is not None:
            if not engine.gpu_capable:
                raise Refusal(
                    422,
                    f"{engine.name} runs on CPU only; request cpu instead of an accelerator",
                    C.ENGINE_CAPABILITY,
                )
            return False
        reasons = []
        if block is not None and block.cpu is not None:
            reasons.append("the request asks for cpu")
        if config.force_cpu:
            reasons.append("config.force_cpu is set")
        if not engine.gpu_capable:
            return True
        if not reasons and not has_gpu:
            reasons.append("the profile declares no GPU binding")
        if not reasons:
            return False
        if not engine.cpu_capable:
            detail = f"{engine.name} runs on GPU only and {reasons[0]}"
            if reasons[0].startswith("the profile"):
                raise self._unservable(detail)
            raise Refusal(422, detail, C.ENGINE_CAPABILITY)
        if self.devices > 1:
            raise Refusal(
                422,
                f"CPU serving runs one process; {self.devices} devices were requested "
                "(set config.tensor_parallel_size to 1)",
                C.ENGINE_CAPABILITY,
            )
        return True

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
            body["bundle"] = _bundle(profile)
            if recipe is not None:
                body["recipe"] = recipe.id
            return _planned(body)
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

    # -- GPU path -------------------------------------------------------------------------------

    def _need_per_device(self, engine: Engine) -> int:
        block = self.block
        if block is not None and block.accelerator is not None:
            try:
                return parse_bytes(block.accelerator.memory.minimum)
            except QuantityError as exc:
                raise Refusal(
                    422,
                    f"invalid deployment request: inferenceResources.accelerator.memory."
                    f"minimum: {exc}",
                    C.REQUEST_INVALID,
                ) from None
        model = self.req.model
        assert model is not None
        context = self._context() if "text-generation" in engine.serves else None
        assert engine.working_memory is not None  # the catalog requires it of a GPU engine
        return estimate_gpu(
            engine.working_memory,
            model.weightsBytes,
            context,
            model.layers,
            model.kvHeads,
            model.headDim,
            self.devices,
        ).per_device

    def gpu_options(self, engine: Engine, recipe: Recipe | None) -> tuple[_Option, ...]:
        """Every GPU binding of the profile with what this engine (and recipe) makes of it."""
        profile = self.ctx.profile
        assert profile is not None
        return tuple(
            _Option(
                order,
                prof,
                binding,
                binding.allocation,
                self._binding_image(engine, prof, binding, recipe),
            )
            for order, (prof, binding) in enumerate(profile.envelope.gpu_bindings())
        )

    def _gpu(self, engine: Engine, profile: VerifiedProfile) -> Decision:
        need = self._need_per_device(engine)
        recipe = self._recipe("gpu")
        # A decision made without a server's table keeps its own, for this decision only.
        kept = self.ctx.options if self.ctx.options is not None else GpuOptions()
        options = kept.options(self, engine, recipe)
        image_reasons: list[str] = []
        count_reasons: list[str] = []
        memory_misses: list[tuple[int, str]] = []
        best: _Option | None = None
        best_fit: tuple[int, int, dict[str, Any]] | None = None
        best_key: tuple[int, int, int] | None = None
        accel = self.block.accelerator if self.block else None
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
            count_reason = self._count_reason(binding, allocation)
            if count_reason:
                count_reasons.append(count_reason)
                continue
            fit = self._fit(engine, binding, allocation, need)
            if fit is None:
                memory_misses.append((binding.usable_memory_bytes, binding.id))
                continue
            # The smallest usable memory, then the stronger isolation, then envelope order
            # (unique, so no two keys tie).
            key = (binding.usable_memory_bytes, allocation.rank, order)
            if best_key is None or key < best_key:
                best_key, best, best_fit = key, option, fit
        if best is None or best_fit is None:
            raise self._no_fit(engine, need, image_reasons, count_reasons, memory_misses)
        request_bytes, quantity, args = best_fit
        sizing = GpuSizing(
            engine.name,
            self.derived,
            self.devices,
            request_bytes,
            quantity,
            tuple(args.items()),
            accel.isolation if accel else "any-qualified",
        )
        return kept.plan(self.ctx, best, recipe, sizing, profile)

    def _binding_image(
        self,
        engine: Engine,
        prof: Profile,
        binding: ExtendedResourceBinding | VramPluginBinding,
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
        selection = self.ctx.catalog.select_gpu_image(
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

    def _count_reason(
        self, binding: ExtendedResourceBinding | VramPluginBinding, allocation: AllocationClass
    ) -> str | None:
        if self.devices == 1:
            return None
        if not allocation.multi_device:
            return (
                f"{self.devices} devices were requested, but {allocation.single_device}: "
                f"binding {binding.id} serves one device"
            )
        if "p2p" not in binding.accelerator.features:
            return (
                f"{self.devices} devices were requested, but binding {binding.id} does not "
                "attest p2p, which tensor parallelism needs"
            )
        return None

    def _fit(
        self,
        engine: Engine,
        binding: ExtendedResourceBinding | VramPluginBinding,
        allocation: AllocationClass,
        need: int,
    ) -> tuple[int, int, dict[str, Any]] | None:
        usable = binding.usable_memory_bytes
        fraction = engine.gpu_memory_utilization
        args: dict[str, Any] = {}
        if allocation.shared_memory:
            # The engine budgets `fraction` of what it is granted, so the share is sized so that
            # its budget holds the need; the share is counted in whole GiB of the plugin's bucket.
            share_gib = gib_ceil(math.ceil(need / fraction) if fraction else need)
            if share_gib * GI > usable:
                return None
            if fraction:
                args["gpu_memory_utilization"] = _ceil_hundredth(fraction * share_gib * GI / usable)
            return share_gib * GI, share_gib, args
        request = gib_ceil(need) * GI
        if fraction:
            if binding.accelerator.capability_tuple == GB10 and allocation is WHOLE_DEVICE:
                # GB10 memory is the host's: budget exactly the request against usableMemory.
                if request > usable:
                    return None
                args["gpu_memory_utilization"] = _ceil_hundredth(request / usable)
            else:
                if need > usable * fraction:
                    return None
                args["gpu_memory_utilization"] = fraction
            if self.devices > 1:
                args["tensor_parallel_size"] = self.devices
        elif need > usable:
            return None
        return request, self.devices * binding.resource.quantity, args

    def _no_fit(
        self,
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
            return self._unservable(reason)
        if count_reasons:
            return self._unservable(count_reasons[0])
        if image_reasons:
            return self._unservable(image_reasons[0])
        accel = self.block.accelerator if self.block else None
        if accel is not None:
            wanted = f"profile {accel.profile!r}" if accel.profile else "the profile"
            return self._unservable(f"no binding in {wanted} offers isolation {accel.isolation}")
        return self._unservable("the profile declares no GPU binding")  # pragma: no cover


def _gpu_body(
    sizing: GpuSizing, option: _Option, profile: VerifiedProfile, recipe: Recipe | None
) -> dict[str, Any]:
    """The GPU plan's body, from exactly what `GpuSizing` says it depends on."""
    binding = option.binding
    assert not isinstance(option.chosen, str)
    image, variant = option.chosen
    quantity = str(sizing.quantity)
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
        "resources": {
            "requests": {binding.resource.name: quantity},
            "limits": {binding.resource.name: quantity},
        },
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
        "bundle": _bundle(profile),
    }
    if recipe is not None:
        body["recipe"] = recipe.id
    return body


def _planned(body: dict[str, Any]) -> Decision:
    # Every plan goes through the one model, so a body the planner builds wrongly is caught
    # here rather than by the extender or the controller in a cluster.
    return Decision.planned(Plan.from_planner(body))


def _bundle(profile: VerifiedProfile) -> dict[str, Any]:
    return {"version": profile.version, "sha256": profile.sha256}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _whole_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
        raise Refusal(
            422,
            f"{where} must be a whole number of devices from 1 to {MAX_DEVICES}; got {value!r}",
            C.DEVICE_COUNT,
        )
    return value


def _ceil_hundredth(value: float) -> float:
    # Round in integer hundredths so 0.23 does not become 0.24 through float noise.
    scaled = round(value * 100, 9)
    return ceil_div(math.ceil(scaled * 1000), 1000) / 100 if scaled != int(scaled) else scaled / 100


__all__ = [
    "NO_GPU",
    "Decision",
    "GpuOptions",
    "PlanContext",
    "Refusal",
    "cc_text",
    "decide",
]
