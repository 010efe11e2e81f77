"""The node labels NVIDIA's GPU Feature Discovery writes, and the readings placement makes of them.

The extender cannot see a card; GFD's labels are the only independent account of what a node
carries, so every allocation class's node checks read them through these helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from inference_policy.base.codes import NodeVerdictCode, Verdict, refuse

if TYPE_CHECKING:
    from inference_policy.allocation.binding_facts import BindingFacts

# GPU Feature Discovery label names (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery).
GFD_CC_MAJOR = "nvidia.com/gpu.compute.major"
GFD_CC_MINOR = "nvidia.com/gpu.compute.minor"
# The CUDA version the driver supports (NVML's CUDA driver version: 13 on R580). The similarly
# named `cuda.driver.major` / `cuda.driver-version.major` carry the kernel driver's release
# (580), which is not what `cudaDriverMajor` attests.
GFD_CUDA_MAJOR = "nvidia.com/cuda.runtime-version.major"
GFD_CUDA_MAJOR_OLD = "nvidia.com/cuda.runtime.major"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_REPLICAS = "nvidia.com/gpu.replicas"
GFD_SHARING = "nvidia.com/gpu.sharing-strategy"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"
GFD_SLICES = "nvidia.com/gpu.slices.gi"
GFD_PRESENCE = (GFD_CC_MAJOR, GFD_CC_MINOR, GFD_PRODUCT, GFD_CUDA_MAJOR, GFD_MIG_STRATEGY)
MIB = 1024 * 1024


def int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    try:
        return int(value.strip(), 10)
    except ValueError:
        return None


def sharing(labels: Mapping[str, str], strategy_key: str, replicas_key: str, product: str) -> str:
    strategy = labels.get(strategy_key, "none")
    replicas = int_label(labels, replicas_key) or 0
    if strategy not in ("", "none") or replicas > 1 or product.endswith("-SHARED"):
        return f"{strategy_key}={strategy}, {replicas_key}={labels.get(replicas_key, '-')}"
    return ""


def memory_verdict(binding: BindingFacts, labels: Mapping[str, str], key: str) -> Verdict | None:
    mib = int_label(labels, key)
    if mib is None or mib <= 0:
        # GFD omits the label when NVML reports no memory (unified-memory parts).
        return None
    usable = binding.usable_memory_bytes
    if mib * MIB < usable:
        return refuse(
            NodeVerdictCode.MEMORY,
            f"GPU Feature Discovery reports {mib} MiB per device ({key}); {binding.id} "
            f"attests {binding.capacity_memory} usable",
        )
    return None
