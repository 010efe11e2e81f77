"""Reading which processes hold memory on which physical GPU (and MIG instance) of this host.

`tmi evidence` needs, for every GPU and every MIG instance, the processes with a compute context,
the memory the driver accounts to each, and (where the driver keeps it) each one's compute
utilisation. NVML answers first, as for `tmi detect`; nvidia-smi answers where NVML cannot be
loaded. Both produce the core's `GpuDevice` and `GpuProcess` values and nothing else, so the
judgement (`inference_policy.evidence`) cannot tell which source spoke. The NVML functions and
the nvidia-smi runner are injectable, so tests replay recorded hosts without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from inference_policy.evidence import GpuDevice, GpuProcess, MigInstance, Sample
from inference_policy.tools.detection import DetectionError
from tmi_cli.nvidia_smi import (
    CommandResult,
    NvidiaSmiUnavailable,
    Runner,
    run_command,
)
from tmi_cli.nvml import (
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlUnavailable,
    import_nvml,
    nvml_code,
    start_nvml,
)
from tmi_cli.smi_processes import (
    COMPUTE_APPS_QUERY,
    SmiReport,
    merge_mig_names,
    parse_compute_apps,
    parse_list_gpus,
    parse_mig_lci,
    parse_mig_lgi,
    parse_smi_xml,
)

__all__ = [
    "COMPUTE_APPS_QUERY",
    "GpuReader",
    "NvidiaSmiReader",
    "NvmlReader",
    "open_reader",
    "parse_compute_apps",
    "parse_list_gpus",
    "parse_mig_lci",
    "parse_mig_lgi",
    "parse_smi_xml",
]

MIB = 1024 * 1024
# NVML's "not in MIG mode" instance id (~0 as a 32-bit unsigned int).
_NO_INSTANCE = 0xFFFFFFFF
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")


class GpuReader:
    """The devices of this host once, then the processes on them as often as asked."""

    source = ""
    driver: str | None = None

    def devices(self) -> tuple[GpuDevice, ...]:  # pragma: no cover - interface
        raise NotImplementedError

    def sample(self, index: int, timestamp: str) -> Sample:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        return None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        # Bindings before 11.515 return bytes.
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass
class _NvmlDevice:
    device: GpuDevice
    handle: Any
    mig_handles: list[tuple[MigInstance, Any]] = field(default_factory=list)
    last_seen_us: int = 0


class NvmlReader(GpuReader):
    """The devices and processes through NVML (`pynvml` of nvidia-ml-py, or a fake of it)."""

    source = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.error = start_nvml(nvml)
        try:
            self.driver = _text(self._call("driver version", nvml.nvmlSystemGetDriverVersion))
            self._devices = self._read_devices()
        except BaseException:
            self.close()
            raise

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.error as err:
            raise DetectionError(f"NVML {what} failed: {err}") from err

    def close(self) -> None:
        with suppress(self.error):
            self.nvml.nvmlShutdown()

    def _read_devices(self) -> list[_NvmlDevice]:
        nvml = self.nvml
        out = []
        for index in range(int(self._call("device count", nvml.nvmlDeviceGetCount))):
            handle = self._call(f"handle of GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
            uuid = _text(self._call(f"UUID of GPU {index}", nvml.nvmlDeviceGetUUID, handle))
            name = _text(self._call(f"name of GPU {index}", nvml.nvmlDeviceGetName, handle))
            memory = self._call(f"memory of GPU {index}", nvml.nvmlDeviceGetMemoryInfo, handle)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(handle)
                mig_enabled = int(current) == NVML_DEVICE_MIG_ENABLE
            except self.error as err:
                if nvml_code(err) not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                    raise DetectionError(f"NVML MIG mode of GPU {index} failed: {err}") from err
                mig_enabled = False
            entry = _NvmlDevice(
                GpuDevice(uuid, index, name.strip(), int(memory.total), mig_enabled), handle
            )
            if mig_enabled:
                entry.mig_handles = self._mig_instances(index, handle)
                entry.device = replace(
                    entry.device, mig_instances=tuple(m for m, _ in entry.mig_handles)
                )
            out.append(entry)
        return out

    def _mig_instances(self, index: int, handle: Any) -> list[tuple[MigInstance, Any]]:
        nvml = self.nvml
        count = int(
            self._call(f"MIG slots of GPU {index}", nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        )
        found = []
        for slot in range(count):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except self.error as err:
                if nvml_code(err) == NVML_ERROR_NOT_FOUND:
                    continue  # an empty slot: no instance was created there
                raise DetectionError(
                    f"NVML MIG device {slot} of GPU {index} failed: {err}"
                ) from err
            what = f"MIG device {slot} of GPU {index}"
            name = _text(self._call(f"name of {what}", nvml.nvmlDeviceGetName, mig))
            profile = _MIG_PROFILE.search(name)
            memory = self._call(f"memory of {what}", nvml.nvmlDeviceGetMemoryInfo, mig)
            instance = MigInstance(
                gpu_instance_id=int(
                    self._call(f"GI of {what}", nvml.nvmlDeviceGetGpuInstanceId, mig)
                ),
                compute_instance_id=int(
                    self._call(f"CI of {what}", nvml.nvmlDeviceGetComputeInstanceId, mig)
                ),
                uuid=_text(self._call(f"UUID of {what}", nvml.nvmlDeviceGetUUID, mig)),
                profile=profile.group(1) if profile else None,
                memory_total_bytes=int(memory.total),
            )
            found.append((instance, mig))
        return found

    def devices(self) -> tuple[GpuDevice, ...]:
        return tuple(entry.device for entry in self._devices)

    def sample(self, index: int, timestamp: str) -> Sample:
        processes: list[GpuProcess] = []
        for entry in self._devices:
            util = self._utilisation(entry)
            if entry.mig_handles:
                # Per-instance handles: the parent's list aggregates, and leaves memory out for
                # a caller without privileges.
                for instance, mig in entry.mig_handles:
                    processes += self._processes(entry.device, mig, instance, util)
            else:
                processes += self._processes(entry.device, entry.handle, None, util)
        return Sample(index, timestamp, tuple(processes))

    def _processes(
        self, device: GpuDevice, handle: Any, instance: MigInstance | None, util: dict[int, int]
    ) -> list[GpuProcess]:
        nvml = self.nvml
        raw = list(
            self._call(
                f"processes on {device.uuid}", nvml.nvmlDeviceGetComputeRunningProcesses, handle
            )
        )
        mps = getattr(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        if mps is not None:
            try:
                raw += list(mps(handle))
            except self.error as err:
                if nvml_code(err) not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                    raise DetectionError(f"NVML MPS processes on {device.uuid}: {err}") from err
        seen: dict[int, GpuProcess] = {}
        for proc in raw:
            pid = int(proc.pid)
            used = getattr(proc, "usedGpuMemory", None)
            gi = _instance_id(getattr(proc, "gpuInstanceId", None))
            ci = _instance_id(getattr(proc, "computeInstanceId", None))
            if instance is not None:
                gi = instance.gpu_instance_id if gi is None else gi
                ci = instance.compute_instance_id if ci is None else ci
            seen[pid] = GpuProcess(
                pid=pid,
                gpu_uuid=device.uuid,
                used_bytes=int(used) if used is not None else None,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                sm_util_percent=util.get(pid),
            )
        return list(seen.values())

    def _utilisation(self, entry: _NvmlDevice) -> dict[int, int]:
        fn = getattr(self.nvml, "nvmlDeviceGetProcessUtilization", None)
        if fn is None:
            return {}
        try:
            samples = fn(entry.handle, entry.last_seen_us)
        except self.error:
            # NotFound: no kernel ran since the last look; NotSupported: MIG or an old GPU.
            # Utilisation is context for people, never part of the verdict.
            return {}
        util: dict[int, int] = {}
        for s in samples:
            util[int(s.pid)] = max(util.get(int(s.pid), 0), int(s.smUtil))
            entry.last_seen_us = max(entry.last_seen_us, int(s.timeStamp))
        return util


def _instance_id(value: Any) -> int | None:
    if value is None:
        return None
    number = int(value)
    return None if number == _NO_INSTANCE else number


class NvidiaSmiReader(GpuReader):
    """The devices and processes from nvidia-smi's XML report, `-L` and `mig -lgi`; used memory
    from `--query-compute-apps` where the XML leaves it out."""

    source = "nvidia-smi"

    def __init__(self, run: Runner | None = None) -> None:
        self.run = run if run is not None else run_command
        report = self._report()
        self.driver = report.driver
        listed = parse_list_gpus(self._ok("-L").stdout)
        lgi: dict[tuple[int, int], str] = {}
        if any(d.mig_enabled for d in report.devices):
            answer = self._smi("mig", "-lgi")
            if answer.returncode == 0:
                lgi = parse_mig_lgi(answer.stdout)
        self._devices = merge_mig_names(report.devices, listed, lgi)

    def _smi(self, *args: str) -> CommandResult:
        try:
            return self.run(["nvidia-smi", *args])
        except FileNotFoundError as err:
            raise NvidiaSmiUnavailable(f"nvidia-smi is not installed: {err}") from err

    def _ok(self, *args: str) -> CommandResult:
        answer = self._smi(*args)
        if answer.returncode != 0:
            detail = (answer.stderr or answer.stdout).strip().splitlines()[:1]
            raise DetectionError(
                f"nvidia-smi {' '.join(args)} exited {answer.returncode}: {' '.join(detail)}"
            )
        return answer

    def _report(self) -> SmiReport:
        return parse_smi_xml(self._ok("-q", "-x").stdout)

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def sample(self, index: int, timestamp: str) -> Sample:
        report = self._report()
        apps = self._smi(COMPUTE_APPS_QUERY, "--format=csv")
        used = {}
        if apps.returncode == 0:
            used = {(p.gpu_uuid, p.pid): p.used_bytes for p in parse_compute_apps(apps.stdout)}
        processes = tuple(
            p if p.used_bytes is not None else replace(p, used_bytes=used.get((p.gpu_uuid, p.pid)))
            for p in report.processes
        )
        return Sample(index, timestamp or report.timestamp, processes)


def open_reader(nvml: Any = None, run: Runner | None = None) -> GpuReader:
    """NVML when it loads, nvidia-smi otherwise; DetectionError when neither answers."""
    try:
        return NvmlReader(nvml if nvml is not None else import_nvml())
    except NvmlUnavailable as err:
        nvml_err = err
    try:
        return NvidiaSmiReader(run)
    except NvidiaSmiUnavailable as smi_err:
        raise DetectionError(
            f"cannot read the GPUs: {nvml_err}; and {smi_err}. Run `tmi evidence` on the GPU "
            "node with the host's PID namespace and its GPUs visible"
        ) from smi_err
