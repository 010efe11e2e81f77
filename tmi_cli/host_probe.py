"""The host facts `tmi detect --host` reports, read from nvidia-smi, live or from a capture.

`tools/gpu-capture.sh DIR` records a GPU host's raw tool output; `tmi detect --from DIR`
answers every nvidia-smi question the detector asks from that recording (`Capture`), so an
owner without the GPU at hand (or a test) gets what the host would have said. The facts become
documents in the core (`inference_policy.tools.host_facts`); this only runs and reads the tool.
"""

from __future__ import annotations

import csv
import os
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from inference_policy.tools.detection import DetectionError
from inference_policy.tools.host_facts import HostGpu
from tmi_cli.nvidia_smi import CommandResult, parse_cuda_version, present

HOST_FIELDS = (
    "index",
    "uuid",
    "name",
    "compute_cap",
    "driver_version",
    "memory.total",
    "memory.reserved",
    "mig.mode.current",
)
_PROFILE_RE = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+\d+\s")
_NUMBER_RE = re.compile(r"(\d+)")
Smi = Callable[..., CommandResult]


class Capture:
    """nvidia-smi, answered from a `tools/gpu-capture.sh` directory."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        if not (self.directory / "nvidia-smi-extra.txt").is_file():
            raise DetectionError(
                f"{directory} is not a capture of tools/gpu-capture.sh (no nvidia-smi-extra.txt)"
            )
        self.sections = {
            **sections(self.directory / "nvidia-smi.txt"),
            **sections(self.directory / "nvidia-smi-extra.txt"),
        }

    def __call__(self, args: Sequence[str]) -> CommandResult:
        rest = tuple(args[1:])
        if rest and rest[0].startswith("--query-gpu="):
            key = "query-gpu"
        elif rest == ("-q", "-x"):
            path = self.directory / "nvidia-smi-q.xml"
            return CommandResult(0, path.read_text()) if path.is_file() else _absent(rest)
        else:
            key = " ".join(rest) or "nvidia-smi"
        text = self.sections.get(key)
        return _absent(rest) if text is None else CommandResult(0, text)

    @property
    def node(self) -> str | None:
        """The host name `uname -a` recorded (its second field)."""
        fields = (self.sections.get("uname") or "").split()
        return fields[1] if len(fields) > 1 else None

    @property
    def machine(self) -> str | None:
        """The machine `uname -a` recorded (the field before the processor's)."""
        fields = (self.sections.get("uname") or "").split()
        return fields[-4] if len(fields) >= 4 else None


def _absent(rest: tuple[str, ...]) -> CommandResult:
    return CommandResult(1, "", f"nvidia-smi {' '.join(rest)}: not recorded in the capture")


def sections(path: Path) -> dict[str, str]:
    """A capture file's "== <command>" sections."""
    if not path.is_file():
        return {}
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text(errors="replace").splitlines(keepends=True):
        if line.startswith("== "):
            current = out.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return {key: "".join(lines) for key, lines in out.items()}


def _mib(value: str | None, what: str) -> int | None:
    text = present(value)
    if text is None:
        return None
    match = _NUMBER_RE.search(text)
    if match is None:
        raise DetectionError(f"nvidia-smi reports {what} as {text!r}, not a MiB count")
    return int(match.group(1))


def host_gpus(smi: Smi) -> list[HostGpu]:
    """Each GPU's model, UUID, memory (total and reserved), MIG mode and profiles."""
    query = smi(f"--query-gpu={','.join(HOST_FIELDS)}", "--format=csv,nounits")
    if query.returncode != 0:
        raise DetectionError(f"nvidia-smi --query-gpu: {query.stderr.strip() or 'failed'}")
    lines = [line for line in query.stdout.splitlines() if line.strip()]
    reader = csv.reader(lines, skipinitialspace=True)
    header = [cell.split("[")[0].strip() for cell in next(reader, [])]
    missing = [f for f in HOST_FIELDS if f != "memory.reserved" and f not in header]
    if missing:
        raise DetectionError(f"nvidia-smi --query-gpu output lacks {', '.join(missing)}")
    profiles = mig_profiles(smi)
    gpus: list[HostGpu] = []
    for cells in reader:
        values = dict(zip(header, (c.strip() for c in cells), strict=False))
        index = int(values["index"])
        cc = present(values.get("compute_cap")) or ""
        major, _, minor = cc.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise DetectionError(f"nvidia-smi reports GPU {index}'s compute capability as {cc!r}")
        total = _mib(values.get("memory.total"), f"GPU {index}'s memory.total")
        if total is None:
            raise DetectionError(f"nvidia-smi reports no memory.total for GPU {index}")
        gpus.append(
            HostGpu(
                index=index,
                model=values.get("name", ""),
                uuid=values.get("uuid", ""),
                compute_capability=(int(major), int(minor)),
                memory_total_mib=total,
                memory_reserved_mib=_mib(values.get("memory.reserved"), "memory.reserved"),
                mig_mode=present(values.get("mig.mode.current")),
                driver_version=values.get("driver_version", ""),
                mig_profiles=tuple(profiles.get(index, ())),
            )
        )
    return gpus


def mig_profiles(smi: Smi) -> dict[int, list[str]]:
    """The MIG GPU-instance profiles each GPU offers (`nvidia-smi mig -lgip`); none when the
    host has no MIG-capable GPU or the query is refused."""
    listed = smi("mig", "-lgip")
    found: dict[int, list[str]] = {}
    if listed.returncode != 0:
        return found
    for line in listed.stdout.splitlines():
        match = _PROFILE_RE.match(line)
        if match:
            names = found.setdefault(int(match.group(1)), [])
            if match.group(2) not in names:
                names.append(match.group(2))
    return found


def smi_of(run: Callable[[Sequence[str]], CommandResult]) -> Smi:
    """nvidia-smi through `run` (the host's, or a Capture), as `host_gpus` asks it."""

    def smi(*args: str) -> CommandResult:
        try:
            return run(["nvidia-smi", *args])
        except FileNotFoundError as err:
            raise DetectionError(f"nvidia-smi is not installed: {err}") from err

    return smi


def cuda_driver(smi: Smi) -> tuple[int, int] | None:
    """The CUDA version the driver supports, from nvidia-smi's banner."""
    banner = smi()
    encoded = parse_cuda_version(banner.stdout) if banner.returncode == 0 else None
    return None if encoded is None else (encoded // 1000, encoded % 1000 // 10)


def this_node() -> str:
    """The node's name: NODE_NAME (the downward API, in the detect Job) or the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


__all__ = ["Capture", "cuda_driver", "host_gpus", "mig_profiles", "sections", "smi_of", "this_node"]
