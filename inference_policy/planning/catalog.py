"""The engine catalog: which engine images this release ships, and which one a binding gets.

An image runs only where both the card (compute capability, bf16) and the host driver (the CUDA
major it attests) can run it, and only on its vendor and architecture. Selection picks the
newest image both limits allow; when none is left the refusal names the limit that ruled the
last candidates out, in the seed's words, so an owner knows whether a driver upgrade helps.

Each engine's own rules live here too, beside its images: the model formats it serves (and the
refusal's words for any other), the GPU working memory it holds beside weights and cache, and the
configuration keys tenant mode refuses for it. The planner and the sizing read them from the
engine, so a new engine is one catalog entry; the schema has no default for any of them.

Relocation happens once, when the catalog is loaded, in the seed's order: the engine image map,
the registry prefix, the air-gap registry, or the reference as pinned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from inference_policy.base.errors import describe
from inference_policy.base.quantity import QuantityError, ceil_div, parse_bytes
from inference_policy.base.strict import Strict
from inference_policy.planning.request import ModelConfig
from inference_policy.trust.profile import COMPUTE_CAPABILITY, PINNED_IMAGE

Placement = Literal["gpu", "cpu"]
_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")


class CatalogError(ValueError):
    """The catalog document or the relocation settings are unusable."""


class ImageMapError(CatalogError):
    """An engine image map built for another release: it names none of this catalog's images."""

    detail = "engine image map carries no image from this release's catalog"


class CatalogImage(Strict):
    vendor: Literal["nvidia", "amd", "cpu"]
    architecture: Literal["amd64", "arm64"]
    cuda: Annotated[int, Field(ge=11, le=99)] | None
    image: Annotated[str, Field(pattern=PINNED_IMAGE.pattern)]
    minComputeCapability: str | None = None
    onlyComputeCapability: str | None = None


class CpuFloor(Strict):
    cpu: str
    memory: str


ModelFormat = Literal["gguf", "safetensors", "diffusers", "checkpoint"]
FORMAT_SLOT = "{format}"


class ModelFormats(Strict):
    """The formats an engine serves, and the refusal for any other, with `{format}` where the
    request's format goes."""

    accepts: Annotated[list[ModelFormat], Field(min_length=1)]
    refusal: Annotated[str, Field(min_length=1)]

    @model_validator(mode="after")
    def _names_the_format(self) -> ModelFormats:
        if self.refusal.count(FORMAT_SLOT) != 1:
            raise ValueError(f"refusal must name the request's format once, as {FORMAT_SLOT}")
        return self


class WorkingMemorySpec(Strict):
    """GPU memory the engine holds beside weights and cache, per device: at least `minimum`,
    and with `weightsDivisor` at least the weights divided by it."""

    minimum: str
    weightsDivisor: Annotated[int, Field(ge=1)] | None = None


class CatalogEngine(Strict):
    engine: Annotated[str, Field(pattern=r"^[a-z0-9]+$")]
    serves: list[str]
    placement: list[Placement]
    requiresBf16: bool
    maxDevices: Annotated[int, Field(ge=0, le=8)]
    modelFormats: ModelFormats
    workingMemory: WorkingMemorySpec | None = None
    unsupportedConfig: list[str] = Field(default_factory=list)
    cpuFloor: CpuFloor | None = None
    gpuMemoryUtilization: float | None = None
    images: list[CatalogImage]

    @model_validator(mode="after")
    def _rules_are_complete(self) -> CatalogEngine:
        if "gpu" in self.placement and self.workingMemory is None:
            raise ValueError("a GPU engine must state its workingMemory")
        unknown = [k for k in self.unsupportedConfig if k not in ModelConfig.model_fields]
        if unknown:
            raise ValueError(f"unsupportedConfig names no configuration key: {', '.join(unknown)}")
        return self


class CatalogDocument(Strict):
    schemaVersion: Literal[1]
    release: str
    engines: list[CatalogEngine]


def _working_memory(entry: CatalogEngine) -> WorkingMemory | None:
    spec = entry.workingMemory
    if spec is None:
        return None
    try:
        minimum = parse_bytes(spec.minimum)
    except QuantityError as exc:
        raise CatalogError(f"engine catalog: {entry.engine}.workingMemory.minimum: {exc}") from None
    return WorkingMemory(minimum, spec.weightsDivisor)


def cc_tuple(text: str | None) -> tuple[int, int]:
    match = COMPUTE_CAPABILITY.fullmatch(text or "")
    if match is None:
        return (0, 0)
    return int(match["major"]), int(match["minor"])


