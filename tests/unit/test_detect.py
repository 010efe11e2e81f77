"""GPU fact detection: the rules, the NVML path and the nvidia-smi fallback.

The H200 cases replay output recorded on a real host (tests/fixtures/gpu/h200-1x);
the multi-GPU cases are synthetic, in the same shapes as those recordings.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from tmi_cli.detect import (
    CommandResult,
    DetectionError,
    GpuFacts,
    NvidiaSmiUnavailable,
    NvmlUnavailable,
    accelerator_block,
    detect_accelerator,
    format_block,
    parse_cuda_version,
    parse_nvlink_status,
    parse_p2p_matrix,
    parse_query_gpu,
    probe_nvidia_smi,
    probe_nvml,
)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "h200-1x"

H200_BLOCK = {
    "accelerator": {
        "computeCapability": "9.0",
        "cudaDriverMajor": 13,
        "features": ["bf16", "fp8", "mig"],
        "vendor": "nvidia",
    }
}


# --------------------------------------------------------------------------
# Fixture helpers


def sections(name: str) -> dict[str, str]:
    """Split a capture file into its "== <command>" sections."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (FIXTURE / name).read_text().splitlines(keepends=True):
        if line.startswith("== "):
            current = out.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return {key: "".join(lines) for key, lines in out.items()}


def nvml_dump() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURE / "nvml.json").read_text())
    return loaded


_ERROR_CODES = {
    "NotSupported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "InvalidArgument": pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "LibraryNotFound": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "DriverNotLoaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "FunctionNotFound": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    "NoPermission": pynvml.NVML_ERROR_NO_PERMISSION,
    "GpuIsLost": pynvml.NVML_ERROR_GPU_IS_LOST,
}


def _recorded(value: Any) -> Any:
    """Return a recorded value, or raise the NVMLError that was recorded instead."""
    if isinstance(value, str) and value.startswith("ERR NVMLError_"):
        name = value.removeprefix("ERR NVMLError_").split(":", 1)[0]
        raise pynvml.NVMLError(_ERROR_CODES[name])
    return value


class FakeNvml:
    """The pynvml functions the detector uses, answering from an nvml.json dump.

    Errors are the real binding's NVMLError classes, so `except` clauses are
    exercised exactly as on a host. Handles are the device indices.
    """

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(self, dump: dict[str, Any], init: str | None = None) -> None:
        self.dump = dump
        self.init = init
        self.shutdowns = 0
        self.p2p_queries: list[tuple[int, int, Any]] = []

    def _device(self, handle: int) -> dict[str, Any]:
        device: dict[str, Any] = self.dump["devices"][handle]
        return device

    def nvmlInit(self) -> None:
        _recorded(self.init)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return int(self.dump["count"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        assert 0 <= index < len(self.dump["devices"])
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return _recorded(self._device(handle)["name"])

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._device(handle)["cc"]
        return major, minor

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(**self._device(handle)["memory"])

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        mode: list[int] = _recorded(self._device(handle)["migMode"])
        return mode

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        # A link index past the ones recorded is past the GPU's links.
        state = self._device(handle)["nvlink"].get(
            str(link), "ERR NVMLError_InvalidArgument: Invalid Argument"
        )
        return int(_recorded(state))

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: Any) -> int:
        self.p2p_queries.append((a, b, index))
        status = self.dump.get("p2pRead", {}).get(str(a), {}).get(str(b), 5)
        return int(_recorded(status))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return int(_recorded(self.dump["cudaDriverVersion"]))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(
            _recorded(
                self.dump.get("cudaDriverVersionV1", "ERR NVMLError_FunctionNotFound: Not Found")
            )
        )


def device(
    index: int,
    name: str = "NVIDIA A100-SXM4-80GB",
    cc: tuple[int, int] = (8, 0),
    mig: Any = (0, 0),
    nvlink: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "cc": list(cc),
        "memory": {"total": 85899345920, "free": 85899345920, "used": 0},
        "migMode": list(mig) if isinstance(mig, tuple) else mig,
        "nvlink": nvlink if nvlink is not None else {"0": "ERR NVMLError_NotSupported: x"},
    }


def host_dump(*devices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"cudaDriverVersion": 13000, "count": len(devices), "devices": list(devices), **extra}


class FakeSmi:
    """nvidia-smi answering from recorded text, keyed by its arguments."""

    def __init__(self, answers: dict[tuple[str, ...], CommandResult], query: CommandResult) -> None:
        self.answers = answers
        self.query = query
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, args: Sequence[str]) -> CommandResult:
        assert args[0] == "nvidia-smi"
        self.calls.append(tuple(args[1:]))
        if args[1:] and args[1].startswith("--query-gpu="):
            return self.query
        return self.answers.get(tuple(args[1:]), CommandResult(0, ""))


