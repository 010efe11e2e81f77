"""The fake GPU nodes the placement tests, the extender's tests and the benchmarks are run on.

Each function is one kind of node as GPU Feature Discovery and the device plugins describe it
(`localcluster.nodes.kwok.FakeNode` writes the labels and allocatable), named by the caller, so a
fleet of any size is built from the same shapes; `FLEET` is the mixed fleet the extender's
integration and fuzz tests share: one node of every shape a verdict can turn on (whole GPUs,
MIG slices under both strategies, a VRAM budget, an older GPU, an older driver, no GFD labels,
arm64, no GPU).
"""

from __future__ import annotations

from typing import Any

from localcluster.nodes.kwok import FakeNode

A100_PRODUCT = "NVIDIA-A100-SXM4-80GB"
MIG_SHAPE = "3g.40gb"


def h100(name: str, gpus: int = 8, **changes: Any) -> FakeNode:
    """An H100 80GB node (the node defaults: compute capability 9.0, CUDA 13, amd64)."""
    return _node(name, {"gpus": gpus}, changes)


def a100_mig(name: str, gpus: int = 2, slices: int = 4, **changes: Any) -> FakeNode:
    """An A100 80GB node whose GPUs are all cut into 3g.40gb MIG slices (mixed strategy)."""
    shape = {
        "gpu_product": A100_PRODUCT,
        "compute_capability": "8.0",
        "gpus": gpus,
        "mig": {MIG_SHAPE: slices},
        "whole_gpus": 0,
    }
    return _node(name, shape, changes)


def a100_single(name: str, slices: int = 2, **changes: Any) -> FakeNode:
    """An A100 under the single MIG strategy: GFD names the product after the slice, adds
    slice labels, and the slices are advertised as the MIG resource."""
    shape = {
        "gpu_product": f"{A100_PRODUCT}-MIG-{MIG_SHAPE}",
        "compute_capability": "8.0",
        "vram_gb": 40,
        "mig": {MIG_SHAPE: slices},
        "mig_strategy": "single",
        "extra_resources": {f"nvidia.com/mig-{MIG_SHAPE}": str(slices)},
        "labels": {"nvidia.com/gpu.slices.gi": "3", "nvidia.com/gpu.slices.ci": "3"},
    }
    return _node(name, shape, changes)


def l40s(name: str, **changes: Any) -> FakeNode:
    """An L40S (48 GB, compute capability 8.9) on an R570 driver, advertising a VRAM budget."""
    shape = {
        "gpu_product": "NVIDIA-L40S",
        "compute_capability": "8.9",
        "cuda_driver_major": 12,
        "cuda_driver_minor": 8,
        "driver_version": "570.86.15",
        "vram_gb": 48,
        "vram_budget": True,
    }
    return _node(name, shape, changes)


def t4(name: str, vram_gb: int = 16, **changes: Any) -> FakeNode:
    """A Tesla T4: compute capability 7.5, below what the GPU profiles ask for."""
    shape = {"gpu_product": "Tesla-T4", "compute_capability": "7.5", "vram_gb": vram_gb}
    return _node(name, shape, changes)


def r570(name: str, **changes: Any) -> FakeNode:
    """An H100 on an R570 driver (CUDA 12.8), older than the CUDA 13 the profiles ask for."""
    shape = {"cuda_driver_major": 12, "cuda_driver_minor": 8, "driver_version": "570.1.2"}
    return _node(name, shape, changes)


def gh200(name: str, gpus: int = 1, **changes: Any) -> FakeNode:
    """An arm64 node with a Hopper GPU."""
    return _node(name, {"arch": "arm64", "gpus": gpus}, changes)


def no_gfd(name: str, gpus: int = 8, **changes: Any) -> FakeNode:
    """A node advertising `nvidia.com/gpu` with none of GFD's labels."""
    return _node(name, {"gpus": 0, "extra_resources": {"nvidia.com/gpu": str(gpus)}}, changes)


def cpu_only(name: str, **changes: Any) -> FakeNode:
    """A node without GPUs."""
    return _node(name, {"gpus": 0}, changes)


def _node(name: str, shape: dict[str, Any], changes: dict[str, Any]) -> FakeNode:
    # The caller's changes win: a test varies one fact of a shape and keeps the rest.
    return FakeNode(name, **{**shape, **changes})


H100_8 = h100("h100-8a")
H100_8B = h100("h100-8b")
H100_2 = h100("h100-2", gpus=2)
A100_MIG = a100_mig("a100-mig")
L40S = l40s("l40s")
# 80 GB, so that only its compute capability can refuse it.
T4 = t4("t4", vram_gb=80)
R570 = r570("r570")
NO_GFD = no_gfd("no-gfd")
ARM = gh200("gh200")
CPU = cpu_only("cpu-1", cpu="8", memory="32Gi")
SINGLE = a100_single("a100-single")
FLEET = [H100_8, H100_8B, H100_2, A100_MIG, L40S, T4, R570, NO_GFD, ARM, CPU, SINGLE]
