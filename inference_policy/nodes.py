"""What the extender knows about a Node, and its verdict on one: is it the hardware a signed
binding vouches for?

A Node is parsed once per revision into `NodeFacts` (its architecture, labels and allocatable
resources in the scheduler's units). The identity part of a verdict (architecture, the resource,
and what NVIDIA's GPU Feature Discovery labels say about the card and driver) does not depend on
load, so it is memoised on the facts per demand. Verdicts say whether a change of load can help:
a fact that contradicts the binding is *unresolvable* (kube-scheduler then skips preemption for
that node); too little free capacity is *resolvable*. A GPU binding on a node with no GFD labels
is refused as unresolvable: nothing confirms the accelerator the owner attested, and placing
there silently would widen the grant.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inference_policy.allocation import MIG, WHOLE_DEVICE
from inference_policy.profile import ARCH_KEY, ExtendedResourceBinding, VramPluginBinding
from inference_policy.quantity import QuantityError, resource_units
from inference_policy.verdict_codes import NodeVerdictCode
from inference_policy.wire import MIG_RESOURCE_PREFIX

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
GpuBinding = ExtendedResourceBinding | VramPluginBinding


# -- verdicts -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer; `code` is its stable class (`NodeVerdictCode`), for metrics and logs."""

    fits: bool
    reason: str | None = None
    unresolvable: bool = False
    code: NodeVerdictCode = NodeVerdictCode.FITS


FITS = Verdict(True)


def refuse(code: NodeVerdictCode, reason: str) -> Verdict:
    return Verdict(False, reason, True, code)


def busy(code: NodeVerdictCode, reason: str) -> Verdict:
    return Verdict(False, reason, False, code)


# -- nodes --------------------------------------------------------------------------------------


