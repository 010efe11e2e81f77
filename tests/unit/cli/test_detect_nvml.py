"""Reading the facts through NVML, against a fake that answers from nvml.json dumps.

The fake raises the real binding's NVMLError classes, so every `except` clause runs exactly as
on a host: MIG and NVLink probes that are not supported, the p2p read index, the CUDA version
without libcuda, and old bindings that return bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

from inference_policy.tools.detection import DetectionError, accelerator_block
from tests.gpukit import FakeNvml, device, features, host_dump, nvml_dump
from tmi_cli.detect import detect_accelerator
from tmi_cli.nvml import probe_nvml


def test_nvml_p2p_queries_whole_gpus_with_an_integer_read_index() -> None:
    dump = host_dump(
        device(0),
        device(1, mig=(1, 1)),
        device(2),
        p2pRead={"0": {"2": 0}, "2": {"0": 0}},
    )
    nvml = FakeNvml(dump)
    block = detect_accelerator(nvml=nvml)
    assert features(block) == ["bf16", "mig", "p2p"]
    # The MIG-mode GPU is never asked about, and the index is the int 0, not
    # the binding's NVML_P2P_CAPS_INDEX_READ tuple that ctypes refuses.
    assert sorted(nvml.p2p_queries) == [(0, 2, 0), (2, 0, 0)]
    assert all(type(index) is int for _, _, index in nvml.p2p_queries)


@pytest.mark.parametrize(
    ("status_1_to_0", "claimed"),
    [
        (0, True),  # OK
        (1, False),  # chipset not supported
        (3, False),  # topology not supported
        ("ERR NVMLError_NotSupported: x", False),
        ("ERR NVMLError_GpuIsLost: x", False),
    ],
)
def test_nvml_p2p_status(status_1_to_0: Any, claimed: bool) -> None:
    dump = host_dump(device(0), device(1), p2pRead={"0": {"1": 0}, "1": {"0": status_1_to_0}})
    assert ("p2p" in features(detect_accelerator(nvml=FakeNvml(dump)))) is claimed


def test_nvml_nvlink_counts_enabled_links_until_the_last_link() -> None:
    links = {"0": 1, "1": 0, "2": "ERR NVMLError_NotSupported: x", "3": 1}
    dump = host_dump(device(0, nvlink=links), device(1, nvlink=links))
    host = probe_nvml(FakeNvml(dump))
    assert [g.nvlink_active_links for g in host.gpus] == [2, 2]
    assert "nvlink" in features(accelerator_block(host.gpus, host.cuda_driver_version))


def test_nvml_nvlink_not_supported_at_link_zero_means_none() -> None:
    host = probe_nvml(FakeNvml(nvml_dump()))
    assert host.gpus[0].nvlink_active_links == 0


def test_nvml_mig_not_supported_means_not_capable() -> None:
    dump = host_dump(device(0, name="NVIDIA L40S", cc=(8, 9), mig="ERR NVMLError_NotSupported: x"))
    host = probe_nvml(FakeNvml(dump))
    assert (host.gpus[0].mig_capable, host.gpus[0].mig_enabled) == (False, False)
    assert features(accelerator_block(host.gpus, host.cuda_driver_version)) == ["bf16", "fp8"]


def test_nvml_mig_mode_failure_is_an_error_and_shuts_nvml_down() -> None:
    nvml = FakeNvml(host_dump(device(0, mig="ERR NVMLError_NoPermission: x")))
    with pytest.raises(DetectionError, match="MIG mode of GPU 0 failed"):
        detect_accelerator(nvml=nvml)
    assert nvml.shutdowns == 1


def test_nvml_cuda_version_falls_back_to_v1_without_libcuda() -> None:
    dump = nvml_dump()
    dump["cudaDriverVersion"] = "ERR NVMLError_LibraryNotFound: x"
    dump["cudaDriverVersionV1"] = 12080
    block = detect_accelerator(nvml=FakeNvml(dump))
    assert block["accelerator"]["cudaDriverMajor"] == 12


def test_nvml_without_any_cuda_version_is_refused() -> None:
    dump = nvml_dump()
    dump["cudaDriverVersion"] = "ERR NVMLError_LibraryNotFound: x"
    with pytest.raises(DetectionError, match="cudaDriverMajor cannot be attested"):
        detect_accelerator(nvml=FakeNvml(dump))


def test_nvml_bytes_name_from_old_bindings() -> None:
    dump = nvml_dump()
    dump["devices"][0]["name"] = b"NVIDIA H200"
    host = probe_nvml(FakeNvml(dump))
    assert host.gpus[0].name == "NVIDIA H200"
