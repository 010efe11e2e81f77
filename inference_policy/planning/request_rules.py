"""The request rules every planned deployment passes before a binding is chosen.

What the engine's catalog entry allows (model format, refused configuration keys, one device per
replica), the context length a text engine needs, the device count the request and its recipe
agree on, and whether the request is for CPU: each refused with the seed's text and its code.
`Planning` is the one value the rules and both paths read: the request and its context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from inference_policy.base.codes import WIRE_NO_FIT
from inference_policy.base.codes import RefusalCode as C
from inference_policy.planning.catalog import Engine
from inference_policy.planning.decision import PlanContext, Refusal
from inference_policy.planning.recipes import Recipe, RecipeCatalog
from inference_policy.planning.request import DeploymentRequest, InferenceResources
from inference_policy.trust.signing import VerifiedProfile

if TYPE_CHECKING:
    from inference_policy.planning.gpu_plan import GpuOptions

DERIVE_PREFIX = "cannot derive inference resources for this deployment: "
NO_GPU = "Core cannot see a GPU on this install"
PROFILE_PREFIX = "owner profile bundle: "
MAX_DEVICES = 8


class Planning(NamedTuple):
    """One request's decision as the rules and both paths read it: the request, its context,
    where GPU options are kept between decisions, and what follows from the request.

    A named tuple, like `PlanContext`, so it is frozen and cheap to make once per decision; the
    planner makes it again with `devices` once the rules have agreed on the device count."""

    req: DeploymentRequest
    ctx: PlanContext
    # Where the per-revision part of a GPU decision is kept between decisions; None: this
    # decision works it out for itself.
    options: GpuOptions | None
    block: InferenceResources | None
    # The request names no inferenceResources: they are derived, and refusals say so.
    derived: bool
    # The device count the request and its recipe agree on (`validate`); 0 before.
    devices: int = 0

    @classmethod
    def of(
        cls, request: DeploymentRequest, ctx: PlanContext, options: GpuOptions | None = None
    ) -> Planning:
        block = request.inferenceResources
        return cls(request, ctx, options, block, block is None)


def unservable(p: Planning, reason: str) -> Refusal:
    """Card, driver or catalog rule out the request: the seed's derived/NoFit split."""
    if p.derived:
        return Refusal(422, DERIVE_PREFIX + reason, C.NO_FIT)
    return Refusal(422, reason, C.NO_FIT, WIRE_NO_FIT)


def recipe_of(p: Planning, capability: str) -> Recipe | None:
    """The owner's recipe for the request on `capability` ("gpu" or "cpu"), if one matches."""
    catalog = p.ctx.gpu_recipes if capability == "gpu" else p.ctx.cpu_recipes
    model = p.req.model
    if not isinstance(catalog, RecipeCatalog) or model is None:
        return None
    return catalog.find(p.req.engine, model.name, p.req.config.model_dump())


def context_length(p: Planning) -> int | None:
    """The context length the request declares: its configuration's, else the model's."""
    model = p.req.model
    return p.req.config.max_model_len or (model.contextLength if model else None)


def validate(p: Planning, engine: Engine) -> int:
    """The request rules, in the order the seed's refusals are reported; the device count the
    request and its recipe agree on."""
    req = p.req
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
    _validate_config(p, engine)
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
    if "text-generation" in engine.serves and context_length(p) is None:
        raise Refusal(
            422,
            "no context length is declared: set config.max_model_len or the model's contextLength",
            C.CONFIG_MISSING,
        )
    return _device_count(p, engine)


def _validate_config(p: Planning, engine: Engine) -> None:
    """The configuration keys tenant mode refuses for this engine (its catalog entry), and
    the spans an engine of one device per replica cannot serve."""
    model, config = p.req.model, p.req.config
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


def _device_count(p: Planning, engine: Engine) -> int:
    config_value = p.req.config.tensor_parallel_size
    block = p.block
    recipe = recipe_of(p, "gpu")
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


def wants_cpu(p: Planning, engine: Engine, profile: VerifiedProfile) -> bool:
    block, config = p.block, p.req.config
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
            raise unservable(p, detail)
        raise Refusal(422, detail, C.ENGINE_CAPABILITY)
    if p.devices > 1:
        raise Refusal(
            422,
            f"CPU serving runs one process; {p.devices} devices were requested "
            "(set config.tensor_parallel_size to 1)",
            C.ENGINE_CAPABILITY,
        )
    return True


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
