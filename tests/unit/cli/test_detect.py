"""`tmi detect` end to end: the recorded H200 host through NVML and through nvidia-smi, and the
fallback from one to the other.

The H200 cases replay output recorded on a real host (tests/fixtures/gpu/h200-1x); the rules
themselves are tested on plain facts in test_detection.py.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

from inference_policy.tools.detection import DetectionError, GpuFacts, accelerator_block
from tests.gpukit import (
    FIXTURE,
    H200_BLOCK,
    FakeNvml,
    device,
    h200_smi,
    host_dump,
    nvml_dump,
    sections,
)
from tmi_cli.detect import detect_accelerator
from tmi_cli.nvidia_smi import CommandResult, NvidiaSmiUnavailable, probe_nvidia_smi
from tmi_cli.nvml import NvmlUnavailable, probe_nvml


def test_fixture_is_the_h200_host_the_readme_describes() -> None:
    # Guards the expectations below: they are read from the recording, not assumed.
    dump = nvml_dump()
    assert dump["cudaDriverVersion"] == 13000
    assert [d["name"] for d in dump["devices"]] == ["NVIDIA H200"]
    assert dump["devices"][0]["cc"] == [9, 0]
    assert "CUDA Version: 13.0" in (FIXTURE / "nvidia-smi.txt").read_text()


def test_h200_through_nvml() -> None:
    nvml = FakeNvml(nvml_dump())
    host = probe_nvml(nvml)
    assert host.source == "nvml"
    assert host.cuda_driver_version == 13000
    assert host.gpus == (
        GpuFacts(
            index=0,
            name="NVIDIA H200",
            compute_capability=(9, 0),
            mig_capable=True,
            mig_enabled=False,
            memory_total_bytes=150754820096,
            nvlink_active_links=0,
        ),
    )
    assert host.peer_paths == {}
    assert nvml.p2p_queries == []
    assert nvml.shutdowns == 1
    assert detect_accelerator(nvml=FakeNvml(nvml_dump())) == H200_BLOCK


def test_h200_through_nvidia_smi() -> None:
    smi = h200_smi()
    host = probe_nvidia_smi(smi)
    assert host.source == "nvidia-smi"
    assert host.cuda_driver_version == 13000
    assert host.gpus == (
        GpuFacts(
            index=0,
            name="NVIDIA H200",
            compute_capability=(9, 0),
            mig_capable=True,
            mig_enabled=False,
            memory_total_bytes=143771 * 1024 * 1024,
            nvlink_active_links=0,
        ),
    )
    # One GPU has no pair, so the peer matrix is not even asked for.
    assert ("topo", "-p2p", "r") not in smi.calls
    assert accelerator_block(host.gpus, host.cuda_driver_version, host.peer_paths) == H200_BLOCK


def test_detector_query_asks_only_for_columns_the_recorded_query_has() -> None:
    # The fake answers the detector's query with the recorded, wider one; that
    # is honest only while every column the detector asks for is recorded.
    smi = h200_smi()
    probe_nvidia_smi(smi)
    asked = next(c[0] for c in smi.calls if c and c[0].startswith("--query-gpu="))
    recorded_header = sections("nvidia-smi-extra.txt")["query-gpu"].splitlines()[0]
    recorded = {cell.split("[")[0].strip() for cell in recorded_header.split(",")}
    assert set(asked.removeprefix("--query-gpu=").split(",")) <= recorded


def test_nvml_absent_falls_back_to_nvidia_smi() -> None:
    nvml = FakeNvml(nvml_dump(), init="ERR NVMLError_LibraryNotFound: x")
    smi = h200_smi()
    assert detect_accelerator(nvml=nvml, run=smi) == H200_BLOCK
    assert smi.calls
    assert nvml.shutdowns == 0


def test_missing_pynvml_package_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        probe_nvml()
    assert detect_accelerator(run=h200_smi()) == H200_BLOCK


def test_neither_nvml_nor_nvidia_smi_is_an_error() -> None:
    def missing(args: Sequence[str]) -> CommandResult:
        raise FileNotFoundError(2, "No such file or directory", args[0])

    with pytest.raises(NvidiaSmiUnavailable):
        probe_nvidia_smi(missing)
    nvml = FakeNvml(nvml_dump(), init="ERR NVMLError_LibraryNotFound: x")
    with pytest.raises(DetectionError, match=r"NVML library.*nvidia-smi is not installed"):
        detect_accelerator(nvml=nvml, run=missing)


def test_nvml_driver_not_loaded_is_an_error_not_a_fallback() -> None:
    nvml = FakeNvml(nvml_dump(), init="ERR NVMLError_DriverNotLoaded: x")
    smi = h200_smi()
    with pytest.raises(DetectionError, match="NVML could not start: Driver Not Loaded") as info:
        detect_accelerator(nvml=nvml, run=smi)
    assert not isinstance(info.value, NvmlUnavailable)
    assert smi.calls == []


def test_two_gpu_models_are_refused_through_nvml() -> None:
    dump = host_dump(device(0), device(1, name="NVIDIA L40S", cc=(8, 9)))
    with pytest.raises(DetectionError, match="'NVIDIA L40S'"):
        detect_accelerator(nvml=FakeNvml(dump))


def test_no_gpu_through_nvml_is_refused() -> None:
    with pytest.raises(DetectionError, match="no NVIDIA GPU is visible"):
        detect_accelerator(nvml=FakeNvml(host_dump()))
