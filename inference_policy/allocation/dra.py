"""Devices claimed through Dynamic Resource Allocation: a whole GPU, or a MIG partition.

The isolation is the device plugin classes' (a whole device per unit, or an exclusive slice with
no peer path) and so is the fit; what differs is who attests the hardware. No node label does:
the owner's DeviceClass for the binding selects only devices whose published attributes are the
signed facts (`inference_policy.allocation.dra_facts`), so kube-scheduler's allocation is the check,
and a node is the binding's hardware as far as placement goes when its architecture is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference_policy.allocation.base import AllocationClass
from inference_policy.allocation.whole_device import WholeDevice
from inference_policy.base.codes import Verdict

if TYPE_CHECKING:
    from inference_policy.allocation.binding_facts import BindingFacts


@dataclass(frozen=True, slots=True)
class ClaimedGpu(WholeDevice):
    def node_verdict(self, binding: BindingFacts, labels: Mapping[str, str]) -> Verdict | None:
        return None


@dataclass(frozen=True, slots=True)
class ClaimedMig(AllocationClass):
    def node_verdict(self, binding: BindingFacts, labels: Mapping[str, str]) -> Verdict | None:
        return None


DRA_GPU = ClaimedGpu(
    guarantee="whole-device", allocator="dra", rank=1, resources=(), device_type="gpu"
)
DRA_MIG = ClaimedMig(
    guarantee="mig",
    allocator="dra",
    rank=0,
    resources=(),
    single_device="a MIG partition has no peer path",
    device_type="mig",
)

__all__ = ["DRA_GPU", "DRA_MIG", "ClaimedGpu", "ClaimedMig"]
