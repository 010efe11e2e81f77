"""The core's rules for the accelerator block, applied to GPU facts given as values.

No I/O and no fakes: each case is the facts a probe would have read, and the block (or the
refusal) the rules derive from them. How the facts are read is tested in test_detect_nvml.py
and test_detect_nvidia_smi.py; the recorded H200 host end to end in test_detect.py.
"""

from __future__ import annotations

import pytest

from inference_policy.tools.detection import DetectionError, accelerator_block, format_block
from tests.gpukit import features, full_mesh, gpu


def test_two_gpu_models_are_refused_naming_both() -> None:
    gpus = [gpu(0, "NVIDIA A100-SXM4-80GB", cc=(8, 0)), gpu(1, "NVIDIA H100 80GB HBM3", cc=(9, 0))]
    with pytest.raises(DetectionError, match="two kinds of GPU") as info:
        accelerator_block(gpus, 13000, full_mesh(0, 1))
    assert "NVIDIA A100-SXM4-80GB" in str(info.value)
    assert "NVIDIA H100 80GB HBM3" in str(info.value)


def test_no_gpu_is_refused() -> None:
    with pytest.raises(DetectionError, match="no NVIDIA GPU is visible"):
        accelerator_block([], 13000)


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
