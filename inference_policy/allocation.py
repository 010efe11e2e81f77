"""What each allocation class means, decided once: the seam a new class is added at.

A binding's allocation class is how its devices are handed out: a whole device (`nvidia.com/gpu`,
`amd.com/gpu`), a MIG partition (`nvidia.com/mig-<profile>`), or a share of an accounted VRAM
bucket (`kamiwaza.ai/vram-gb-<n>`, the owner's VRAM plugin). The planner (which classes a request
may use, in which order, how many devices one plan may span, how a share is sized), placement
(which verdict code a full or too-small node gets), the profile's guarantee check and the chart's
policies all ask this module, never a resource-name prefix or a binding's concrete type. A new
class (a DRA ResourceClaim, say) is one more `AllocationClass` here, its binding model in
`profile`, and its node rules in `nodes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inference_policy.verdict_codes import NodeVerdictCode
from inference_policy.wire import MIG_RESOURCE_PREFIX, VRAM_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE

Guarantee = Literal["whole-device", "mig", "accounted-share"]


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
        return any(
            resource.startswith(name) if name.endswith("-") else resource == name
            for name in self.resources
        )


WHOLE_DEVICE = AllocationClass(
    guarantee="whole-device",
    allocator="extended-resource",
    rank=1,
    resources=(WHOLE_GPU_RESOURCE, "amd.com/gpu"),
)
MIG = AllocationClass(
    guarantee="mig",
    allocator="extended-resource",
    rank=0,
    resources=(MIG_RESOURCE_PREFIX,),
    single_device="a MIG partition has no peer path",
)
ACCOUNTED_SHARE = AllocationClass(
    guarantee="accounted-share",
    allocator="vram-plugin",
    rank=2,
    resources=(VRAM_RESOURCE_PREFIX,),
    single_device="an accounted VRAM share is a slice of one device",
    shared_memory=True,
)
CLASSES = (MIG, WHOLE_DEVICE, ACCOUNTED_SHARE)
BY_GUARANTEE = {c.guarantee: c for c in CLASSES}


def class_of(allocator: str, resource: str) -> AllocationClass:
    """The class of a GPU binding, from its allocator and its resource name."""
    for cls in CLASSES:
        if cls.allocator == allocator and cls.owns(resource):
            return cls
    raise ValueError(f"no allocation class for allocator {allocator} and resource {resource}")


def class_of_resource(resource: str) -> AllocationClass | None:
    """The class whose devices a resource name counts, if any (`cpu` and `memory` have none)."""
    for cls in CLASSES:
        if cls.owns(resource):
            return cls
    return None


__all__ = [
    "ACCOUNTED_SHARE",
    "BY_GUARANTEE",
    "CLASSES",
    "MIG",
    "WHOLE_DEVICE",
    "AllocationClass",
    "Guarantee",
    "class_of",
    "class_of_resource",
]
