"""`tmi detect`: this host's accelerator block, from NVML or else from nvidia-smi.

A GPU binding attests its hardware: the compute capability, the CUDA major the host driver
supports, and the features (bf16, fp8, mig, nvlink, p2p) an engine may require. The platform
picks images and admits tensor parallelism from these claims alone, so they must come from the
host rather than from what an owner believes the host to be. The detector runs on the GPU node
and reads the facts through NVML when the library is present (`tmi_cli.nvml`) and through
nvidia-smi otherwise (`tmi_cli.nvidia_smi`); one pure function in the core
(`inference_policy.tools.detection`) derives the block from either, so the two paths cannot disagree
about the rules.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from inference_policy.tools.detection import (
    AcceleratorBlock,
    DetectionError,
    ToolkitReport,
    accelerator_block,
    toolkit_report,
)
from tmi_cli.nvidia_smi import NvidiaSmiUnavailable, Runner, probe_nvidia_smi
from tmi_cli.nvml import NvmlUnavailable, probe_nvml

__all__ = ["TOOLKIT_CONFIG", "DetectionError", "detect_accelerator", "detect_toolkit"]

# Where the NVIDIA Container Toolkit reads its settings (the GPU Operator installs it under
# /usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml instead).
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"


def detect_accelerator(nvml: Any = None, run: Runner | None = None) -> AcceleratorBlock:
    """Detect this host's accelerator block: NVML first, nvidia-smi when NVML is absent.

    Raises DetectionError when neither source answers or the facts cannot be attested.
    """
    try:
        host = probe_nvml(nvml)
    except NvmlUnavailable as nvml_err:
        try:
            host = probe_nvidia_smi(run)
        except NvidiaSmiUnavailable as smi_err:
            raise DetectionError(
                f"cannot read the GPUs: {nvml_err}; and {smi_err}. Run the detector on the GPU "
                "node through the NVIDIA container runtime"
            ) from smi_err
    return accelerator_block(host.gpus, host.cuda_driver_version, host.peer_paths)


def detect_toolkit(path: str = TOOLKIT_CONFIG) -> ToolkitReport:
    """Read the container toolkit's config.toml (absent: its defaults apply) and report whether
    an unprivileged container's own NVIDIA_VISIBLE_DEVICES selects GPUs on this host."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return toolkit_report(None, path)
    except OSError as exc:
        raise DetectionError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DetectionError(f"{path} is not TOML: {exc}") from None
    return toolkit_report(config, path)
