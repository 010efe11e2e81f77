"""The owner profile envelope: the signed statement of what hardware a tenant may use.

The schema is strict on purpose. A profile is the only thing that lets a tenant's Pod onto a GPU,
so anything the release does not understand (an unknown key, a fractional memory size, a node
selector other than the architecture, a repeated binding id) is refused with the field named,
rather than being ignored and silently widening what the owner signed.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from inference_policy.allocation import AllocationClass, Guarantee, class_of
from inference_policy.allocation.dra_facts import DraDevice
from inference_policy.base.errors import describe
from inference_policy.base.quantity import QuantityError, parse_whole_binary
from inference_policy.base.strict import Strict
from inference_policy.base.wire import WHOLE_GPU_RESOURCE

TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
CLUSTER_BINDING_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
PINNED_IMAGE = re.compile(r"[a-z0-9][a-z0-9._:/-]*[a-z0-9]@sha256:[0-9a-f]{64}")
VARIANT_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
COMPUTE_CAPABILITY = re.compile(r"(?P<major>[1-9][0-9]?)\.(?P<minor>[0-9])")
VRAM_RESOURCE = re.compile(r"kamiwaza\.ai/vram-gb-[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
MIG_RESOURCE = re.compile(r"nvidia\.com/mig-[1-9]g\.[0-9]+gb(\+me)?")
MAX_VERSION = 2**53 - 1
ARCH_KEY = "kubernetes.io/arch"

Architecture = Literal["amd64", "arm64"]
Feature = Literal["bf16", "fp8", "mig", "nvlink", "p2p"]


class ProfileSchemaError(ValueError):
    """The envelope does not match the schema; the message names the field."""


def parse_timestamp(text: str) -> datetime:
    """`YYYY-MM-DDTHH:MM:SSZ` only: no offsets, fractions, lower-case z or bare dates."""
    if not _TIMESTAMP.fullmatch(text):
        raise ValueError(f"{text!r} is not a UTC timestamp of the form YYYY-MM-DDTHH:MM:SSZ")
    try:
        return datetime.strptime(text, TIMESTAMP_FORMAT).replace(tzinfo=UTC)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a valid date and time") from exc


def format_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(TIMESTAMP_FORMAT)


def _matches(pattern: re.Pattern[str], description: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {description}")
        return value

    return AfterValidator(check)


def _timestamp(value: str) -> str:
    parse_timestamp(value)
    return value


def _whole_memory(value: str) -> str:
    try:
        parse_whole_binary(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return value


Timestamp = Annotated[str, AfterValidator(_timestamp)]
WholeMemory = Annotated[str, AfterValidator(_whole_memory)]
BindingId = Annotated[
    str,
    _matches(DNS_SUBDOMAIN, "a binding id (lower-case letters, digits, '-' and '.')"),
    Field(max_length=253),
]
VariantId = Annotated[str, _matches(VARIANT_ID, "a variant id such as llamacpp-nvidia-amd64")]
PinnedImage = Annotated[
    str,
    _matches(PINNED_IMAGE, "a digest-pinned image reference (<repository>@sha256:<64 hex>)"),
    Field(max_length=1024),
]


def _unique(values: list[str], what: str) -> list[str]:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{what} {value!r} is listed twice")
        seen.add(value)
    return values


class Accelerator(Strict):
    vendor: Literal["nvidia", "amd"]
    computeCapability: (
        Annotated[str, _matches(COMPUTE_CAPABILITY, "a compute capability such as 8.0")] | None
    ) = None
    cudaDriverMajor: Annotated[int, Field(ge=11, le=99)] | None = None
    features: list[Feature] = Field(default_factory=list, max_length=5)

    @field_validator("features")
    @classmethod
    def _features_unique(cls, value: list[str]) -> list[str]:
        return _unique(value, "feature")

    @model_validator(mode="after")
    def _vendor_facts(self) -> Accelerator:
        if self.vendor == "nvidia" and self.computeCapability is None:
            raise ValueError("computeCapability is required for an nvidia accelerator")
        if self.vendor == "amd" and self.cudaDriverMajor is not None:
            raise ValueError("cudaDriverMajor applies only to nvidia accelerators")
        return self

    @cached_property
    def capability_tuple(self) -> tuple[int, int]:
        match = COMPUTE_CAPABILITY.fullmatch(self.computeCapability or "0.0")
        return (int(match["major"]), int(match["minor"])) if match else (0, 0)


class SchedulerCapacity(Strict):
    kind: Literal["scheduler"]
    usableMemory: WholeMemory | None = None


class AccountedCapacity(Strict):
    kind: Literal["accounted"]
    usableMemory: WholeMemory


class Resource(Strict):
    name: Annotated[str, Field(min_length=1, max_length=253)]
    quantity: Literal[1]


class Runtime(Strict):
    kind: Literal["cpu", "cuda", "rocm"]
    variantId: VariantId
    image: PinnedImage


def _node_selector(value: dict[str, str]) -> dict[str, str]:
    extra = sorted(set(value) - {ARCH_KEY})
    if extra:
        raise ValueError(f"only {ARCH_KEY} is accepted; remove {', '.join(extra)}")
    if ARCH_KEY not in value:
        raise ValueError(f"{ARCH_KEY} is required")
    return value


NodeSelector = Annotated[dict[str, str], AfterValidator(_node_selector)]


class _BindingBase(Strict):
    id: BindingId
    architecture: Architecture
    nodeSelector: NodeSelector
    runtime: Runtime

    @model_validator(mode="after")
    def _arch_selector(self) -> _BindingBase:
        if self.nodeSelector[ARCH_KEY] != self.architecture:
            raise ValueError(
                f"nodeSelector {ARCH_KEY}={self.nodeSelector[ARCH_KEY]} does not match "
                f"architecture {self.architecture}"
            )
        return self


class CpuBinding(_BindingBase):
    allocator: Literal["cpu"]
    capacity: SchedulerCapacity

    @model_validator(mode="after")
    def _cpu_shape(self) -> CpuBinding:
        if self.runtime.kind != "cpu":
            raise ValueError("a cpu binding's runtime.kind must be cpu")
        if self.capacity.usableMemory is not None:
            raise ValueError("a cpu binding declares no usableMemory")
        return self


class _GpuBindingBase(_BindingBase):
    allocator: str
    accelerator: Accelerator
    runtimeClassName: Annotated[
        str, _matches(DNS_SUBDOMAIN, "a RuntimeClass name"), Field(max_length=253)
    ]

    @cached_property
    def allocation(self) -> AllocationClass:
        """This binding's allocation class: what its devices guarantee and how they are used."""
        return class_of(self.allocator, self.allocation_key)

    @property
    def allocation_key(self) -> str:
        """What tells this binding's class apart among its allocator's: the resource name."""
        raise NotImplementedError

    @cached_property
    def usable_memory_bytes(self) -> int:
        memory = self.capacity_memory
        return parse_whole_binary(memory)

    @property
    def capacity_memory(self) -> str:
        raise NotImplementedError