def ok(text: str) -> CommandResult:
    return CommandResult(0, text)


def h200_smi() -> FakeSmi:
    extra = sections("nvidia-smi-extra.txt")
    return FakeSmi(
        {
            (): ok(sections("nvidia-smi.txt")["nvidia-smi"]),
            ("-q", "-x"): ok((FIXTURE / "nvidia-smi-q.xml").read_text()),
            ("nvlink", "-s"): ok(extra["nvlink -s"]),
            ("topo", "-p2p", "r"): ok(extra["topo -p2p r"]),
        },
        query=ok(extra["query-gpu"]),
    )


def gpu(
    index: int,
    name: str = "NVIDIA A100-SXM4-80GB",
    *,
    cc: tuple[int, int] = (8, 0),
    mig_capable: bool = False,
    mig_enabled: bool = False,
    links: int = 0,
) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=name,
        compute_capability=cc,
        mig_capable=mig_capable or mig_enabled,
        mig_enabled=mig_enabled,
        memory_total_bytes=80 * 1024**3,
        nvlink_active_links=links,
    )


def full_mesh(*indices: int) -> dict[tuple[int, int], bool]:
    return {(a, b): True for a in indices for b in indices if a != b}


def features(block: Any) -> list[str]:
    found: list[str] = block["accelerator"]["features"]
    return found


# --------------------------------------------------------------------------
# The H200 host, through both sources


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


def test_format_block_prints_the_documented_layout() -> None:
    block = accelerator_block(
        [gpu(0, mig_capable=True, links=12), gpu(1, mig_capable=True, links=12)],
        13000,
        full_mesh(0, 1),
    )
    assert format_block(block) == (
        "{\n"
        '  "accelerator": {\n'
        '    "computeCapability": "8.0",\n'
        '    "cudaDriverMajor": 13,\n'
        '    "features": [\n'
        '      "bf16",\n'
        '      "mig",\n'
        '      "nvlink",\n'
        '      "p2p"\n'
        "    ],\n"
        '    "vendor": "nvidia"\n'
        "  }\n"
        "}\n"
    )


# --------------------------------------------------------------------------
# The rules


def test_two_gpu_models_are_refused_naming_both() -> None:
    gpus = [gpu(0, "NVIDIA A100-SXM4-80GB", cc=(8, 0)), gpu(1, "NVIDIA H100 80GB HBM3", cc=(9, 0))]
    with pytest.raises(DetectionError, match="two kinds of GPU") as info:
        accelerator_block(gpus, 13000, full_mesh(0, 1))
    assert "NVIDIA A100-SXM4-80GB" in str(info.value)
    assert "NVIDIA H100 80GB HBM3" in str(info.value)


def test_two_gpu_models_are_refused_through_nvml() -> None:
    dump = host_dump(device(0), device(1, name="NVIDIA L40S", cc=(8, 9)))
    with pytest.raises(DetectionError, match="'NVIDIA L40S'"):
        detect_accelerator(nvml=FakeNvml(dump))


def test_no_gpu_is_refused() -> None:
    with pytest.raises(DetectionError, match="no NVIDIA GPU is visible"):
        accelerator_block([], 13000)
    with pytest.raises(DetectionError, match="no NVIDIA GPU is visible"):
        detect_accelerator(nvml=FakeNvml(host_dump()))


@pytest.mark.parametrize("version", [None, 0, -1])
def test_unreadable_cuda_major_is_refused(version: int | None) -> None:
    with pytest.raises(DetectionError, match="cudaDriverMajor cannot be attested"):
        accelerator_block([gpu(0)], version)


@pytest.mark.parametrize(("version", "major"), [(11000, 11), (12080, 12), (13000, 13), (99090, 99)])
def test_cuda_major_in_range(version: int, major: int) -> None:
    assert accelerator_block([gpu(0)], version)["accelerator"]["cudaDriverMajor"] == major


