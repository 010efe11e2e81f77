"""Reading the facts from nvidia-smi's output: the query, the banner and XML report, the NVLink
status and the peer matrix, recorded or in the recorded shapes.
"""

from __future__ import annotations

import pytest

from inference_policy.tools.detection import DetectionError, GpuFacts, accelerator_block
from tests.gpukit import FakeNvml, FakeSmi, features, h200_smi, ok, sections
from tmi_cli.detect import detect_accelerator
from tmi_cli.nvidia_smi import (
    CommandResult,
    parse_cuda_version,
    parse_nvlink_status,
    parse_p2p_matrix,
    parse_query_gpu,
    probe_nvidia_smi,
)

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
