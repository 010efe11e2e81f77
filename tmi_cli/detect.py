"""Detect a GPU host's facts for the accelerator block of a signed profile.

A GPU binding attests its hardware: the compute capability, the CUDA major the
host driver supports, and the features (bf16, fp8, mig, nvlink, p2p) an engine
may require. The platform picks images and admits tensor parallelism from
these claims alone, so they must come from the host rather than from what an
owner believes the host to be. This module reads them on the GPU node, through
NVML when the library is present and through ``nvidia-smi`` otherwise, and
derives the block with one pure function that both sources share, so the two
paths cannot disagree about the rules.

A claim is made only on positive evidence: a feature probe that cannot answer
leaves the feature out. Facts that the block cannot do without (the GPUs, their
model and compute capability, the driver's CUDA major) are refused with a
:class:`DetectionError` instead of guessed.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, TypedDict

__all__ = [
    "AcceleratorBlock",
    "AcceleratorFields",
    "CommandResult",
    "DetectionError",
    "GpuFacts",
    "HostFacts",
    "NvidiaSmiUnavailable",
    "NvmlUnavailable",
    "PeerPaths",
    "Runner",
    "accelerator_block",
    "detect_accelerator",
    "format_block",
    "parse_cuda_version",
    "parse_nvlink_status",
    "parse_p2p_matrix",
    "parse_query_gpu",
    "probe_nvidia_smi",
    "probe_nvml",
    "run_command",
]

CUDA_MAJOR_MIN = 11
CUDA_MAJOR_MAX = 99

# Hardware rules from the Transformer Engine support matrix: bf16 arrived with
# Ampere (8.0) and fp8 with Ada (8.9). 8.6 and 8.7 are Ampere parts without fp8.
BF16_MIN_CC = (8, 0)
FP8_MIN_CC = (8, 9)

# NVML return codes are part of the library's C ABI, so they are safe to name
# here instead of reading them from whichever binding (or fake) is in use.
_NVML_ERROR_INVALID_ARGUMENT = 2
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_FEATURE_ENABLED = 1
_NVML_DEVICE_MIG_ENABLE = 1
_NVML_P2P_STATUS_OK = 0
# nvidia-ml-py defines NVML_P2P_CAPS_INDEX_READ with a trailing comma, which
# makes it the tuple (0,) and ctypes refuses it; the index itself is 0.
_NVML_P2P_CAPS_INDEX_READ = 0
# Older bindings lack NVML_NVLINK_MAX_LINKS; 18 is the Hopper per-GPU maximum,
# and the loop stops at the first index the GPU calls invalid anyway.
_NVML_NVLINK_MAX_LINKS_DEFAULT = 18

_NVIDIA_SMI = "nvidia-smi"
_QUERY_FIELDS = ("index", "name", "compute_cap", "mig.mode.current", "memory.total")
_COMMAND_TIMEOUT_S = 60.0

_CUDA_VERSION_RE = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_GPU_LABEL_RE = re.compile(r"GPU(\d+)")
_NVLINK_GPU_RE = re.compile(r"^GPU\s+(\d+)\s*:")
# Only a bandwidth figure proves a link is up: "<inactive>", "N/A" or a status
# string a future driver invents must not count as a working link.
_NVLINK_ACTIVE_RE = re.compile(r"^\s*Link\s+\d+\s*:\s*\d+(?:\.\d+)?\s*[KMGT]?B/s", re.IGNORECASE)
_ABSENT_VALUES = frozenset({"", "N/A", "[N/A]", "Not Supported", "[Not Supported]"})


class DetectionError(Exception):
    """The host's facts cannot be attested; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class NvmlUnavailable(DetectionError):
    """NVML cannot be loaded here, so the nvidia-smi fallback may answer instead."""


class NvidiaSmiUnavailable(DetectionError):
    """The nvidia-smi executable is not installed or not on PATH."""


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


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str = ""


Runner = Callable[[Sequence[str]], CommandResult]


# --------------------------------------------------------------------------
# The rules


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


def format_block(block: AcceleratorBlock) -> str:
    """Render the block the way the detector prints it: two-space indent, sorted keys."""
    return json.dumps(block, indent=2, sort_keys=True) + "\n"


# --------------------------------------------------------------------------
# NVML


def probe_nvml(nvml: Any = None) -> HostFacts:
    """Read the host's facts through NVML.

    ``nvml`` is the ``pynvml`` module of nvidia-ml-py or an object with the
    same functions; by default the module is imported here, so that a host
    without the package still reaches the nvidia-smi fallback.

    Raises NvmlUnavailable when the package or the NVML library is missing,
    and DetectionError for any other NVML failure.
    """
    if nvml is None:
        try:
            import pynvml  # noqa: PLC0415 - optional at run time, and slow to import
        except ImportError as err:
            raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({err})") from err
        nvml = pynvml
    nvml_error: type[BaseException] = nvml.NVMLError

    try:
        nvml.nvmlInit()
    except nvml_error as err:
        if _nvml_code(err) == _NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlUnavailable(f"the NVML library is not available: {err}") from err
        raise DetectionError(f"NVML could not start: {err}") from err
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