@dataclass(slots=True)
class NodeFacts:
    """What placement reads from a Node, parsed once per Node revision.

    `static` memoises the load-independent part of each verdict per demand, so a node that did
    not change is judged against a binding once, not once per scheduling cycle.
    """

    name: str
    arch: str | None
    labels: Mapping[str, str]
    allocatable: dict[str, int]
    version: str = ""
    static: dict[str, Verdict] = field(default_factory=dict)


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """Parse a v1.Node as the API returns it; unreadable quantities count as not advertised."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    labels_raw = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = (
        {str(k): str(v) for k, v in labels_raw.items()} if isinstance(labels_raw, Mapping) else {}
    )
    allocatable: dict[str, int] = {}
    raw = status.get("allocatable") if isinstance(status, Mapping) else None
    if isinstance(raw, Mapping):
        for name, quantity in raw.items():
            try:
                allocatable[str(name)] = resource_units(str(name), quantity)
            except QuantityError:
                continue
    name = meta.get("name") if isinstance(meta, Mapping) else None
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return NodeFacts(
        name=str(name or ""),
        arch=labels.get(ARCH_KEY),
        labels=labels,
        allocatable=allocatable,
        version=str(version or ""),
    )


# -- GPU Feature Discovery ---------------------------------------------------------------------


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    try:
        return int(value.strip(), 10)
    except ValueError:
        return None


def gfd_verdict(binding: GpuBinding, labels: Mapping[str, str]) -> Verdict | None:
    """Contradictions between GPU Feature Discovery's node labels and the binding's attestation.

    A binding attests what holds on every node of its architecture that advertises its resource
    (the lowest compute capability and CUDA driver major among them), so any such node reporting
    less contradicts the signed profile.
    """
    who = f"binding {binding.id}"
    if not any(key in labels for key in GFD_PRESENCE):
        return refuse(
            NodeVerdictCode.GFD_MISSING,
            f"node has no GPU Feature Discovery labels; cannot confirm the accelerator {who} "
            "attests",
        )
    major, minor = _int_label(labels, GFD_CC_MAJOR), _int_label(labels, GFD_CC_MINOR)
    if major is None or minor is None:
        return refuse(
            NodeVerdictCode.GFD_MISSING,
            f"node has no readable {GFD_CC_MAJOR} and {GFD_CC_MINOR} labels; cannot confirm "
            f"the compute capability {who} attests",
        )
    attested = binding.accelerator.capability_tuple
    if (major, minor) < attested:
        return refuse(
            NodeVerdictCode.COMPUTE_CAPABILITY,
            f"GPU Feature Discovery reports compute capability {major}.{minor} "
            f"({GFD_CC_MAJOR}/{GFD_CC_MINOR}); {who} attests "
            f"{binding.accelerator.computeCapability}, the lowest on its nodes",
        )
    cuda = binding.accelerator.cudaDriverMajor
    if cuda is not None:
        reported = _int_label(labels, GFD_CUDA_MAJOR)
        source = GFD_CUDA_MAJOR
        if reported is None:
            reported, source = _int_label(labels, GFD_CUDA_MAJOR_OLD), GFD_CUDA_MAJOR_OLD
        if reported is None:
            return refuse(
                NodeVerdictCode.GFD_MISSING,
                f"node has no readable {GFD_CUDA_MAJOR} label; cannot confirm the "
                f"cudaDriverMajor {cuda} {who} attests",
            )
        if reported < cuda:
            return refuse(
                NodeVerdictCode.CUDA_DRIVER,
                f"GPU Feature Discovery reports a driver for CUDA {reported} ({source}); {who} "
                f"attests cudaDriverMajor {cuda}",
            )
    if binding.allocation is MIG:
        return _mig_verdict(binding, labels)
    product = labels.get(GFD_PRODUCT, "")
    if binding.allocation is WHOLE_DEVICE:
        # Under the single strategy a MIG slice is advertised as nvidia.com/gpu; GFD then names
        # the product after the slice and adds the slice's own labels.
        if "-MIG-" in product or GFD_SLICES in labels:
            strategy = labels.get(GFD_MIG_STRATEGY, "unknown")
            return refuse(
                NodeVerdictCode.MIG_STRATEGY,
                f"node's nvidia.com/gpu devices are MIG slices ({GFD_PRODUCT}={product}, "
                f"{GFD_MIG_STRATEGY}={strategy}), not the whole GPUs {who} guarantees",
            )
        shared = _sharing(labels, GFD_SHARING, GFD_REPLICAS, product)
        if shared:
            return refuse(
                NodeVerdictCode.SHARED_DEVICE,
                f"node shares its GPUs ({shared}): an nvidia.com/gpu there is not the whole "
                f"device {who} guarantees",
            )
    return _memory_verdict(binding, labels, GFD_MEMORY)


def _sharing(labels: Mapping[str, str], strategy_key: str, replicas_key: str, product: str) -> str:
    strategy = labels.get(strategy_key, "none")
    replicas = _int_label(labels, replicas_key) or 0
    if strategy not in ("", "none") or replicas > 1 or product.endswith("-SHARED"):
        return f"{strategy_key}={strategy}, {replicas_key}={labels.get(replicas_key, '-')}"
    return ""


def _memory_verdict(binding: GpuBinding, labels: Mapping[str, str], key: str) -> Verdict | None:
    mib = _int_label(labels, key)
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


def _mig_verdict(binding: GpuBinding, labels: Mapping[str, str]) -> Verdict | None:
    resource = binding.resource.name
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
            f"node's MIG strategy is {strategy} ({GFD_MIG_STRATEGY}); {who} requests {resource}, "
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
    shared = _sharing(labels, f"{resource}.sharing-strategy", f"{resource}.replicas", product)
    if shared:
        return refuse(
            NodeVerdictCode.SHARED_DEVICE,
            f"node shares its {shape} MIG slices ({shared}); {who} guarantees an exclusive "
            "partition",
        )
    return _memory_verdict(binding, labels, f"{resource}.memory")


__all__ = [
    "FITS",
    "GFD_CUDA_MAJOR",
    "GpuBinding",
    "NodeFacts",
    "Verdict",
    "busy",
    "gfd_verdict",
    "node_facts",
    "refuse",
]
