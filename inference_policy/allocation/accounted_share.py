"""Accounted shares (`kamiwaza.ai/vram-gb-<n>`, the owner's VRAM plugin): a slice of one GPU's
memory, counted in whole GiB of the node's bucket, with the engine budgeting exactly its share.

Nothing in the device enforces the share; the accounting does (the extender's ledger and the
plugin's bucket), so the share is sized so that the engine's own budget holds the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference_policy.allocation.base import AllocationClass, Fit, ceil_hundredth
from inference_policy.base.quantity import GI, gib_ceil
from inference_policy.base.wire import VRAM_RESOURCE_PREFIX

if TYPE_CHECKING:
    from inference_policy.allocation.binding_facts import BindingFacts


@dataclass(frozen=True, slots=True)
class AccountedShare(AllocationClass):
    def fit(
        self, binding: BindingFacts, fraction: float | None, devices: int, need: int
    ) -> Fit | None:
        usable = binding.usable_memory_bytes
        args: dict[str, Any] = {}
        # The engine budgets `fraction` of what it is granted, so the share is sized so that its
        # budget holds the need; the share is counted in whole GiB of the plugin's bucket.
        share_gib = gib_ceil(math.ceil(need / fraction) if fraction else need)
        if share_gib * GI > usable:
            return None
        if fraction:
            args["gpu_memory_utilization"] = ceil_hundredth(fraction * share_gib * GI / usable)
        return Fit(share_gib * GI, share_gib, args)


ACCOUNTED_SHARE = AccountedShare(
    guarantee="accounted-share",
    allocator="vram-plugin",
    rank=2,
    resources=(VRAM_RESOURCE_PREFIX,),
    single_device="an accounted VRAM share is a slice of one device",
    shared_memory=True,
    isolates=False,
)

__all__ = ["ACCOUNTED_SHARE", "AccountedShare"]
