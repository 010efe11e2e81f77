"""What `tmi detect --host` says of a GPU host beyond the accelerator block, and how NVIDIA's
DRA driver names the same facts, so an owner copies them rather than computing them.

The accelerator block (`inference_policy.tools.detection`) is the seed's and stays as it is; an
owner writing a binding also needs the GPU model, how many there are, each card's memory and what
the driver reserves of it (the seed's usableMemory starts there), the MIG profiles on offer and the
node, and, for a `dra` binding, the device facts spelled as the driver publishes them
(`productName`, `architecture`, `driverVersion` as semver, `memory`, the UUIDs). Pure: rows of
facts in, documents out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# NVML's architecture names by compute capability major.minor (what the driver publishes as
# `architecture`); 8.9 is Ada, the other 8.x Ampere.
_ARCHITECTURES: tuple[tuple[tuple[int, int], tuple[int, int], str], ...] = (
    ((7, 0), (7, 2), "Volta"),
    ((7, 5), (7, 5), "Turing"),
    ((8, 9), (8, 9), "Ada Lovelace"),
    ((8, 0), (8, 8), "Ampere"),
    ((9, 0), (9, 9), "Hopper"),
    ((10, 0), (12, 9), "Blackwell"),
)
DRA_DRIVER = "gpu.nvidia.com"


def architecture_of(cc: tuple[int, int]) -> str | None:
    """NVML's architecture name for a compute capability, or None for one not known here."""
    for low, high, name in _ARCHITECTURES:
        if low <= cc <= high:
            return name
    return None


def semver(version: str) -> str:
    """A dotted driver version as the DRA driver publishes it: three numbers, no leading zeros
    (580.95.05 -> 580.95.5, 13.0 -> 13.0.0)."""
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"version {version!r} is not one to three dotted numbers")
    return ".".join(str(int(p)) for p in [*parts, "0", "0"][:3])


@dataclass(frozen=True, slots=True)
class HostGpu:
    index: int
    model: str
    uuid: str
    compute_capability: tuple[int, int]
    memory_total_mib: int
    memory_reserved_mib: int | None
    mig_mode: str | None
    driver_version: str
    mig_profiles: tuple[str, ...] = ()


# `uname -m` as Kubernetes names the architecture (kubernetes.io/arch).
ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def host_report(
    node: str,
    gpus: Sequence[HostGpu],
    cuda_driver: tuple[int, int] | None,
    source: str,
    machine: str | None = None,
) -> dict[str, Any]:
    """The host block: where, which GPUs, how much memory, which MIG profiles."""
    return {
        "node": node,
        "architecture": ARCHITECTURES.get(machine or "", machine),
        "source": source,
        "count": len(gpus),
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "uuid": g.uuid,
                "memoryTotalMiB": g.memory_total_mib,
                "memoryReservedMiB": g.memory_reserved_mib,
                "migMode": g.mig_mode,
                "migProfiles": list(g.mig_profiles),
            }
            for g in gpus
        ],
        "cudaDriverVersion": None if cuda_driver is None else f"{cuda_driver[0]}.{cuda_driver[1]}",
    }


def dra_devices(gpus: Sequence[HostGpu]) -> list[dict[str, Any]]:
    """A `dra` binding's `device` for each kind of whole GPU on the host (same model and
    memory), as the driver publishes it: the facts, the lowest driver as the floor, and the
    UUIDs for the allow-list. MIG devices are cut later; their profiles are in the host block."""
    groups: dict[tuple[str, int, tuple[int, int]], list[HostGpu]] = {}
    for gpu in gpus:
        if gpu.mig_mode == "Enabled":
            continue
        groups.setdefault((gpu.model, gpu.memory_total_mib, gpu.compute_capability), []).append(gpu)
    devices: list[dict[str, Any]] = []
    for (model, memory, cc), members in groups.items():
        device: dict[str, Any] = {
            "driver": DRA_DRIVER,
            "type": "gpu",
            "productName": model,
            "architecture": architecture_of(cc) or f"unknown for compute capability {cc}",
            "driverVersion": min((semver(g.driver_version) for g in members), key=_version_key),
            "memory": f"{memory}Mi",
            "uuids": [g.uuid for g in members],
        }
        devices.append(device)
    return devices


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


__all__ = [
    "ARCHITECTURES",
    "DRA_DRIVER",
    "HostGpu",
    "architecture_of",
    "dra_devices",
    "host_report",
    "semver",
]
