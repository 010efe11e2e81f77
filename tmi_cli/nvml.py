"""Reading a GPU host's facts through NVML, the library nvidia-smi itself is built on.

NVML is the detector's first source: its answers are typed and versioned, where nvidia-smi's
text is not guaranteed to stay the same across drivers. This module only reads; what the facts
attest is decided in `inference_policy.tools.detection`. `probe_nvml` takes the `pynvml` module of
nvidia-ml-py or any object with its functions, so tests replay a recorded host without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

from inference_policy.tools.detection import DetectionError, GpuFacts, HostFacts

__all__ = [
    "NVML_DEVICE_MIG_ENABLE",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NvmlUnavailable",
    "import_nvml",
    "nvml_code",
    "probe_nvml",
    "start_nvml",
]

# NVML return codes are part of the library's C ABI, so they are safe to name
# here instead of reading them from whichever binding (or fake) is in use.
_NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_ENABLE = 1
_NVML_P2P_STATUS_OK = 0
# nvidia-ml-py defines NVML_P2P_CAPS_INDEX_READ with a trailing comma, which
# makes it the tuple (0,) and ctypes refuses it; the index itself is 0.
_NVML_P2P_CAPS_INDEX_READ = 0
# Older bindings lack NVML_NVLINK_MAX_LINKS; 18 is the Hopper per-GPU maximum,
# and the loop stops at the first index the GPU calls invalid anyway.
_NVML_NVLINK_MAX_LINKS_DEFAULT = 18


class NvmlUnavailable(DetectionError):
    """NVML cannot be loaded here, so the nvidia-smi fallback may answer instead."""


def import_nvml() -> Any:
    """The `pynvml` module of nvidia-ml-py; NvmlUnavailable when the package is missing, so a
    host without it still reaches the nvidia-smi fallback."""
    try:
        import pynvml  # noqa: PLC0415 - optional at run time, and slow to import
    except ImportError as err:
        raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({err})") from err
    return pynvml


def start_nvml(nvml: Any) -> type[BaseException]:
    """`nvmlInit`, and the binding's error type; NvmlUnavailable without the NVML library."""
    nvml_error: type[BaseException] = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except nvml_error as err:
        if nvml_code(err) == _NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlUnavailable(f"the NVML library is not available: {err}") from err
        raise DetectionError(f"NVML could not start: {err}") from err
    return nvml_error


def probe_nvml(nvml: Any = None) -> HostFacts:
    """Read the host's facts through NVML.

    ``nvml`` is the ``pynvml`` module of nvidia-ml-py or an object with the
    same functions; by default the module is imported here, so that a host
    without the package still reaches the nvidia-smi fallback.

    Raises NvmlUnavailable when the package or the NVML library is missing,
    and DetectionError for any other NVML failure.
    """
    nvml = nvml if nvml is not None else import_nvml()
    nvml_error = start_nvml(nvml)
    try:
        return _collect_nvml(nvml, nvml_error)
    finally:
        with suppress(nvml_error):
            nvml.nvmlShutdown()


def _collect_nvml(nvml: Any, nvml_error: type[BaseException]) -> HostFacts:
    def call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except nvml_error as err:
            raise DetectionError(f"NVML {what} failed: {err}") from err

    count = int(call("device count", nvml.nvmlDeviceGetCount))
    handles: dict[int, Any] = {}
    gpus: list[GpuFacts] = []
    for index in range(count):
        handle = call(f"handle for GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
        handles[index] = handle
        name = call(f"name of GPU {index}", nvml.nvmlDeviceGetName, handle)
        if isinstance(name, bytes):
            # Bindings before 11.515 return bytes.
            name = name.decode("utf-8", "replace")
        major, minor = call(
            f"compute capability of GPU {index}", nvml.nvmlDeviceGetCudaComputeCapability, handle
        )
        memory = call(f"memory of GPU {index}", nvml.nvmlDeviceGetMemoryInfo, handle)
        mig_capable, mig_enabled = _nvml_mig_mode(nvml, nvml_error, index, handle)
        gpus.append(
            GpuFacts(
                index=index,
                name=str(name).strip(),
                compute_capability=(int(major), int(minor)),
                mig_capable=mig_capable,
                mig_enabled=mig_enabled,
                memory_total_bytes=int(memory.total),
                nvlink_active_links=_nvml_nvlink_links(nvml, nvml_error, handle),
            )
        )

    whole = [gpu.index for gpu in gpus if not gpu.mig_enabled]
    peer_paths: dict[tuple[int, int], bool] = {}
    if len(whole) >= 2:
        for a in whole:
            for b in whole:
                if a != b:
                    peer_paths[(a, b)] = _nvml_peer_read(nvml, nvml_error, handles[a], handles[b])

    return HostFacts(
        gpus=tuple(gpus),
        cuda_driver_version=_nvml_cuda_driver_version(nvml, nvml_error),
        peer_paths=peer_paths,
        source="nvml",
    )


def nvml_code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _nvml_mig_mode(
    nvml: Any, nvml_error: type[BaseException], index: int, handle: Any
) -> tuple[bool, bool]:
    # Same test as GPU Feature Discovery: a GPU is MIG-capable when it answers
    # the MIG-mode query at all; NotSupported means it cannot be partitioned.
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml_error as err:
        if nvml_code(err) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
            return False, False
        # The mode decides which GPUs count as whole for p2p, so it cannot be guessed.
        raise DetectionError(f"NVML MIG mode of GPU {index} failed: {err}") from err
    return True, int(current) == NVML_DEVICE_MIG_ENABLE


def _nvml_nvlink_links(nvml: Any, nvml_error: type[BaseException], handle: Any) -> int:
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVML_NVLINK_MAX_LINKS_DEFAULT)
    active = 0
    for link in range(int(max_links)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml_error as err:
            code = nvml_code(err)
            if code == NVML_ERROR_NOT_SUPPORTED and link > 0:
                # A link slot the GPU does not wire up; later slots may be live.
                continue
            # NotSupported at link 0 means no NVLink at all, InvalidArgument means
            # past the GPU's last link; any other failure is no evidence of a link.
            break
        if int(state) == _NVML_FEATURE_ENABLED:
            active += 1
    return active


def _nvml_peer_read(nvml: Any, nvml_error: type[BaseException], a: Any, b: Any) -> bool:
    try:
        status = nvml.nvmlDeviceGetP2PStatus(a, b, _NVML_P2P_CAPS_INDEX_READ)
    except nvml_error:
        # A path NVML cannot confirm is not a path the claim can rest on.
        return False
    return int(status) == _NVML_P2P_STATUS_OK


def _nvml_cuda_driver_version(nvml: Any, nvml_error: type[BaseException]) -> int | None:
    # _v2 asks libcuda and fails with LibraryNotFound when libcuda is not
    # mounted into the container; the v1 call then reports the version the
    # driver supports, which is the number nvidia-smi prints in its header.
    for fn_name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        fn = getattr(nvml, fn_name, None)
        if fn is None:
            continue
        try:
            return int(fn())
        except nvml_error as err:
            if nvml_code(err) in (
                _NVML_ERROR_LIBRARY_NOT_FOUND,
                NVML_ERROR_FUNCTION_NOT_FOUND,
                NVML_ERROR_NOT_SUPPORTED,
            ):
                continue
            raise DetectionError(f"NVML CUDA driver version failed: {err}") from err
    return None