class _CountedBinding(_GpuBindingBase):
    """A binding whose devices the kubelet counts as an extended resource."""

    resource: Resource

    @property
    def allocation_key(self) -> str:
        return self.resource.name


class ExtendedResourceBinding(_CountedBinding):
    allocator: Literal["extended-resource"]
    capacity: SchedulerCapacity

    @model_validator(mode="after")
    def _extended_shape(self) -> ExtendedResourceBinding:
        if self.capacity.usableMemory is None:
            raise ValueError("capacity.usableMemory is required for a GPU binding")
        name = self.resource.name
        vendor = self.accelerator.vendor
        if vendor == "nvidia" and not (name == WHOLE_GPU_RESOURCE or MIG_RESOURCE.fullmatch(name)):
            raise ValueError(
                f"resource.name {name!r} is neither nvidia.com/gpu nor a nvidia.com/mig-* slice"
            )
        if vendor == "amd" and name != "amd.com/gpu":
            raise ValueError(f"resource.name {name!r} must be amd.com/gpu for an amd accelerator")
        expected = "rocm" if vendor == "amd" else "cuda"
        if self.runtime.kind != expected:
            raise ValueError(f"runtime.kind must be {expected} for a {vendor} accelerator")
        return self

    @property
    def capacity_memory(self) -> str:
        assert self.capacity.usableMemory is not None
        return self.capacity.usableMemory


class Sharing(Strict):
    """Whom the physical GPU of a share may be shared with: by default only the Pods of the
    profile's own tenant (`tenancy`); `acrossTenants` is the owner's decision to trust others."""

    acrossTenants: bool


