"""The deployment request, as the annotation, the plan API and `tmi plan` carry it.

Unknown keys are refused at the top level and in `model`, because a typo there would silently
change the plan; `config` is the model's own configuration and keeps keys this release does not
read. Fields whose wrong values have a rule of their own (the device count, the diffusion keys)
are kept loose here so the planner can refuse them with the seed's sentence instead of a generic
type error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inference_policy.base.errors import describe
from inference_policy.base.strict import STRICT, Strict

ModelFormat = Literal["gguf", "safetensors", "diffusers", "checkpoint"]
Count = Annotated[int, Field(ge=1, le=2**31)]


class RequestError(ValueError):
    """The request is malformed; the message names the field."""


class ModelInfo(Strict):
    name: Annotated[str, Field(min_length=1, max_length=512)]
    format: ModelFormat
    weightsBytes: Annotated[int, Field(ge=1, le=2**50)]
    contextLength: Count | None = None
    layers: Count | None = None
    kvHeads: Count | None = None
    headDim: Count | None = None


class ModelConfig(BaseModel):
    """The model configuration; only the keys a rule names are read, the rest are ignored."""

    model_config = STRICT | ConfigDict(extra="ignore")

    max_model_len: Count | None = None
    tensor_parallel_size: Any = None
    gpu_count: Any = None
    force_cpu: bool = False
    embedding: bool = False
    pooling: str | None = None
    trust_remote_code: Any = None
    lora: Any = None
    lightning: Any = None
    stream_profile: Any = None
    dfloat11: Any = None


class MemoryRequest(Strict):
    minimum: Annotated[str, Field(min_length=1, max_length=32)]


class AcceleratorRequest(Strict):
    capability: Literal["gpu"]
    count: Any = 1
    memory: MemoryRequest
    isolation: Literal["any-qualified", "whole-device", "mig", "accounted-share"] = "any-qualified"
    profile: Annotated[str, Field(min_length=1, max_length=63)] | None = None


class CpuRequests(Strict):
    cpu: Annotated[str, Field(min_length=1, max_length=32)]
    memory: Annotated[str, Field(min_length=1, max_length=32)]


class CpuRequest(Strict):
    architecture: Literal["amd64", "arm64"]
    requests: CpuRequests


class RuntimeRequest(Strict):
    selection: Literal["automatic"]


class InferenceResources(Strict):
    schemaVersion: Literal[1]
    accelerator: AcceleratorRequest | None = None
    cpu: CpuRequest | None = None
    runtime: RuntimeRequest


NonNegative = Annotated[float, Field(ge=0)] | Annotated[int, Field(ge=0)]


class DeploymentRequest(Strict):
    schemaVersion: Literal[1]
    engine: Annotated[str, Field(min_length=1, max_length=64)]
    external: bool = False
    gpu_allocation: NonNegative = 0
    vram_allocation: NonNegative = 0
    model: ModelInfo | None = None
    config: ModelConfig = Field(default_factory=ModelConfig)
    inferenceResources: InferenceResources | None = None


def parse_request(document: Any) -> DeploymentRequest:
    if not isinstance(document, dict):
        raise RequestError("the deployment request must be a JSON object")
    try:
        request = DeploymentRequest.model_validate(document)
    except ValidationError as exc:
        raise RequestError(f"invalid deployment request: {describe(exc)}") from None
    block = request.inferenceResources
    if block is not None and (block.accelerator is None) == (block.cpu is None):
        raise RequestError(
            "invalid deployment request: inferenceResources needs exactly one of accelerator or cpu"
        )
    return request
