"""The allocation classes, registered: the seam a new class is added at.

A binding's allocation class is how its devices are handed out: a whole device, a MIG partition,
or a share of an accounted VRAM bucket, counted by a device plugin; or a whole GPU or a MIG
partition claimed through Dynamic Resource Allocation. The profile (which guarantee a binding
gives), the planner (which classes a request may use, in which order, how many devices a plan
may span, how the request becomes a quantity), placement (the verdict code of a full or
too-small node) and the node checks (what GFD's labels must say) ask the binding's class, never
a resource-name prefix or a binding's concrete type. A new class is one module here, registered
in `CLASSES`, plus its binding model in `profile`
(tests/unit/core/allocation/test_allocation_seam.py lists the files a new class touches).

Beside the classes, the two accounts of hardware their checks and the profile read: the node
labels NVIDIA's GPU Feature Discovery writes (`gfd`), and a DRA binding's device facts as the
driver publishes them (`dra_facts`).

A class reads a binding through `binding_facts.BindingFacts`, a Protocol the profile's binding
models satisfy, never the models themselves: the profile asks a binding's class, so the classes
importing the profile back would knot the two together.

May import: the base only. Trust (the profile) and every part above it import it.
"""

from __future__ import annotations

from functools import lru_cache

from inference_policy.allocation.accounted_share import ACCOUNTED_SHARE
from inference_policy.allocation.base import AllocationClass, Fit, Guarantee
from inference_policy.allocation.dra import DRA_GPU, DRA_MIG
from inference_policy.allocation.mig import MIG
from inference_policy.allocation.whole_device import WHOLE_DEVICE

CLASSES: tuple[AllocationClass, ...] = (MIG, WHOLE_DEVICE, ACCOUNTED_SHARE, DRA_MIG, DRA_GPU)


def class_of(allocator: str, key: str) -> AllocationClass:
    """The class of a GPU binding, from its allocator and its resource name (or, for a DRA
    binding, its device type)."""
    for cls in CLASSES:
        if cls.allocator == allocator and (
            cls.owns(key) or (cls.claimed and cls.device_type == key)
        ):
            return cls
    raise ValueError(f"no allocation class for allocator {allocator} and resource {key}")


# Placement asks this for every node a Pod does not fit on now; resource names are few.
@lru_cache(maxsize=1024)
def class_of_resource(resource: str) -> AllocationClass | None:
    """The class whose devices a resource name counts, if any (`cpu` and `memory` have none)."""
    for cls in CLASSES:
        if cls.owns(resource):
            return cls
    return None


__all__ = [
    "ACCOUNTED_SHARE",
    "CLASSES",
    "DRA_GPU",
    "DRA_MIG",
    "MIG",
    "WHOLE_DEVICE",
    "AllocationClass",
    "Fit",
    "Guarantee",
    "class_of",
    "class_of_resource",
]