@pytest.mark.parametrize("version", [10020, 9000, 100000])
def test_cuda_major_out_of_range_is_refused(version: int) -> None:
    with pytest.raises(DetectionError, match="from 11 to 99"):
        accelerator_block([gpu(0)], version)


def test_two_whole_gpus_with_peer_paths_claim_p2p() -> None:
    assert "p2p" in features(accelerator_block([gpu(0), gpu(1)], 13000, full_mesh(0, 1)))


def test_one_missing_pair_drops_p2p() -> None:
    paths = full_mesh(0, 1, 2)
    paths[(0, 2)] = False
    paths[(2, 0)] = False
    block = accelerator_block([gpu(0), gpu(1), gpu(2)], 13000, paths)
    assert "p2p" not in features(block)
    assert "p2p" in features(accelerator_block([gpu(0), gpu(1), gpu(2)], 13000, full_mesh(0, 1, 2)))


def test_a_one_way_path_is_not_a_peer_path() -> None:
    block = accelerator_block([gpu(0), gpu(1)], 13000, {(0, 1): True, (1, 0): False})
    assert "p2p" not in features(block)


def test_an_unreported_pair_is_not_a_peer_path() -> None:
    assert "p2p" not in features(accelerator_block([gpu(0), gpu(1)], 13000, {}))


def test_mig_mode_gpu_is_left_out_of_p2p() -> None:
    gpus = [gpu(0), gpu(1, mig_enabled=True), gpu(2)]
    block = accelerator_block(gpus, 13000, full_mesh(0, 2))
    assert features(block) == ["bf16", "mig", "p2p"]


def test_one_whole_gpu_beside_mig_gpus_has_no_p2p() -> None:
    gpus = [gpu(0), gpu(1, mig_enabled=True), gpu(2, mig_enabled=True)]
    assert "p2p" not in features(accelerator_block(gpus, 13000, full_mesh(0, 1, 2)))


def test_single_gpu_has_no_p2p_even_with_a_self_entry() -> None:
    assert "p2p" not in features(accelerator_block([gpu(0)], 13000, {(0, 0): True}))


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((6, 1), []),
        ((7, 0), []),
        ((7, 5), []),
        ((8, 0), ["bf16"]),
        ((8, 6), ["bf16"]),
        ((8, 7), ["bf16"]),
        ((8, 9), ["bf16", "fp8"]),
        ((9, 0), ["bf16", "fp8"]),
        ((10, 0), ["bf16", "fp8"]),
        ((12, 1), ["bf16", "fp8"]),
    ],
)
def test_bf16_and_fp8_follow_compute_capability(cc: tuple[int, int], expected: list[str]) -> None:
    block = accelerator_block([gpu(0, cc=cc)], 13000)
    assert block["accelerator"]["computeCapability"] == f"{cc[0]}.{cc[1]}"
    assert features(block) == expected


def test_pascal_card_has_no_bf16() -> None:
    block = accelerator_block([gpu(0, "Tesla P40", cc=(6, 1))], 12020)
    assert block == {
        "accelerator": {
            "computeCapability": "6.1",
            "cudaDriverMajor": 12,
            "features": [],
            "vendor": "nvidia",
        }
    }


def test_mig_is_claimed_when_capable_even_if_disabled() -> None:
    assert "mig" in features(accelerator_block([gpu(0, mig_capable=True)], 13000))
    assert "mig" not in features(accelerator_block([gpu(0)], 13000))


def test_nvlink_present_and_absent() -> None:
    assert "nvlink" in features(accelerator_block([gpu(0, links=4), gpu(1, links=4)], 13000))
    assert "nvlink" not in features(accelerator_block([gpu(0), gpu(1)], 13000))


def test_nvlink_needs_links_on_every_whole_gpu() -> None:
    # Any whole GPU may be handed to a whole-device binding.
    assert "nvlink" not in features(accelerator_block([gpu(0, links=4), gpu(1)], 13000))
    # A MIG-mode GPU is never handed to one, so it neither grants nor denies the claim.
    gpus = [gpu(0, links=4), gpu(1, links=4), gpu(2, mig_enabled=True)]
    assert "nvlink" in features(accelerator_block(gpus, 13000))
    assert "nvlink" not in features(accelerator_block([gpu(0, mig_enabled=True, links=4)], 13000))


