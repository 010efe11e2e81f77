"""Reading a GPU host's facts from nvidia-smi, the fallback where NVML cannot be loaded.

nvidia-smi's own manual says its text output may change between drivers, so every parser here
finds columns by name, treats what it cannot read as absent, and refuses rather than guesses a
fact the accelerator block cannot do without. This module runs the commands and parses their
output; what the facts attest is decided in `inference_policy.tools.detection`. Commands go through
an injectable runner, so tests replay recorded output without a GPU.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from inference_policy.tools.detection import DetectionError, GpuFacts, HostFacts

__all__ = [
    "ABSENT_VALUES",
    "CommandResult",
    "NvidiaSmiUnavailable",
    "Runner",
    "parse_cuda_version",
    "parse_nvlink_status",
    "parse_p2p_matrix",
    "parse_query_gpu",
    "present",
    "probe_nvidia_smi",
    "run_command",
]

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
# What nvidia-smi prints where it has no value, in its CSV queries and its XML report alike
# (`tmi detect` and `tmi evidence` both read it through `present`).
ABSENT_VALUES = frozenset({"", "N/A", "[N/A]", "Not Supported", "[Not Supported]"})


class NvidiaSmiUnavailable(DetectionError):
    """The nvidia-smi executable is not installed or not on PATH."""


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and how it exited; tests build these from recordings."""

    returncode: int
    stdout: str
    stderr: str = ""


Runner = Callable[[Sequence[str]], CommandResult]


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
        index_text = present(values.get("index"))
        if index_text is None or not index_text.isdigit():
            raise DetectionError(f"{_NVIDIA_SMI} --query-gpu row without a GPU index: {cells}")
        index = int(index_text)
        name = present(values.get("name"))
        if name is None:
            raise DetectionError(f"{_NVIDIA_SMI} reports no name for GPU {index}")
        rows.append(
            GpuFacts(
                index=index,
                name=name,
                compute_capability=_parse_cc(values.get("compute_cap"), index),
                mig_capable=present(values.get("mig.mode.current")) is not None,
                mig_enabled=values.get("mig.mode.current") == "Enabled",
                memory_total_bytes=_parse_mib(values.get("memory.total"), index),
            )
        )
    return rows


def _column_name(cell: str) -> str:
    # "memory.total [MiB]" -> "memory.total"
    return cell.split("[", 1)[0].strip()


def present(value: str | None) -> str | None:
    """An nvidia-smi value without its surrounding whitespace (XML text keeps its indentation),
    or None where nvidia-smi printed none (`ABSENT_VALUES`)."""
    if value is None:
        return None
    value = value.strip()
    return None if value in ABSENT_VALUES else value


def _parse_cc(value: str | None, index: int) -> tuple[int, int]:
    text = present(value)
    match = re.fullmatch(r"(\d+)\.(\d+)", text or "")
    if match is None:
        raise DetectionError(
            f"{_NVIDIA_SMI} reports no compute capability for GPU {index} ({value!r})"
        )
    return int(match.group(1)), int(match.group(2))


def _parse_mib(value: str | None, index: int) -> int:
    text = present(value)
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