def cc_text(value: tuple[int, int]) -> str:
    return f"{value[0]}.{value[1]}"


@dataclass(frozen=True)
class Image:
    engine: str
    vendor: str
    architecture: str
    cuda: int | None
    pinned: str
    reference: str
    min_cc: tuple[int, int]
    only_cc: tuple[int, int] | None

    @property
    def variant_id(self) -> str:
        return f"{self.engine}-{self.vendor}-{self.architecture}"


@dataclass(frozen=True, slots=True)
class WorkingMemory:
    """What an engine holds on each device beside its share of weights and cache."""

    minimum: int
    weights_divisor: int | None = None

    def bytes_for(self, weights: int) -> int:
        if self.weights_divisor is None:
            return self.minimum
        return max(self.minimum, ceil_div(weights, self.weights_divisor))


@dataclass(frozen=True)
class Engine:
    name: str
    serves: tuple[str, ...]
    placement: tuple[str, ...]
    requires_bf16: bool
    max_devices: int
    cpu_floor: CpuFloor | None
    gpu_memory_utilization: float | None
    images: tuple[Image, ...]
    model_formats: tuple[str, ...] = ()
    format_refusal: str = ""
    working_memory: WorkingMemory | None = None
    unsupported_config: tuple[str, ...] = ()

    def format_refused(self, model_format: str) -> str | None:
        """Why this engine does not serve `model_format`, or None when it does."""
        if model_format in self.model_formats:
            return None
        return self.format_refusal.replace(FORMAT_SLOT, model_format)

    @property
    def gpu_capable(self) -> bool:
        return "gpu" in self.placement

    @property
    def cpu_capable(self) -> bool:
        return "cpu" in self.placement


@dataclass(frozen=True)
class ImageSource:
    """The relocation settings, in the seed's order of precedence."""

    engine_image_map: Mapping[str, str] | None = None
    registry_prefix: str | None = None
    airgap_registry: str | None = None


@dataclass(frozen=True)
class Selection:
    image: Image | None
    refusal: str | None = None


