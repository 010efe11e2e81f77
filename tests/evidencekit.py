"""Fakes of NVML and nvidia-smi for `tmi evidence`'s tests, answering from the shared-GPU fixtures.

The fixtures (tests/fixtures/gpu/h200-shared, h200-mig; see their README) hold NVML's process
structs as nvidia-ml-py's pynvml returns them, sample by sample, and nvidia-smi's text. The fake
NVML moves to the next recorded sample each time the reader asks for processes on GPU 0, so a
multi-sample run replays the recording in order; errors are the real binding's NVMLError classes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from inference_policy.evidence import Observation
from tests.gpukit import recorded
from tmi_cli.cgroups import read_owners
from tmi_cli.evidence import collect, load_pods
from tmi_cli.gpu_processes import COMPUTE_APPS_QUERY, NvidiaSmiReader, NvmlReader
from tmi_cli.nvidia_smi import CommandResult

GPU = Path(__file__).resolve().parent / "fixtures" / "gpu"
SHARED = GPU / "h200-shared"
MIG = GPU / "h200-mig"
STATUS = GPU / "pod-status"
H200_UUID = "GPU-9c156425-b68a-a03b-ec6b-53562cf93b1a"
MIB = 1024 * 1024
GIB = 1024 * MIB


def load(directory: Path, name: str) -> Any:
    return json.loads((directory / name).read_text())


class FakeEvidenceNvml:
    """The pynvml functions the evidence reader calls. Device handles are ints, MIG handles
    (device, slot) tuples."""

    NVMLError = pynvml.NVMLError

    def __init__(self, dump: dict[str, Any], init: str | None = None) -> None:
        self.dump = dump
        self.init = init
        self.sample = -1
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        recorded(self.init)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.dump["driver"])

    def nvmlDeviceGetCount(self) -> int:
        return int(self.dump["count"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def _static(self, handle: Any) -> dict[str, Any]:
        if isinstance(handle, tuple):
            device, slot = handle
            for mig in self.dump["devices"][device]["migDevices"]:
                if mig["index"] == slot:
                    found: dict[str, Any] = mig
                    return found
            raise AssertionError(f"no MIG device {handle}")
        static: dict[str, Any] = self.dump["devices"][handle]
        return static

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._static(handle)["uuid"])

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._static(handle)["name"])

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        return SimpleNamespace(**self._static(handle)["memory"])

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        mode: list[int] = recorded(self._static(handle)["migMode"])
        return mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return int(self._static(handle)["maxMigDevices"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if not any(m["index"] == slot for m in self._static(handle)["migDevices"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle, slot

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[int, int]) -> int:
        return int(self._static(handle)["gpuInstanceId"])

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[int, int]) -> int:
        return int(self._static(handle)["computeInstanceId"])

    def _current(self, device: int) -> dict[str, Any]:
        sample: dict[str, Any] = self.dump["samples"][self.sample]["devices"][device]
        return sample

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        # The reader asks for utilisation first on each device: the sample turns here.
        if handle == 0:
            self.sample += 1
        samples = recorded(self._current(handle).get("processUtilization", []))
        return [SimpleNamespace(**s) for s in samples if s["timeStamp"] > last_seen]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        if isinstance(handle, tuple):
            device, slot = handle
            entries = self._current(device)["migDevices"][
                [m["index"] for m in self.dump["devices"][device]["migDevices"]].index(slot)
            ]["processes"]
        else:
            entries = self._current(handle)["processes"]
        return [SimpleNamespace(**p) for p in recorded(entries)]


class FakeSmi:
    """nvidia-smi answering from a fixture directory's text files."""

    def __init__(self, directory: Path, missing: Sequence[str] = ()) -> None:
        self.directory = directory
        self.missing = set(missing)
        self.calls: list[tuple[str, ...]] = []

    def _file(self, name: str) -> CommandResult:
        path = self.directory / name
        if name in self.missing or not path.exists():
            return CommandResult(6, "", f"{name}: not recorded")
        return CommandResult(0, path.read_text())

    def __call__(self, args: Sequence[str]) -> CommandResult:
        assert args[0] == "nvidia-smi"
        rest = tuple(args[1:])
        self.calls.append(rest)
        files = {
            ("-q", "-x"): "nvidia-smi-q.xml",
            ("-L",): "nvidia-smi-L.txt",
            ("mig", "-lgi"): "nvidia-smi-mig-lgi.txt",
            ("mig", "-lci"): "nvidia-smi-mig-lci.txt",
            (COMPUTE_APPS_QUERY, "--format=csv"): "nvidia-smi-compute-apps.csv",
        }
        if rest not in files:
            return CommandResult(2, "", f"unexpected arguments {rest}")
        return self._file(files[rest])


def nvml_observation(directory: Path, samples: int | None = None) -> Observation:
    dump = load(directory, "nvml-samples.json")
    reader = NvmlReader(FakeEvidenceNvml(dump))
    return collect(reader, samples or len(dump["samples"]), clock=lambda: "t")


def smi_observation(directory: Path) -> Observation:
    return collect(NvidiaSmiReader(FakeSmi(directory)), 1, clock=lambda: "")


def pods(directory: Path) -> list[dict[str, Any]]:
    return load_pods(load(directory, "pods.json"))


def owners(directory: Path, observation: Observation) -> dict[int, Any]:
    pids = {p.pid for s in observation.samples for p in s.processes}
    return read_owners(pids, proc=str(directory / "proc"))
