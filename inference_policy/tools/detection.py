"""What a GPU host's accelerator block attests, derived from the facts read on the host.

The block is a claim the rest of the system relies on without looking again: the planner picks
images by `cudaDriverMajor` and admits an engine's required features (bf16, fp8, mig, nvlink,
p2p), and the extender matches `computeCapability` against GPU Feature Discovery's labels. Which
facts justify which claim is therefore a decision, and it lives here with the other decisions,
free of I/O: `tmi detect` reads the facts through NVML or nvidia-smi (`tmi_cli.nvml`,
`tmi_cli.nvidia_smi`) and hands them in as values, so both sources are held to one set of rules
and the rules are tested without a GPU.

A claim is made only on positive evidence: a feature the facts do not show is left out. Facts
the block cannot do without (the GPUs, their model and compute capability, the driver's CUDA
major) are refused with a :class:`DetectionError` instead of guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, TypedDict

__all__ = [
    "BF16_MIN_CC",
    "CUDA_MAJOR_MAX",
    "CUDA_MAJOR_MIN",
    "FP8_MIN_CC",
    "AcceleratorBlock",
    "AcceleratorFields",
    "DetectionError",
    "GpuFacts",
    "HostFacts",
    "PeerPaths",
    "accelerator_block",
    "format_block",
]

# The bounds the profile schema accepts for cudaDriverMajor.
CUDA_MAJOR_MIN = 11
CUDA_MAJOR_MAX = 99

# Hardware rules from the Transformer Engine support matrix: bf16 arrived with
# Ampere (8.0) and fp8 with Ada (8.9). 8.6 and 8.7 are Ampere parts without fp8.
BF16_MIN_CC = (8, 0)
FP8_MIN_CC = (8, 9)


class DetectionError(Exception):
    """The host's facts cannot be attested; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class GpuFacts:
    """What the rules need to know about one physical GPU."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    mig_capable: bool
    mig_enabled: bool
    memory_total_bytes: int
    nvlink_active_links: int = 0


# Directed: (reader, target) -> whether the reader has a peer read path to the
# target. A pair counts as peered only when both directions say so.
PeerPaths = Mapping[tuple[int, int], bool]


@dataclass(frozen=True)
class HostFacts:
    """Everything one probe learned about the host, before any rule is applied."""

    gpus: tuple[GpuFacts, ...]
    # Encoded as NVML encodes it: major * 1000 + minor * 10 (13000 is CUDA 13.0).
    cuda_driver_version: int | None
    peer_paths: PeerPaths = field(default_factory=dict)
    source: str = ""


class AcceleratorFields(TypedDict):
    computeCapability: str
    cudaDriverMajor: int
    features: list[str]
    vendor: str


class AcceleratorBlock(TypedDict):
    accelerator: AcceleratorFields


def accelerator_block(
    gpus: Sequence[GpuFacts],
    cuda_driver_version: int | None,
    peer_paths: PeerPaths | None = None,
) -> AcceleratorBlock:
    """Derive the accelerator block from a host's GPUs, driver and peer paths.

    Raises DetectionError when the host has no GPU, has two kinds of GPU, or
    when the driver's CUDA major cannot be read or is out of range.
    """
    if not gpus:
        raise DetectionError(
            "no NVIDIA GPU is visible; run the detector on the GPU node with its GPUs visible "
            "(NVIDIA_VISIBLE_DEVICES=all)"
        )
    first = gpus[0]
    for gpu in gpus[1:]:
        if gpu.name != first.name or gpu.compute_capability != first.compute_capability:
            # A binding selects nodes, not GPUs, so no block can describe both kinds.
            raise DetectionError(
                "this host has two kinds of GPU: "
                f"{first.name!r} (compute capability {_cc(first.compute_capability)}) and "
                f"{gpu.name!r} (compute capability {_cc(gpu.compute_capability)}); "
                "a binding cannot single out one kind, so keep this node out of tenant-mode "
                "GPU serving"
            )
    cc = first.compute_capability
    if cc[0] < 1 or cc[1] < 0:
        raise DetectionError(f"{first.name!r} reports an invalid compute capability {_cc(cc)}")

    features: set[str] = set()
    if cc >= BF16_MIN_CC:
        features.add("bf16")
    if cc >= FP8_MIN_CC:
        features.add("fp8")
    # Informational: the GPUs can be partitioned, whether or not they are now.
    if any(gpu.mig_capable for gpu in gpus):
        features.add("mig")
    # A whole-device binding is never given a MIG-mode GPU, so only whole GPUs
    # can make or break a claim that the binding's devices have these links.
    whole = [gpu for gpu in gpus if not gpu.mig_enabled]
    if whole and all(gpu.nvlink_active_links > 0 for gpu in whole):
        features.add("nvlink")
    if _all_pairs_peered(whole, peer_paths or {}):
        features.add("p2p")

    return {
        "accelerator": {
            "computeCapability": _cc(cc),
            "cudaDriverMajor": _cuda_driver_major(cuda_driver_version),
            "features": sorted(features),
            "vendor": "nvidia",
        }
    }


def _all_pairs_peered(whole: Sequence[GpuFacts], peer_paths: PeerPaths) -> bool:
    # The device plugin may hand a multi-GPU request any whole GPUs, so one
    # missing pair anywhere makes tensor parallelism unsafe on this node.
    if len(whole) < 2:
        return False
    return all(
        peer_paths.get((a.index, b.index), False) and peer_paths.get((b.index, a.index), False)
        for a, b in combinations(whole, 2)
    )


def _cuda_driver_major(version: int | None) -> int:
    if version is None or version <= 0:
        raise DetectionError(
            "cannot read the CUDA version the NVIDIA driver supports, so cudaDriverMajor "
            "cannot be attested; the detector does not guess it"
        )
    major = version // 1000
    if not CUDA_MAJOR_MIN <= major <= CUDA_MAJOR_MAX:
        raise DetectionError(
            f"the driver reports CUDA {major}.{(version % 1000) // 10}; cudaDriverMajor must be "
            f"from {CUDA_MAJOR_MIN} to {CUDA_MAJOR_MAX}"
        )
    return major


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


# NVIDIA Container Toolkit settings (config.toml, top level) that decide whether an unprivileged
# container's own NVIDIA_VISIBLE_DEVICES (from its image or its spec) selects GPUs.
TOOLKIT_ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
TOOLKIT_MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"


class ToolkitReport(TypedDict):
    configFile: str
    configFound: bool
    acceptEnvvarWhenUnprivileged: bool
    acceptVolumeMounts: bool
    imageEnvironmentSelectsGpus: bool


def toolkit_report(config: Mapping[str, Any] | None, path: str) -> ToolkitReport:
    """What the host's container toolkit does with a container's NVIDIA_VISIBLE_DEVICES.

    With the toolkit's defaults (no file, or the keys absent) an unprivileged container's
    variable is obeyed, so a CUDA image's own `NVIDIA_VISIBLE_DEVICES=all` hands it every GPU on
    a node whose default runtime is NVIDIA's: the webhook's `NVIDIA_VISIBLE_DEVICES=void` shield
    is then what keeps such a container off the GPUs. With the variable refused for unprivileged
    containers (and the device plugin handing devices out as volume mounts) the node closes the
    path itself.
    """
    values = config or {}
    envvar = values.get(TOOLKIT_ENVVAR_KEY, True)
    mounts = values.get(TOOLKIT_MOUNTS_KEY, False)
    if not isinstance(envvar, bool) or not isinstance(mounts, bool):
        raise DetectionError(
            f"{path}: {TOOLKIT_ENVVAR_KEY} and {TOOLKIT_MOUNTS_KEY} must be true or false"
        )
    return {
        "configFile": path,
        "configFound": config is not None,
        "acceptEnvvarWhenUnprivileged": envvar,
        "acceptVolumeMounts": mounts,
        "imageEnvironmentSelectsGpus": envvar,
    }


def format_block(block: AcceleratorBlock) -> str:
    """Render the block the way the detector prints it: two-space indent, sorted keys."""
    return json.dumps(block, indent=2, sort_keys=True) + "\n"
