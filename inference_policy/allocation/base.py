"""What every allocation class answers, and the answers most classes share.

An `AllocationClass` is how a binding's devices are handed out. It owns what that means for the
rest of the core: the resource names its devices are counted in, the isolation it guarantees,
how many devices one plan may span, how a request's memory becomes a quantity of its resource
(the fit), what the node's GPU Feature Discovery labels must say for the node to be the
hardware the binding attests, and whether Pods on one physical device are kept from each other
(`isolates`; `tenancy` keeps tenants apart on the devices of a class that does not). Each class
is one module in this package; `__init__` registers it. A class reads a binding only through
`BindingFacts` (`binding_facts`), never the profile's models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from inference_policy.allocation.binding_facts import BindingFacts
from inference_policy.allocation.gfd import GFD_MEMORY, memory_verdict
from inference_policy.base.codes import NodeVerdictCode, Verdict
from inference_policy.base.quantity import GI, ceil_div, gib_ceil

Guarantee = Literal["whole-device", "mig", "accounted-share"]


class Fit(NamedTuple):
    """A request held by a binding: the memory planned per device, the quantity of the binding's
    resource, and the engine arguments the grant implies."""

    request_bytes: int
    quantity: int
    engine_args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AllocationClass:
    """One allocation class: the isolation it guarantees and the rules that follow from it."""

    guarantee: Guarantee
    # The profile's `allocator` discriminator of the bindings of this class.
    allocator: str
    # The planner's preference among bindings of equal memory: stronger isolation first.
    rank: int
    # The resource names of this class's devices: exact names, or prefixes ending in "-".
    resources: tuple[str, ...]
    # Why one plan may not span several devices of this class; empty when it may (with p2p).
    single_device: str = ""
    # Memory is handed out as a share of a bucket, sized by the engine's budget, not a device.
    shared_memory: bool = False
    # A DRA class's device type (the driver's `type` attribute); empty for a counted resource.
    device_type: str = ""
    # The device plugin (or DRA driver) hands each device to one Pod alone: a whole device, a MIG
    # slice. False for a share that is bookkeeping only, where Pods meet on the physical GPU.
    isolates: bool = True

    @property
    def claimed(self) -> bool:
        """Devices come through a resource claim (DRA), not a counted extended resource: the
        scheduler allocates them against the DeviceClass, and no node label attests them. It
        decides what a plan grants (a claim, not resources in the container's requests), what
        placement judges a Pod by (the node's architecture, nothing counted) and which bindings
        the owner's DeviceClasses and claim templates are rendered for."""
        return bool(self.device_type)

    @property
    def room_published(self) -> bool:
        """The extender counts this class's free devices and publishes them in a tenant's room
        figures, and the planner passes a binding whose published room is too small. False for a
        claimed class: kube-scheduler finds a claim's devices, and the claim spills itself."""
        return not self.claimed

    @property
    def multi_device(self) -> bool:
        return not self.single_device

    @property
    def busy_code(self) -> NodeVerdictCode:
        """A node whose devices of this class are taken now."""
        return NodeVerdictCode.VRAM_BUCKET if self.shared_memory else NodeVerdictCode.INSUFFICIENT

    @property
    def over_capacity_code(self) -> NodeVerdictCode:
        """A node whose whole allocatable is less than the Pod asks."""
        return NodeVerdictCode.VRAM_BUCKET if self.shared_memory else NodeVerdictCode.CAPACITY

    def owns(self, resource: str) -> bool:
        if self.claimed:
            return False
        return any(
            resource.startswith(name) if name.endswith("-") else resource == name
            for name in self.resources
        )

    def node_verdict(self, binding: BindingFacts, labels: Mapping[str, str]) -> Verdict | None:
        """What GFD's labels contradict in the binding beyond the card and driver checks every
        class shares; None when nothing does. By default: the card's memory."""
        return memory_verdict(binding, labels, GFD_MEMORY)

    def fit(
        self, binding: BindingFacts, fraction: float | None, devices: int, need: int
    ) -> Fit | None:
        """The request on this binding, or None when `need` bytes per device do not fit. By
        default a device holds the request: whole GiB of it, the engine budgeting `fraction` of
        the device (vLLM's gpu_memory_utilization)."""
        usable = binding.usable_memory_bytes
        args: dict[str, Any] = {}
        request = gib_ceil(need) * GI
        if fraction:
            if not self.budget_fits(binding, fraction, need, request, args):
                return None
            if devices > 1:
                args["tensor_parallel_size"] = devices
        elif need > usable:
            return None
        return Fit(request, devices, args)

    def budget_fits(
        self,
        binding: BindingFacts,
        fraction: float,
        need: int,
        request: int,
        args: dict[str, Any],
    ) -> bool:
        """Does the engine's budget of the device hold the need? Sets the budget it runs with."""
        if need > binding.usable_memory_bytes * fraction:
            return False
        args["gpu_memory_utilization"] = fraction
        return True


def ceil_hundredth(value: float) -> float:
    # Round in integer hundredths so 0.23 does not become 0.24 through float noise.
    scaled = round(value * 100, 9)
    return ceil_div(math.ceil(scaled * 1000), 1000) / 100 if scaled != int(scaled) else scaled / 100


__all__ = ["AllocationClass", "Fit", "Guarantee", "ceil_hundredth"]
