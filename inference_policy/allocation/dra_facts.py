"""A DRA binding's device: the facts it attests, spelled as the driver publishes them.

A `dra` binding hands out devices through Kubernetes' Dynamic Resource Allocation: the driver
(NVIDIA's `gpu.nvidia.com`) publishes every device in a ResourceSlice with its attributes and
capacity, and kube-scheduler allocates a claim the devices that a DeviceClass's CEL selector
admits. The owner signs what those devices are (`DraDevice`); this module turns the signed facts
into one table (`device_facts`), and that table, nowhere else, is what a device must show:

* `selector_cel` writes it as the DeviceClass's selector, so the scheduler never allocates a
  device whose published attributes differ from the signed ones;
* `device_mismatch` reads it against a ResourceSlice device, so the allocation controller can
  say which fact an allocated device does not have (a device allocated through another class).

Names are the driver's: attributes `type`, `productName`, `architecture`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `uuid`, `profile` (a MIG device),
and the `memory` capacity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from inference_policy.base.cel_text import cel_string
from inference_policy.base.quantity import QuantityError, parse_bytes, parse_whole_binary
from inference_policy.base.strict import Strict

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
SEMVER = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})")
DEVICE_UUID = re.compile(
    r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE
)
MIG_PROFILE = re.compile(r"[1-9]g\.[0-9]+gb(\+me)?")
# A product or architecture name as the driver writes it (NVML's strings).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,127}")


def _pattern(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _memory(value: str) -> str:
    try:
        parse_whole_binary(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return value


def semver_tuple(text: str) -> tuple[int, int, int]:
    """A driver's semantic version as numbers; ValueError for anything else."""
    match = SEMVER.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a version of the form MAJOR.MINOR.PATCH")
    return (int(match[1]), int(match[2]), int(match[3]))


class DraDevice(Strict):
    """The device a `dra` binding's claims are allocated, as the owner measured it."""

    driver: Literal["gpu.nvidia.com"]
    type: Literal["gpu", "mig"]
    productName: Annotated[str, _pattern(_NAME, "a product name as the driver publishes it")]
    architecture: Annotated[str, _pattern(_NAME, "a GPU architecture such as Hopper")]
    # The lowest driver on the binding's nodes: a device with an older one is not the hardware.
    driverVersion: Annotated[str, _pattern(SEMVER, "a driver version such as 550.54.15")]
    memory: Annotated[str, AfterValidator(_memory)]
    migProfile: Annotated[str, _pattern(MIG_PROFILE, "a MIG profile such as 1g.10gb")] | None = None
    uuids: list[Annotated[str, _pattern(DEVICE_UUID, "a GPU- or MIG- device UUID")]] | None = Field(
        default=None, min_length=1, max_length=256
    )

    @model_validator(mode="after")
    def _shape(self) -> DraDevice:
        if self.type == "mig" and self.migProfile is None:
            raise ValueError("migProfile is required for a mig device")
        if self.type == "gpu" and self.migProfile is not None:
            raise ValueError("migProfile applies only to a mig device")
        if self.uuids is not None:
            seen: set[str] = set()
            prefix = "MIG-" if self.type == "mig" else "GPU-"
            for uuid in self.uuids:
                if uuid.lower() in seen:
                    raise ValueError(f"uuid {uuid!r} is listed twice")
                if not uuid.upper().startswith(prefix):
                    raise ValueError(f"uuid {uuid!r} is not a {self.type} device's ({prefix}...)")
                seen.add(uuid.lower())
        return self


FactKind = Literal["string", "version-equal", "version-floor", "major-floor", "capacity", "one-of"]


@dataclass(frozen=True, slots=True)
class Fact:
    """One thing a device must show: the attribute (or capacity), how it compares, the value."""

    name: str
    kind: FactKind
    value: str
    # For `one-of`: the values allowed (`value` then names them for a message).
    allowed: tuple[str, ...] = ()

    @property
    def capacity(self) -> bool:
        return self.kind == "capacity"


def device_facts(
    device: DraDevice, compute_capability: str | None, cuda_driver_major: int | None
) -> tuple[Fact, ...]:
    """Every fact the binding attests of its devices, in the order they are checked."""
    facts = [
        Fact("type", "string", device.type),
        Fact("productName", "string", device.productName),
        Fact("architecture", "string", device.architecture),
    ]
    if compute_capability is not None:
        facts.append(Fact("cudaComputeCapability", "version-equal", compute_capability + ".0"))
    facts.append(Fact("driverVersion", "version-floor", device.driverVersion))
    if cuda_driver_major is not None:
        facts.append(Fact("cudaDriverVersion", "major-floor", str(cuda_driver_major)))
    if device.migProfile is not None:
        facts.append(Fact("profile", "string", device.migProfile))
    if device.uuids is not None:
        facts.append(Fact("uuid", "one-of", ", ".join(device.uuids), tuple(device.uuids)))
    facts.append(Fact("memory", "capacity", device.memory))
    return tuple(facts)


