"""Fakes of NVML and nvidia-smi for the detector's tests, answering from recorded output.

The H200 recording (tests/fixtures/gpu/h200-1x) is replayed as it was captured; multi-GPU hosts
are synthetic, in the same shapes as that recording. `gpu` builds the facts the core's rules
take directly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from inference_policy.tools.detection import GpuFacts
from tmi_cli.host_probe import sections as capture_sections
from tmi_cli.nvidia_smi import CommandResult

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu" / "h200-1x"

H200_BLOCK = {
    "accelerator": {
        "computeCapability": "9.0",
        "cudaDriverMajor": 13,
        "features": ["bf16", "fp8", "mig"],
        "vendor": "nvidia",
    }
}


def sections(name: str) -> dict[str, str]:
    """A capture file's "== <command>" sections, read as `tmi detect --from` reads them."""
    return capture_sections(FIXTURE / name)


def nvml_dump() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURE / "nvml.json").read_text())
    return loaded


_ERROR_CODES = {
    "NotSupported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "InvalidArgument": pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "LibraryNotFound": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "DriverNotLoaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "FunctionNotFound": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    "NoPermission": pynvml.NVML_ERROR_NO_PERMISSION,
    "GpuIsLost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "NotFound": pynvml.NVML_ERROR_NOT_FOUND,
}


def recorded(value: Any) -> Any:
    """Return a recorded value, or raise the NVMLError that was recorded instead."""
    if isinstance(value, str) and value.startswith("ERR NVMLError_"):
        name = value.removeprefix("ERR NVMLError_").split(":", 1)[0]
        raise pynvml.NVMLError(_ERROR_CODES[name])
    return value


class FakeNvml:
    """The pynvml functions the detector uses, answering from an nvml.json dump.

    Errors are the real binding's NVMLError classes, so `except` clauses are
    exercised exactly as on a host. Handles are the device indices.
    """

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(self, dump: dict[str, Any], init: str | None = None) -> None:
        self.dump = dump
        self.init = init
        self.shutdowns = 0
        self.p2p_queries: list[tuple[int, int, Any]] = []

    def _device(self, handle: int) -> dict[str, Any]:
        device: dict[str, Any] = self.dump["devices"][handle]
        return device

    def nvmlInit(self) -> None:
        recorded(self.init)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return int(self.dump["count"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        assert 0 <= index < len(self.dump["devices"])
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return recorded(self._device(handle)["name"])

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._device(handle)["cc"]
        return major, minor

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(**self._device(handle)["memory"])

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        mode: list[int] = recorded(self._device(handle)["migMode"])
        return mode

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        # A link index past the ones recorded is past the GPU's links.
        state = self._device(handle)["nvlink"].get(
            str(link), "ERR NVMLError_InvalidArgument: Invalid Argument"
        )
        return int(recorded(state))

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: Any) -> int:
        self.p2p_queries.append((a, b, index))
        status = self.dump.get("p2pRead", {}).get(str(a), {}).get(str(b), 5)
        return int(recorded(status))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return int(recorded(self.dump["cudaDriverVersion"]))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(
            recorded(
                self.dump.get("cudaDriverVersionV1", "ERR NVMLError_FunctionNotFound: Not Found")
            )
        )


def device(
    index: int,
    name: str = "NVIDIA A100-SXM4-80GB",
    cc: tuple[int, int] = (8, 0),
    mig: Any = (0, 0),
    nvlink: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "cc": list(cc),
        "memory": {"total": 85899345920, "free": 85899345920, "used": 0},
        "migMode": list(mig) if isinstance(mig, tuple) else mig,
        "nvlink": nvlink if nvlink is not None else {"0": "ERR NVMLError_NotSupported: x"},
    }


def host_dump(*devices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"cudaDriverVersion": 13000, "count": len(devices), "devices": list(devices), **extra}


class FakeSmi:
    """nvidia-smi answering from recorded text, keyed by its arguments."""

    def __init__(self, answers: dict[tuple[str, ...], CommandResult], query: CommandResult) -> None:
        self.answers = answers
        self.query = query
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, args: Sequence[str]) -> CommandResult:
        assert args[0] == "nvidia-smi"
        self.calls.append(tuple(args[1:]))
        if args[1:] and args[1].startswith("--query-gpu="):
            return self.query
        return self.answers.get(tuple(args[1:]), CommandResult(0, ""))


def ok(text: str) -> CommandResult:
    return CommandResult(0, text)


def h200_smi() -> FakeSmi:
    extra = sections("nvidia-smi-extra.txt")
    return FakeSmi(
        {
            (): ok(sections("nvidia-smi.txt")["nvidia-smi"]),
            ("-q", "-x"): ok((FIXTURE / "nvidia-smi-q.xml").read_text()),
            ("nvlink", "-s"): ok(extra["nvlink -s"]),
            ("topo", "-p2p", "r"): ok(extra["topo -p2p r"]),
        },
        query=ok(extra["query-gpu"]),
    )


def gpu(
    index: int,
    name: str = "NVIDIA A100-SXM4-80GB",
    *,
    cc: tuple[int, int] = (8, 0),
    mig_capable: bool = False,
    mig_enabled: bool = False,
    links: int = 0,
) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=name,
        compute_capability=cc,
        mig_capable=mig_capable or mig_enabled,
        mig_enabled=mig_enabled,
        memory_total_bytes=80 * 1024**3,
        nvlink_active_links=links,
    )


def full_mesh(*indices: int) -> dict[tuple[int, int], bool]:
    return {(a, b): True for a in indices for b in indices if a != b}


def features(block: Any) -> list[str]:
    found: list[str] = block["accelerator"]["features"]
    return found
