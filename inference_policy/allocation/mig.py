"""MIG partitions (`nvidia.com/mig-<profile>`): an exclusive slice of one GPU, with no peer path.

A MIG binding needs the device plugin's mixed strategy, which names each slice's profile in the
resource; GFD labels each resource's product after its parent and profile, and its memory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference_policy.allocation.base import AllocationClass
from inference_policy.allocation.gfd import GFD_MIG_STRATEGY, memory_verdict, sharing
from inference_policy.base.codes import NodeVerdictCode, Verdict, refuse
from inference_policy.base.wire import MIG_RESOURCE_PREFIX

if TYPE_CHECKING:
    from inference_policy.allocation.binding_facts import BindingFacts


@dataclass(frozen=True, slots=True)
class Mig(AllocationClass):
    def node_verdict(self, binding: BindingFacts, labels: Mapping[str, str]) -> Verdict | None:
        resource = binding.allocation_key
        shape = resource.removeprefix(MIG_RESOURCE_PREFIX)
        who = f"binding {binding.id}"
        strategy = labels.get(GFD_MIG_STRATEGY)
        if strategy is None:
            return refuse(
                NodeVerdictCode.GFD_MISSING,
                f"node has no {GFD_MIG_STRATEGY} label; cannot confirm it advertises MIG slices as "
                f"{resource}",
            )
        if strategy != "mixed":
            return refuse(
                NodeVerdictCode.MIG_STRATEGY,
                f"node's MIG strategy is {strategy} ({GFD_MIG_STRATEGY}); {who} requests "
                f"{resource}, "
                "a name only the mixed strategy advertises (single advertises slices as "
                "nvidia.com/gpu)",
            )
        product_key = f"{resource}.product"
        product = labels.get(product_key)
        # GFD names a slice product <parent product>-MIG-<profile>, dropping characters that are not
        # allowed in a label value (the '+' of a media-extension profile).
        expected = "-MIG-" + re.sub(r"[^A-Za-z0-9._-]", "", shape)
        if product is None:
            return refuse(
                NodeVerdictCode.GFD_MISSING,
                f"node has no {product_key} label; cannot confirm its {shape} MIG slices",
            )
        core = product.removesuffix("-SHARED")
        if not core.endswith(expected):
            return refuse(
                NodeVerdictCode.MIG_PRODUCT,
                f"{product_key} is {product}, not a {shape} MIG slice as {who} requests",
            )
        shared = sharing(labels, f"{resource}.sharing-strategy", f"{resource}.replicas", product)
        if shared:
            return refuse(
                NodeVerdictCode.SHARED_DEVICE,
                f"node shares its {shape} MIG slices ({shared}); {who} guarantees an exclusive "
                "partition",
            )
        return memory_verdict(binding, labels, f"{resource}.memory")


MIG = Mig(
    guarantee="mig",
    allocator="extended-resource",
    rank=0,
    resources=(MIG_RESOURCE_PREFIX,),
    single_device="a MIG partition has no peer path",
)

__all__ = ["MIG", "Mig"]
