"""nvidia-smi's reports as the core's GPU values: the parsers behind `NvidiaSmiReader`.

Where NVML cannot be loaded, `tmi evidence` reads the same facts from nvidia-smi: the XML report
(`-q -x`) for devices and processes, `-L` for MIG device UUIDs, `mig -lgi`/`-lci` for instance
profiles, and `--query-compute-apps` for used memory the XML leaves out. Each parser takes the
command's text and returns `GpuDevice`/`GpuProcess` values, so recorded hosts replay in tests.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, replace

from inference_policy.evidence import GpuDevice, GpuProcess, MigInstance
from inference_policy.tools.detection import DetectionError
from tmi_cli.nvidia_smi import present

MIB = 1024 * 1024
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")
COMPUTE_APPS_QUERY = "--query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_memory"


def _mib(value: str | None) -> int | None:
    text = present(value)
    match = re.fullmatch(r"(\d+)(?:\s*MiB)?", text or "")
    return int(match.group(1)) * MIB if match else None


def _int(value: str | None) -> int | None:
    text = present(value)
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True)
class SmiReport:
    """What one `nvidia-smi -q -x` says: the devices and the processes on them."""

    driver: str | None
    devices: tuple[GpuDevice, ...]
    processes: tuple[GpuProcess, ...]
    timestamp: str


def parse_smi_xml(text: str) -> SmiReport:
    """Parse `nvidia-smi -q -x`: each `<gpu>` (index = its position, as nvidia-smi numbers
    them), its `<mig_devices>` and its `<processes>`. MIG UUIDs and profile names are not in the
    XML; `parse_list_gpus` and `parse_mig_lgi` supply them."""
    try:
        # The document comes from the local nvidia-smi; expat neither fetches its external DTD
        # nor expands external entities.
        root = ET.fromstring(text)  # noqa: S314
    except ET.ParseError as err:
        raise DetectionError(f"nvidia-smi -q -x printed no XML: {err}") from err
    devices: list[GpuDevice] = []
    processes: list[GpuProcess] = []
    for index, gpu in enumerate(root.findall("gpu")):
        uuid = present(gpu.findtext("uuid"))
        total = _mib(gpu.findtext("fb_memory_usage/total"))
        if uuid is None or total is None:
            raise DetectionError(f"nvidia-smi -q -x: GPU {index} has no UUID or memory total")
        instances = tuple(
            MigInstance(
                gpu_instance_id=gi,
                compute_instance_id=_int(mig.findtext("compute_instance_id")),
                memory_total_bytes=_mib(mig.findtext("fb_memory_usage/total")),
            )
            for mig in gpu.findall("mig_devices/mig_device")
            if (gi := _int(mig.findtext("gpu_instance_id"))) is not None
        )
        devices.append(
            GpuDevice(
                uuid=uuid,
                index=index,
                name=(gpu.findtext("product_name") or "").strip(),
                memory_total_bytes=total,
                mig_enabled=(gpu.findtext("mig_mode/current_mig") or "").strip() == "Enabled",
                mig_instances=instances,
            )
        )
        for info in gpu.findall("processes/process_info"):
            pid = _int(info.findtext("pid"))
            kind = (info.findtext("type") or "").strip()
            if pid is None or "C" not in kind:
                continue  # graphics-only contexts hold no compute grant
            processes.append(
                GpuProcess(
                    pid=pid,
                    gpu_uuid=uuid,
                    used_bytes=_mib(info.findtext("used_memory")),
                    gpu_instance_id=_int(info.findtext("gpu_instance_id")),
                    compute_instance_id=_int(info.findtext("compute_instance_id")),
                    name=present(info.findtext("process_name")),
                )
            )
    return SmiReport(
        driver=present(root.findtext("driver_version")),
        devices=tuple(devices),
        processes=tuple(processes),
        timestamp=(root.findtext("timestamp") or "").strip(),
    )


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """Parse `--query-compute-apps=...` with `--format=csv` (header row; columns found by name,
    so `nounits` or another order do not matter). No MIG instance is in this output."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].startswith("No running"):
        return []
    reader = csv.reader(lines, skipinitialspace=True)
    header = [cell.split("[", 1)[0].strip() for cell in next(reader)]
    for needed in ("gpu_uuid", "pid"):
        if needed not in header:
            raise DetectionError(f"nvidia-smi --query-compute-apps output lacks {needed}")
    memory_column = "used_gpu_memory" if "used_gpu_memory" in header else "used_memory"
    out = []
    for cells in reader:
        values = dict(zip(header, (cell.strip() for cell in cells), strict=False))
        pid = _int(values.get("pid"))
        uuid = present(values.get("gpu_uuid"))
        if pid is None or uuid is None:
            raise DetectionError(
                f"nvidia-smi --query-compute-apps row without pid or UUID: {cells}"
            )
        out.append(
            GpuProcess(
                pid=pid,
                gpu_uuid=uuid,
                used_bytes=_mib(values.get(memory_column)),
                name=present(values.get("process_name")),
            )
        )
    return out


