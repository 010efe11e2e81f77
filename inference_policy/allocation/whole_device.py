"""Whole devices (`nvidia.com/gpu`, `amd.com/gpu`): a plan holds its devices alone, and may span
several with a peer path.

The device plugin hands out a GPU per unit, so a node qualifies only if its units are whole
GPUs: not MIG slices advertised under the single strategy, and not time-sliced replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference_policy.allocation.base import AllocationClass, ceil_hundredth
from inference_policy.allocation.gfd import (
    GFD_MEMORY,
    GFD_MIG_STRATEGY,
    GFD_PRODUCT,
    GFD_REPLICAS,
    GFD_SHARING,
    GFD_SLICES,
    memory_verdict,
    sharing,
)
from inference_policy.base.codes import NodeVerdictCode, Verdict, refuse
from inference_policy.base.wire import WHOLE_GPU_RESOURCE

if TYPE_CHECKING:
    from inference_policy.allocation.binding_facts import BindingFacts

# NVIDIA GB10: its memory is the host's, so an engine budgets exactly the request against the
# attested usable memory rather than a fraction of a device.
GB10 = (12, 1)


@dataclass(frozen=True, slots=True)
class WholeDevice(AllocationClass):
    def node_verdict(self, binding: BindingFacts, labels: Mapping[str, str]) -> Verdict | None:
        who = f"binding {binding.id}"
        product = labels.get(GFD_PRODUCT, "")
        # Under the single strategy a MIG slice is advertised as nvidia.com/gpu; GFD then names
        # the product after the slice and adds the slice's own labels.
        if "-MIG-" in product or GFD_SLICES in labels:
            strategy = labels.get(GFD_MIG_STRATEGY, "unknown")
            return refuse(
                NodeVerdictCode.MIG_STRATEGY,
                f"node's nvidia.com/gpu devices are MIG slices ({GFD_PRODUCT}={product}, "
                f"{GFD_MIG_STRATEGY}={strategy}), not the whole GPUs {who} guarantees",
            )
        shared = sharing(labels, GFD_SHARING, GFD_REPLICAS, product)
        if shared:
            return refuse(
                NodeVerdictCode.SHARED_DEVICE,
                f"node shares its GPUs ({shared}): an nvidia.com/gpu there is not the whole "
                f"device {who} guarantees",
            )
        return memory_verdict(binding, labels, GFD_MEMORY)

    def budget_fits(
        self,
        binding: BindingFacts,
        fraction: float,
        need: int,
        request: int,
        args: dict[str, Any],
    ) -> bool:
        if binding.accelerator.capability_tuple != GB10:
            return AllocationClass.budget_fits(self, binding, fraction, need, request, args)
        usable = binding.usable_memory_bytes
        if request > usable:
            return False
        args["gpu_memory_utilization"] = ceil_hundredth(request / usable)
        return True


WHOLE_DEVICE = WholeDevice(
    guarantee="whole-device",
    allocator="extended-resource",
    rank=1,
    resources=(WHOLE_GPU_RESOURCE, "amd.com/gpu"),
)

__all__ = ["GB10", "WHOLE_DEVICE", "WholeDevice"]