@dataclass(frozen=True)
class EngineCatalog:
    release: str
    engines: Mapping[str, Engine]
    unqualified: frozenset[str] = field(default_factory=frozenset)
    # Selection depends only on its arguments and this immutable catalog, and the same few
    # bindings are asked about on every decision, so answers are kept per catalog.
    _selections: dict[tuple[str, str, str, tuple[int, int], int | None], Selection] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @classmethod
    def from_document(cls, document: Any) -> EngineCatalog:
        try:
            parsed = CatalogDocument.model_validate(document)
        except ValidationError as exc:
            raise CatalogError(f"engine catalog: {describe(exc)}") from None
        engines: dict[str, Engine] = {}
        for entry in parsed.engines:
            images = tuple(
                Image(
                    engine=entry.engine,
                    vendor=img.vendor,
                    architecture=img.architecture,
                    cuda=img.cuda,
                    pinned=img.image,
                    reference=img.image,
                    min_cc=cc_tuple(img.minComputeCapability),
                    only_cc=cc_tuple(img.onlyComputeCapability)
                    if img.onlyComputeCapability
                    else None,
                )
                for img in entry.images
            )
            engines[entry.engine] = Engine(
                model_formats=tuple(entry.modelFormats.accepts),
                format_refusal=entry.modelFormats.refusal,
                working_memory=_working_memory(entry),
                unsupported_config=tuple(entry.unsupportedConfig),
                name=entry.engine,
                serves=tuple(entry.serves),
                placement=tuple(entry.placement),
                requires_bf16=entry.requiresBf16,
                max_devices=entry.maxDevices,
                cpu_floor=entry.cpuFloor,
                gpu_memory_utilization=entry.gpuMemoryUtilization,
                images=images,
            )
        return cls(parsed.release, engines)

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """The catalog as `engine vendor architecture cuda image` rows, pinned references."""
        return [
            (img.engine, img.vendor, img.architecture, str(img.cuda or "-"), img.pinned)
            for engine in self.engines.values()
            for img in engine.images
        ]

    def qualified(self, name: str) -> Engine | None:
        if name in self.unqualified:
            return None
        return self.engines.get(name)

    def relocated(self, source: ImageSource) -> EngineCatalog:
        """Apply relocation once. With an image map, images it does not carry are dropped."""
        if source.engine_image_map is not None:
            return self._mapped(source.engine_image_map)
        if source.registry_prefix:
            prefix = source.registry_prefix.rstrip("/")
            return self._rewritten(
                lambda img: f"{prefix}/images/{_name(img.pinned)}@{_digest(img.pinned)}"
            )
        if source.airgap_registry:
            registry = re.sub(r"^[a-z]+://", "", source.airgap_registry).rstrip("/")
            return self._rewritten(
                lambda img: f"{registry}/{_repository(img.pinned)}@{_digest(img.pinned)}"
            )
        return self

    def _rewritten(self, rewrite: Any) -> EngineCatalog:
        engines = {
            name: replace(
                engine,
                images=tuple(replace(img, reference=rewrite(img)) for img in engine.images),
            )
            for name, engine in self.engines.items()
        }
        return replace(self, engines=engines, _selections={})

    def _mapped(self, mapping: Mapping[str, str]) -> EngineCatalog:
        for source_ref, target in mapping.items():
            if not isinstance(target, str) or not PINNED_IMAGE.fullmatch(target):
                raise CatalogError(
                    f"engine image map: {source_ref!r} maps to {target!r}, "
                    "which is not a digest-pinned reference"
                )
        known = {img.pinned for engine in self.engines.values() for img in engine.images}
        if not known & set(mapping):
            raise ImageMapError(ImageMapError.detail)
        engines: dict[str, Engine] = {}
        unqualified: set[str] = set(self.unqualified)
        for name, engine in self.engines.items():
            kept = tuple(
                replace(img, reference=mapping[img.pinned])
                for img in engine.images
                if img.pinned in mapping
            )
            if not kept:
                unqualified.add(name)
            engines[name] = replace(engine, images=kept)
        return replace(self, engines=engines, unqualified=frozenset(unqualified), _selections={})

    def cpu_image(self, engine: Engine, architecture: str) -> Image | None:
        for img in engine.images:
            if img.vendor == "cpu" and img.architecture == architecture:
                return img
        return None

    def select_gpu_image(
        self,
        engine: Engine,
        vendor: str,
        architecture: str,
        compute_capability: tuple[int, int],
        cuda_driver_major: int | None,
    ) -> Selection:
        """The newest image the card and the driver can both run, or the seed's refusal."""
        key = (engine.name, vendor, architecture, compute_capability, cuda_driver_major)
        cached = self._selections.get(key)
        if cached is None:
            cached = self._select(
                engine, vendor, architecture, compute_capability, cuda_driver_major
            )
            self._selections[key] = cached
        return cached

    def _select(
        self,
        engine: Engine,
        vendor: str,
        architecture: str,
        compute_capability: tuple[int, int],
        cuda_driver_major: int | None,
    ) -> Selection:
        candidates = [
            img
            for img in engine.images
            if img.vendor == vendor and img.architecture == architecture
        ]
        if not candidates:
            return Selection(
                None, f"no {engine.name} image is published for {vendor}/{architecture}"
            )
        floor = (8, 0) if engine.requires_bf16 else (0, 0)

        def lowest(img: Image) -> tuple[int, int]:
            return img.only_cc or max(img.min_cc, floor)

        card_ok = [
            img
            for img in candidates
            if (
                img.only_cc == compute_capability
                if img.only_cc
                else compute_capability >= lowest(img)
            )
        ]
        if not card_ok:
            need = min(lowest(img) for img in candidates)
            return Selection(
                None,
                f"{engine.name} requires compute capability {cc_text(need)}; "
                f"this binding declares {cc_text(compute_capability)}",
            )
        if cuda_driver_major is not None:
            driver_ok = [img for img in card_ok if (img.cuda or 0) <= cuda_driver_major]
            if not driver_ok:
                least = min(img.cuda or 0 for img in card_ok)
                return Selection(
                    None,
                    f"host driver supports CUDA {cuda_driver_major} (attested cudaDriverMajor); "
                    f"engine {engine.name} ships {vendor}/{architecture} images for CUDA {least}+",
                )
            card_ok = driver_ok
        return Selection(max(card_ok, key=lambda img: img.cuda or 0))


def _split(reference: str) -> tuple[str, str]:
    match = _DIGEST.search(reference)
    if match is None:
        raise CatalogError(f"{reference!r} is not digest-pinned")
    return reference[: match.start()], match.group(1)


def _digest(reference: str) -> str:
    return _split(reference)[1]


def _name(reference: str) -> str:
    return _split(reference)[0].rsplit("/", 1)[-1]


def _repository(reference: str) -> str:
    """The repository path without its registry host (the seed's 'catalog repository')."""
    repo = _split(reference)[0]
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return repo