_LIST_GPU = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[0-9a-fA-F-]+)\)")
_LIST_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[\w/-]+)\)")


def parse_list_gpus(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """Parse `nvidia-smi -L`: GPU UUID -> [(MIG device index, profile, MIG UUID)]."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        gpu = _LIST_GPU.match(line)
        if gpu is not None:
            current = gpu.group(2)
            out[current] = []
            continue
        mig = _LIST_MIG.match(line)
        if mig is not None and current is not None:
            out[current].append((int(mig.group(2)), mig.group(1), mig.group(3)))
    return out


_TABLE_ROW = re.compile(r"^\|\s*(\d+)\s+(.*?)\s*\|$")


def parse_mig_lgi(text: str) -> dict[tuple[int, int], str]:
    """Parse `nvidia-smi mig -lgi`: (GPU index, GPU instance id) -> profile ("1g.18gb")."""
    out: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        row = _TABLE_ROW.match(line.strip())
        if row is None:
            continue
        # GPU, "MIG", profile name, profile id, instance id, placement
        cells = row.group(2).split()
        if len(cells) >= 4 and cells[0] == "MIG" and cells[3].isdigit():
            out[(int(row.group(1)), int(cells[3]))] = cells[1]
    return out


def parse_mig_lci(text: str) -> dict[tuple[int, int], list[int]]:
    """Parse `nvidia-smi mig -lci`: (GPU index, GPU instance id) -> compute instance ids."""
    out: dict[tuple[int, int], list[int]] = {}
    for line in text.splitlines():
        row = _TABLE_ROW.match(line.strip())
        if row is None:
            continue
        # GPU, GPU instance id, "MIG", profile name, profile id, instance id, placement
        cells = row.group(2).split()
        if len(cells) >= 5 and cells[0].isdigit() and cells[1] == "MIG" and cells[4].isdigit():
            out.setdefault((int(row.group(1)), int(cells[0])), []).append(int(cells[4]))
    return out


def merge_mig_names(
    devices: Sequence[GpuDevice],
    listed: dict[str, list[tuple[int, str, str]]],
    lgi: dict[tuple[int, int], str],
) -> tuple[GpuDevice, ...]:
    """Give each XML MIG instance its profile (from `mig -lgi`) and UUID (from `-L`, whose
    "Device N" is the XML's `<mig_device><index>` order)."""
    out = []
    for device in devices:
        by_order = sorted(listed.get(device.uuid, []))
        instances = []
        for position, instance in enumerate(device.mig_instances):
            profile = lgi.get((device.index, instance.gpu_instance_id))
            uuid = None
            if position < len(by_order):
                _, listed_profile, uuid = by_order[position]
                profile = profile or listed_profile
            instances.append(replace(instance, profile=profile, uuid=uuid))
        out.append(replace(device, mig_instances=tuple(instances)))
    return tuple(out)


__all__ = [
    "COMPUTE_APPS_QUERY",
    "SmiReport",
    "merge_mig_names",
    "parse_compute_apps",
    "parse_list_gpus",
    "parse_mig_lci",
    "parse_mig_lgi",
    "parse_smi_xml",
]