# --------------------------------------------------------------------------
# NVML details


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


# --------------------------------------------------------------------------
# nvidia-smi details

TWO_GPU_QUERY = (
    "index, name, compute_cap, mig.mode.current, memory.total [MiB]\n"
    "0, NVIDIA A100-SXM4-80GB, 8.0, Disabled, 81920 MiB\n"
    "1, NVIDIA A100-SXM4-80GB, 8.0, Disabled, 81920 MiB\n"
)


def p2p_matrix(cells: list[list[str]]) -> str:
    """A ``topo -p2p r`` matrix in the recorded layout, ANSI codes included."""
    labels = [f"GPU{i}" for i in range(len(cells))]
    lines = [" \t\x1b[4m" + "\t".join(labels) + "\t\x1b[0m"]
    lines += [
        f" {label}\t" + "\t".join(row) + "\t" for label, row in zip(labels, cells, strict=True)
    ]
    lines += ["", "Legend:", "", "  X    = Self", "  OK   = Status Ok"]
    return "\n".join(lines) + "\n"


def two_gpu_smi(matrix: str, nvlink: str = "", query: str = TWO_GPU_QUERY) -> FakeSmi:
    smi = h200_smi()
    smi.query = ok(query)
    smi.answers[("topo", "-p2p", "r")] = ok(matrix)
    smi.answers[("nvlink", "-s")] = ok(nvlink)
    return smi


def test_recorded_p2p_matrix_has_no_pairs() -> None:
    assert parse_p2p_matrix(sections("nvidia-smi-extra.txt")["topo -p2p r"]) == {}


def test_p2p_matrix_parses_ok_and_refusals() -> None:
    text = p2p_matrix([["X", "OK", "CNS"], ["OK", "X", "OK"], ["CNS", "OK", "X"]])
    assert parse_p2p_matrix(text) == {
        (0, 1): True,
        (0, 2): False,
        (1, 0): True,
        (1, 2): True,
        (2, 0): False,
        (2, 1): True,
    }


def test_nvidia_smi_two_gpus_with_peer_paths_claim_p2p_and_nvlink() -> None:
    nvlink = (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-a)\n"
        "\t Link 0: 25 GB/s\n"
        "\t Link 1: <inactive>\n"
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-b)\n"
        "\t Link 0: 26.562 GB/s\n"
    )
    smi = two_gpu_smi(p2p_matrix([["X", "OK"], ["OK", "X"]]), nvlink)
    assert detect_accelerator(
        nvml=FakeNvml({}, init="ERR NVMLError_LibraryNotFound: x"), run=smi
    ) == {
        "accelerator": {
            "computeCapability": "8.0",
            "cudaDriverMajor": 13,
            "features": ["bf16", "mig", "nvlink", "p2p"],
            "vendor": "nvidia",
        }
    }


def test_nvidia_smi_chipset_refusal_drops_p2p() -> None:
    smi = two_gpu_smi(p2p_matrix([["X", "CNS"], ["CNS", "X"]]))
    host = probe_nvidia_smi(smi)
    assert features(accelerator_block(host.gpus, host.cuda_driver_version, host.peer_paths)) == [
        "bf16",
        "mig",
    ]


def test_nvidia_smi_failed_topology_query_claims_no_p2p() -> None:
    smi = two_gpu_smi("")
    smi.answers[("topo", "-p2p", "r")] = CommandResult(
        2, "", "Invalid combination of input arguments"
    )
    host = probe_nvidia_smi(smi)
    assert host.peer_paths == {}
    assert "p2p" not in features(
        accelerator_block(host.gpus, host.cuda_driver_version, host.peer_paths)
    )


def test_nvidia_smi_mig_mode_gpu_is_left_out_of_p2p() -> None:
    query = TWO_GPU_QUERY + "2, NVIDIA A100-SXM4-80GB, 8.0, Enabled, 81920 MiB\n"
    # GPU 2 is in MIG mode: its row says nothing useful and must not matter.
    matrix = p2p_matrix([["X", "OK", "NS"], ["OK", "X", "NS"], ["NS", "NS", "X"]])
    host = probe_nvidia_smi(two_gpu_smi(matrix, query=query))
    assert [g.mig_enabled for g in host.gpus] == [False, False, True]
    assert "p2p" in features(
        accelerator_block(host.gpus, host.cuda_driver_version, host.peer_paths)
    )