# -- CEL for the DeviceClass ------------------------------------------------------------------


def _cel_fact(driver: str, fact: Fact) -> str:
    domain = cel_string(driver)
    if fact.capacity:
        held = f"device.capacity[{domain}]"
        return (
            f"has({held}.{fact.name}) && "
            f"{held}.{fact.name}.compareTo(quantity({cel_string(fact.value)})) == 0"
        )
    attr = f"device.attributes[{domain}].{fact.name}"
    present = f"has({attr})"
    if fact.kind == "string":
        return f"{present} && {attr} == {cel_string(fact.value)}"
    if fact.kind == "version-equal":
        return f"{present} && {attr}.compareTo(semver({cel_string(fact.value)})) == 0"
    if fact.kind == "version-floor":
        return f"{present} && {attr}.compareTo(semver({cel_string(fact.value)})) >= 0"
    if fact.kind == "major-floor":
        return f"{present} && {attr}.major() >= {int(fact.value)}"
    listed = "[" + ", ".join(cel_string(v) for v in fact.allowed) + "]"
    return f"{present} && {attr} in {listed}"


def selector_cel(driver: str, facts: tuple[Fact, ...]) -> str:
    """The DeviceClass selector admitting exactly the devices that show every fact."""
    clauses = [f"device.driver == {cel_string(driver)}"]
    clauses += [f"({_cel_fact(driver, fact)})" for fact in facts]
    return " &&\n".join(clauses)


# -- a published device against the facts -----------------------------------------------------


def _attribute(device: Mapping[str, Any], driver: str, name: str) -> Any:
    """A ResourceSlice device's attribute value (`{"string": ...}` etc.), unqualified names
    being the driver's own domain."""
    attributes = device.get("attributes")
    if not isinstance(attributes, Mapping):
        return None
    entry = attributes.get(name, attributes.get(f"{driver}/{name}"))
    if not isinstance(entry, Mapping) or len(entry) != 1:
        return None
    return next(iter(entry.values()))


def _capacity(device: Mapping[str, Any], driver: str, name: str) -> Any:
    capacity = device.get("capacity")
    if not isinstance(capacity, Mapping):
        return None
    entry = capacity.get(name, capacity.get(f"{driver}/{name}"))
    return entry.get("value") if isinstance(entry, Mapping) else None


def _fact_holds(fact: Fact, value: Any) -> bool:
    if value is None:
        return False
    try:
        if fact.kind == "string":
            return bool(value == fact.value)
        if fact.kind == "one-of":
            return isinstance(value, str) and value in fact.allowed
        if fact.kind == "capacity":
            return isinstance(value, str) and parse_bytes(value) == parse_bytes(fact.value)
        have = _loose_semver(str(value))
        if fact.kind == "version-equal":
            return have == semver_tuple(fact.value)
        if fact.kind == "version-floor":
            return have >= semver_tuple(fact.value)
        return have[0] >= int(fact.value)
    except (ValueError, QuantityError):
        return False


def _loose_semver(text: str) -> tuple[int, int, int]:
    # The driver publishes semantic versions; a build suffix does not change the order here.
    core = text.split("+", 1)[0].split("-", 1)[0]
    return semver_tuple(core)


def device_mismatch(
    driver: str, facts: tuple[Fact, ...], published_driver: str, device: Mapping[str, Any]
) -> str | None:
    """The first signed fact a published device (a ResourceSlice's entry) does not show, in
    words; None when it shows every one."""
    if published_driver != driver:
        return f"the device is published by driver {published_driver}, not {driver}"
    for fact in facts:
        value = (
            _capacity(device, driver, fact.name)
            if fact.capacity
            else _attribute(device, driver, fact.name)
        )
        if not _fact_holds(fact, value):
            shown = "absent" if value is None else str(value)
            wanted = fact.value
            how = {
                "version-floor": "at least ",
                "major-floor": "major version at least ",
                "one-of": "one of ",
            }.get(fact.kind, "")
            return f"its {fact.name} is {shown}, the binding attests {how}{wanted}"
    return None


__all__ = [
    "DEVICE_UUID",
    "NVIDIA_DRA_DRIVER",
    "DraDevice",
    "Fact",
    "device_facts",
    "device_mismatch",
    "selector_cel",
    "semver_tuple",
]