class VramPluginBinding(_CountedBinding):
    allocator: Literal["vram-plugin"]
    capacity: AccountedCapacity
    sharing: Sharing | None = None

    @model_validator(mode="after")
    def _vram_shape(self) -> VramPluginBinding:
        if not VRAM_RESOURCE.fullmatch(self.resource.name):
            raise ValueError(
                f"resource.name {self.resource.name!r} must be a kamiwaza.ai/vram-gb-* resource"
            )
        if self.accelerator.vendor != "nvidia" or self.runtime.kind != "cuda":
            raise ValueError("a vram-plugin binding must attest an nvidia accelerator and cuda")
        return self

    @property
    def capacity_memory(self) -> str:
        return self.capacity.usableMemory

    @property
    def crosses_tenants(self) -> bool:
        """May this binding's shares sit on one GPU beside other tenants' (`tenancy`)?"""
        return self.sharing is not None and self.sharing.acrossTenants


class DraBinding(_GpuBindingBase):
    """Devices allocated through Dynamic Resource Allocation: a claim on the owner's
    DeviceClass for this binding, whose selector pins every fact of `device`."""

    allocator: Literal["dra"]
    capacity: SchedulerCapacity
    device: DraDevice

    @model_validator(mode="after")
    def _dra_shape(self) -> DraBinding:
        if self.capacity.usableMemory is None:
            raise ValueError("capacity.usableMemory is required for a GPU binding")
        if self.accelerator.vendor != "nvidia" or self.runtime.kind != "cuda":
            raise ValueError("a dra binding must attest an nvidia accelerator and cuda")
        if self.device.type == "mig" and "p2p" in self.accelerator.features:
            raise ValueError("a mig device has no peer path; remove p2p from features")
        if parse_whole_binary(self.capacity.usableMemory) > parse_whole_binary(self.device.memory):
            raise ValueError(
                f"capacity.usableMemory {self.capacity.usableMemory} exceeds the device's "
                f"memory {self.device.memory}"
            )
        return self

    @property
    def allocation_key(self) -> str:
        return self.device.type

    @property
    def capacity_memory(self) -> str:
        assert self.capacity.usableMemory is not None
        return self.capacity.usableMemory


CountedBinding = ExtendedResourceBinding | VramPluginBinding
GpuBinding = ExtendedResourceBinding | VramPluginBinding | DraBinding
AnyBinding = CpuBinding | ExtendedResourceBinding | VramPluginBinding | DraBinding
Binding = Annotated[AnyBinding, Field(discriminator="allocator")]


def as_claimed(binding: GpuBinding) -> DraBinding | None:
    """The binding as a claim on its DeviceClass when its allocation class hands its devices out
    by a resource claim (`AllocationClass.claimed`), else None. The class decides."""
    if not binding.allocation.claimed:
        return None
    assert isinstance(binding, DraBinding), f"binding {binding.id}: a claimed class, not a claim"
    return binding


def as_counted(binding: GpuBinding) -> CountedBinding | None:
    """The binding as a counted extended resource, when its allocation class's devices are
    counted on the node (`AllocationClass.claimed` false); None when they come through a claim."""
    if binding.allocation.claimed:
        return None
    assert not isinstance(binding, DraBinding), f"binding {binding.id}: a claim, not counted"
    return binding


class Profile(Strict):
    name: Annotated[str, _matches(DNS_SUBDOMAIN, "a profile name"), Field(max_length=63)]
    capability: Literal["cpu", "gpu"]
    guarantees: list[Guarantee] = Field(max_length=1)
    compatibleVariantIds: list[VariantId] = Field(min_length=1, max_length=64)
    bindings: list[Binding] = Field(min_length=1, max_length=256)

    @field_validator("compatibleVariantIds")
    @classmethod
    def _variants_unique(cls, value: list[str]) -> list[str]:
        return _unique(value, "variant id")

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        for index, binding in enumerate(self.bindings):
            where = f"bindings[{index}]"
            if self.capability == "cpu" and not isinstance(binding, CpuBinding):
                raise ValueError(f"{where}: a cpu profile holds only cpu bindings")
            if self.capability == "gpu" and isinstance(binding, CpuBinding):
                raise ValueError(f"{where}: a gpu profile holds no cpu binding")
            if binding.runtime.variantId not in self.compatibleVariantIds:
                raise ValueError(
                    f"{where}.runtime.variantId {binding.runtime.variantId!r} is not in "
                    "this profile's compatibleVariantIds"
                )
        if self.capability == "cpu":
            if self.guarantees:
                raise ValueError("guarantees: a cpu profile has none")
            return self
        if len(self.guarantees) != 1:
            raise ValueError("guarantees: a gpu profile has exactly one guarantee")
        guarantee = self.guarantees[0]
        for index, binding in enumerate(self.bindings):
            kind = binding_guarantee(binding)
            if kind != guarantee:
                raise ValueError(
                    f"bindings[{index}]: a {kind} binding in a profile that guarantees {guarantee}"
                )
        return self