def test_nvlink_status_counts_only_links_with_a_bandwidth() -> None:
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n"
        "\t Link 0: 26.562 GB/s\n"
        "\t Link 1: <inactive>\n"
        "\t Link 2: some future status\n"
        "GPU 1: Quadro RTX 5000 (UUID: GPU-b) NVML: Unable to retrieve NVLink information "
        "as all links are inActive\n"
    )
    assert parse_nvlink_status(text) == {0: 1, 1: 0}
    assert parse_nvlink_status(sections("nvidia-smi-extra.txt")["nvlink -s"]) == {}


def test_query_without_mig_support_is_not_mig_capable() -> None:
    rows = parse_query_gpu(
        "index, name, compute_cap, mig.mode.current, memory.total [MiB]\n"
        "0, Tesla P40, 6.1, [N/A], 24576 MiB\n"
    )
    assert rows == [
        GpuFacts(
            index=0,
            name="Tesla P40",
            compute_capability=(6, 1),
            mig_capable=False,
            mig_enabled=False,
            memory_total_bytes=24576 * 1024 * 1024,
        )
    ]


def test_query_with_nounits_parses_the_same() -> None:
    with_units = parse_query_gpu(TWO_GPU_QUERY)
    without = parse_query_gpu(TWO_GPU_QUERY.replace(" MiB\n", "\n"))
    assert with_units == without
    assert with_units[0].memory_total_bytes == 81920 * 1024 * 1024


def test_query_without_compute_capability_is_refused() -> None:
    with pytest.raises(DetectionError, match="no compute capability for GPU 0"):
        parse_query_gpu(
            "index, name, compute_cap, mig.mode.current, memory.total [MiB]\n"
            "0, Tesla P40, [N/A], [N/A], 24576 MiB\n"
        )


def test_old_driver_without_compute_cap_field_is_refused() -> None:
    smi = h200_smi()
    smi.query = CommandResult(2, 'Field "compute_cap" is not a valid field to query.\n')
    with pytest.raises(DetectionError, match="cannot report the compute capability"):
        probe_nvidia_smi(smi)


def test_cuda_version_from_the_banner_and_from_version() -> None:
    assert parse_cuda_version(sections("nvidia-smi.txt")["nvidia-smi"]) == 13000
    assert parse_cuda_version(sections("nvidia-smi-extra.txt")["version"]) == 13000
    assert parse_cuda_version("CUDA Version: 12.8") == 12080
    assert parse_cuda_version("CUDA Version: N/A") is None


def test_cuda_version_falls_back_to_the_xml_report() -> None:
    smi = h200_smi()
    banner = smi.answers[()].stdout
    assert "CUDA Version: 13.0" in banner
    smi.answers[()] = ok(banner.replace("CUDA Version: 13.0", "CUDA Version: N/A "))
    assert probe_nvidia_smi(smi).cuda_driver_version == 13000
    assert ("-q", "-x") in smi.calls


def test_nvidia_smi_without_any_cuda_version_is_refused() -> None:
    smi = h200_smi()
    smi.answers[()] = ok(smi.answers[()].stdout.replace("CUDA Version: 13.0", "CUDA Version: N/A "))
    xml = smi.answers[("-q", "-x")].stdout
    smi.answers[("-q", "-x")] = ok(xml.replace("<cuda_version>13.0<", "<cuda_version>N/A<"))
    nvml = FakeNvml({}, init="ERR NVMLError_LibraryNotFound: x")
    with pytest.raises(DetectionError, match="cudaDriverMajor cannot be attested"):
        detect_accelerator(nvml=nvml, run=smi)


def test_p2p_matrix_ignores_non_gpu_columns() -> None:
    text = (
        " \t\x1b[4mGPU0\tGPU1\tNIC0\t\x1b[0m\n"
        " GPU0\tX\tOK\tNS\t\n"
        " GPU1\tOK\tX\tNS\t\n"
        " NIC0\tNS\tNS\tX\t\n"
        "\nLegend:\n"
    )
    assert parse_p2p_matrix(text) == {(0, 1): True, (1, 0): True}