def _nvml_code(err: BaseException) -> int | None:
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
        if _nvml_code(err) in (_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_FUNCTION_NOT_FOUND):
            return False, False
        # The mode decides which GPUs count as whole for p2p, so it cannot be guessed.
        raise DetectionError(f"NVML MIG mode of GPU {index} failed: {err}") from err
    return True, int(current) == _NVML_DEVICE_MIG_ENABLE


def _nvml_nvlink_links(nvml: Any, nvml_error: type[BaseException], handle: Any) -> int:
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVML_NVLINK_MAX_LINKS_DEFAULT)
    active = 0
    for link in range(int(max_links)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml_error as err:
            code = _nvml_code(err)
            if code == _NVML_ERROR_NOT_SUPPORTED and link > 0:
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
            if _nvml_code(err) in (
                _NVML_ERROR_LIBRARY_NOT_FOUND,
                _NVML_ERROR_FUNCTION_NOT_FOUND,
                _NVML_ERROR_NOT_SUPPORTED,
            ):
                continue
            raise DetectionError(f"NVML CUDA driver version failed: {err}") from err
    return None


# --------------------------------------------------------------------------
# nvidia-smi


def run_command(args: Sequence[str]) -> CommandResult:
    """Run a command with the C locale and a timeout; the default runner.

    Raises FileNotFoundError when the executable is missing.
    """
    env = dict(os.environ, LC_ALL="C")
    try:
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise DetectionError(
            f"{' '.join(args)} did not finish within {_COMMAND_TIMEOUT_S:.0f}s"
        ) from err
    return CommandResult(done.returncode, done.stdout, done.stderr)


def probe_nvidia_smi(run: Runner | None = None) -> HostFacts:
    """Read the host's facts from nvidia-smi's output.

    ``run`` takes an argument vector and returns a CommandResult; tests feed
    recorded output through it. Raises NvidiaSmiUnavailable when nvidia-smi is
    not installed and DetectionError when its output cannot be trusted.
    """
    runner = run if run is not None else run_command

    def smi(*args: str) -> CommandResult:
        try:
            return runner([_NVIDIA_SMI, *args])
        except FileNotFoundError as err:
            raise NvidiaSmiUnavailable(f"{_NVIDIA_SMI} is not installed: {err}") from err

    query = smi(f"--query-gpu={','.join(_QUERY_FIELDS)}", "--format=csv,nounits")
    if query.returncode != 0:
        detail = _first_line(query.stderr) or _first_line(query.stdout)
        if "not a valid field" in (query.stdout + query.stderr):
            raise DetectionError(
                f"{_NVIDIA_SMI} cannot report the compute capability on this driver ({detail}); "
                "upgrade the driver or install nvidia-ml-py"
            )
        raise DetectionError(f"{_NVIDIA_SMI} --query-gpu exited {query.returncode}: {detail}")
    rows = parse_query_gpu(query.stdout)

    cuda_driver_version = _smi_cuda_driver_version(smi)

    nvlink = smi("nvlink", "-s")
    # Hosts without NVLink may print nothing or fail this query; neither is a link.
    links = parse_nvlink_status(nvlink.stdout) if nvlink.returncode == 0 else {}

    whole = [row for row in rows if not row.mig_enabled]
    peer_paths: dict[tuple[int, int], bool] = {}
    if len(whole) >= 2:
        topo = smi("topo", "-p2p", "r")
        if topo.returncode == 0:
            peer_paths = parse_p2p_matrix(topo.stdout)

    gpus = tuple(replace(row, nvlink_active_links=links.get(row.index, 0)) for row in rows)
    return HostFacts(
        gpus=gpus,
        cuda_driver_version=cuda_driver_version,
        peer_paths=peer_paths,
        source="nvidia-smi",
    )


def _smi_cuda_driver_version(smi: Callable[..., CommandResult]) -> int | None:
    banner = smi()
    if banner.returncode == 0:
        version = parse_cuda_version(banner.stdout)
        if version is not None:
            return version
    # Some drivers print "CUDA Version: N/A" in the banner while the XML report
    # still carries it; both come from the same NVML call.
    report = smi("-q", "-x")
    if report.returncode != 0:
        return None
    return _cuda_version_from_xml(report.stdout)


def parse_cuda_version(text: str) -> int | None:
    """Find "CUDA Version: 13.0" (banner) or "CUDA Version : 13.0" (--version).

    Returns the NVML encoding (13000), or None when no version is printed.
    """
    match = _CUDA_VERSION_RE.search(text)
    if match is None:
        return None
    return int(match.group(1)) * 1000 + int(match.group(2)) * 10


def _cuda_version_from_xml(text: str) -> int | None:
    try:
        # The document comes from the local nvidia-smi, and expat neither
        # fetches its external DTD nor expands external entities.
        root = ET.fromstring(text)  # noqa: S314
    except ET.ParseError:
        return None
    value = root.findtext("cuda_version")
    return parse_cuda_version(f"CUDA Version: {value.strip()}") if value else None


def parse_query_gpu(text: str) -> list[GpuFacts]:
    """Parse ``--query-gpu=... --format=csv`` output with its header row.

    Columns are found by name, so extra columns and unit suffixes (with or
    without ``nounits``) do not matter; the header is what makes that safe
    across driver versions that reorder or add fields.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise DetectionError(f"{_NVIDIA_SMI} --query-gpu printed nothing")
    reader = csv.reader(lines, skipinitialspace=True)
    header = [_column_name(cell) for cell in next(reader)]
    missing = [name for name in _QUERY_FIELDS if name not in header]
    if missing:
        raise DetectionError(
            f"{_NVIDIA_SMI} --query-gpu output lacks the column(s) {', '.join(missing)}"
        )
    rows: list[GpuFacts] = []
    for cells in reader:
        values = dict(zip(header, (cell.strip() for cell in cells), strict=False))
        index_text = _present(values.get("index"))
        if index_text is None or not index_text.isdigit():
            raise DetectionError(f"{_NVIDIA_SMI} --query-gpu row without a GPU index: {cells}")
        index = int(index_text)
        name = _present(values.get("name"))
        if name is None:
            raise DetectionError(f"{_NVIDIA_SMI} reports no name for GPU {index}")
        rows.append(
            GpuFacts(
                index=index,
                name=name,
                compute_capability=_parse_cc(values.get("compute_cap"), index),
                mig_capable=_present(values.get("mig.mode.current")) is not None,
                mig_enabled=values.get("mig.mode.current") == "Enabled",
                memory_total_bytes=_parse_mib(values.get("memory.total"), index),
            )
        )
    return rows


def _column_name(cell: str) -> str:
    # "memory.total [MiB]" -> "memory.total"
    return cell.split("[", 1)[0].strip()


def _present(value: str | None) -> str | None:
    return None if value is None or value in _ABSENT_VALUES else value


def _parse_cc(value: str | None, index: int) -> tuple[int, int]:
    text = _present(value)
    match = re.fullmatch(r"(\d+)\.(\d+)", text or "")
    if match is None:
        raise DetectionError(
            f"{_NVIDIA_SMI} reports no compute capability for GPU {index} ({value!r})"
        )
    return int(match.group(1)), int(match.group(2))


def _parse_mib(value: str | None, index: int) -> int:
    text = _present(value)
    match = re.fullmatch(r"(\d+)(?:\s*MiB)?", text or "")
    if match is None:
        raise DetectionError(f"{_NVIDIA_SMI} reports no total memory for GPU {index} ({value!r})")
    return int(match.group(1)) * 1024 * 1024


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], bool]:
    """Parse ``nvidia-smi topo -p2p r``: (row GPU, column GPU) -> cell is OK.

    The header row carries ANSI underline codes even when stdout is a file.
    Cells other than OK (CNS, GNS, TNS, NS, U) and the X diagonal are not paths.
    """
    lines = [_ANSI_RE.sub("", line) for line in text.splitlines()]
    columns: list[int | None] | None = None
    paths: dict[tuple[int, int], bool] = {}
    for line in lines:
        cells = [cell.strip() for cell in line.split("\t")]
        if columns is None:
            labels = [cell for cell in cells if cell]
            # NIC columns, where a driver adds them, are kept as placeholders.
            if labels and _GPU_LABEL_RE.fullmatch(labels[0]):
                columns = [_gpu_label(label) for label in labels]
            continue
        if not line.strip() or line.strip().startswith("Legend"):
            break
        row = _gpu_label(cells[0]) if cells else None
        if row is None:
            continue
        for column, cell in zip(columns, cells[1:], strict=False):
            if column is not None and column != row:
                paths[(row, column)] = cell == "OK"
    return paths


def _gpu_label(label: str) -> int | None:
    match = _GPU_LABEL_RE.fullmatch(label)
    return int(match.group(1)) if match else None


def parse_nvlink_status(text: str) -> dict[int, int]:
    """Parse ``nvidia-smi nvlink -s``: GPU index -> count of links that show a bandwidth."""
    links: dict[int, int] = {}
    gpu: int | None = None
    for line in text.splitlines():
        header = _NVLINK_GPU_RE.match(line)
        if header is not None:
            gpu = int(header.group(1))
            links.setdefault(gpu, 0)
            continue
        if gpu is not None and _NVLINK_ACTIVE_RE.match(line):
            links[gpu] += 1
    return links


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


# --------------------------------------------------------------------------
# Entry point


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