def binding_guarantee(binding: AnyBinding) -> str:
    """The guarantee a profile states for this binding: its allocation class's, or cpu."""
    if type(binding) is CpuBinding:
        return "cpu"
    return binding.allocation.guarantee  # type: ignore[union-attr]


class Envelope(Strict):
    schemaVersion: Literal[1]
    clusterBindingId: Annotated[
        str,
        _matches(
            CLUSTER_BINDING_ID,
            "a cluster binding id (1 to 128 characters, a letter or digit first, then letters, "
            "digits, '.', '_', ':' or '-')",
        ),
    ]
    namespace: Annotated[str, _matches(DNS_LABEL, "a namespace name")]
    version: Annotated[int, Field(ge=1, le=MAX_VERSION)]
    keyId: Annotated[
        str, _matches(re.compile(r"sha256:[0-9a-f]{64}"), "sha256: followed by 64 hex digits")
    ]
    issuedAt: Timestamp
    expiresAt: Timestamp
    evidenceId: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    profiles: list[Profile] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _unique_names(self) -> Envelope:
        names: set[str] = set()
        ids: dict[str, str] = {}
        # A resource is one physical GPU's bucket: whether the tenant's shares of it may meet
        # other tenants' must not depend on which of its bindings a Pod was planned on.
        sharing: dict[str, tuple[str, bool]] = {}
        for p_index, profile in enumerate(self.profiles):
            if profile.name in names:
                raise ValueError(f"profiles[{p_index}].name {profile.name!r} is used twice")
            names.add(profile.name)
            for b_index, binding in enumerate(profile.bindings):
                where = f"profiles[{p_index}].bindings[{b_index}].id"
                if binding.id in ids:
                    raise ValueError(
                        f"{where} {binding.id!r} repeats {ids[binding.id]}; binding ids must be "
                        "unique across the whole envelope"
                    )
                ids[binding.id] = where
                if isinstance(binding, VramPluginBinding):
                    here = (binding.id, binding.crosses_tenants)
                    other = sharing.setdefault(binding.resource.name, here)
                    if other[1] != here[1]:
                        raise ValueError(
                            f"bindings {other[0]} and {binding.id} share resource "
                            f"{binding.resource.name} but not sharing.acrossTenants; the bindings "
                            "of one GPU's bucket must say the same"
                        )
        return self

    @cached_property
    def issued_at(self) -> datetime:
        return parse_timestamp(self.issuedAt)

    @cached_property
    def expires_at(self) -> datetime:
        return parse_timestamp(self.expiresAt)

    def gpu_bindings(self) -> list[tuple[Profile, GpuBinding]]:
        return self._gpu_bindings

    @cached_property
    def _gpu_bindings(self) -> list[tuple[Profile, GpuBinding]]:
        # Computed once per verified revision: the planner walks it on every decision.
        return [
            (profile, binding)
            for profile in self.profiles
            for binding in profile.bindings
            if not isinstance(binding, CpuBinding)
        ]

    def cpu_bindings(self) -> list[tuple[Profile, CpuBinding]]:
        return self._cpu_bindings

    @cached_property
    def _cpu_bindings(self) -> list[tuple[Profile, CpuBinding]]:
        return [
            (profile, binding)
            for profile in self.profiles
            for binding in profile.bindings
            if isinstance(binding, CpuBinding)
        ]

    def binding(self, binding_id: str) -> tuple[Profile, AnyBinding] | None:
        for profile in self.profiles:
            for binding in profile.bindings:
                if binding.id == binding_id:
                    return profile, binding
        return None


def parse_envelope(document: Any) -> Envelope:
    """Validate an already strictly-decoded JSON value as an envelope."""
    if not isinstance(document, dict):
        raise ProfileSchemaError("the envelope must be a JSON object")
    try:
        return Envelope.model_validate(document)
    except ValidationError as exc:
        raise ProfileSchemaError(describe(exc)) from None
