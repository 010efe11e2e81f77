"""`tmi detect --host` and `--from`: the host facts an owner writes a binding from, read from a
recorded capture (the real H200's), and the same device as NVIDIA's DRA driver names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference_policy.allocation.dra_facts import DraDevice
from inference_policy.tools.host_facts import architecture_of, semver
from tests.gpukit import FIXTURE, H200_BLOCK
from tmi_cli.main import main


def _detect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    status = main(["detect", *args])
    captured = capsys.readouterr()
    return status, json.loads(captured.out) if captured.out else None, captured.err


def test_a_recorded_host_is_detected_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _detect(capsys, "--from", str(FIXTURE))
    # The seed's block alone, exactly what the host gave.
    assert (status, out) == (0, H200_BLOCK)


def test_the_host_report_names_what_a_binding_is_written_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = _detect(capsys, "--from", str(FIXTURE), "--host")
    assert status == 0
    assert out["accelerator"] == H200_BLOCK["accelerator"]
    host = out["host"]
    assert (host["node"], host["count"], host["cudaDriverVersion"]) == ("vm", 1, "13.0")
    (gpu,) = host["gpus"]
    assert gpu["model"] == "NVIDIA H200"
    assert gpu["uuid"] == "GPU-9c156425-b68a-a03b-ec6b-53562cf93b1a"
    # The README of the recording: 143771 MiB, of which 616 MiB reserved by the driver.
    assert (gpu["memoryTotalMiB"], gpu["memoryReservedMiB"]) == (143771, 616)
    assert gpu["migMode"] == "Disabled"
    assert gpu["migProfiles"][0] == "1g.18gb" and "7g.141gb" in gpu["migProfiles"]
    (device,) = out["dra"]["devices"]
    # Copyable into a dra binding as it stands: the model validates it.
    parsed = DraDevice.model_validate(device)
    assert (parsed.productName, parsed.architecture, parsed.driverVersion) == (
        "NVIDIA H200",
        "Hopper",
        "580.159.4",
    )
    assert parsed.memory == "143771Mi" and parsed.uuids == [gpu["uuid"]]


def test_the_node_is_the_one_given(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _detect(capsys, "--from", str(FIXTURE), "--host", "--node", "gpu-7")
    assert out["host"]["node"] == "gpu-7"


def test_a_directory_that_is_no_capture_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _detect(capsys, "--from", str(tmp_path))
    assert (status, out) == (1, None)
    assert err == (
        f"error: {tmp_path} is not a capture of tools/gpu-capture.sh (no nvidia-smi-extra.txt)\n"
    )


@pytest.mark.parametrize(
    ("cc", "name"),
    [
        ((7, 0), "Volta"),
        ((8, 0), "Ampere"),
        ((8, 6), "Ampere"),
        ((8, 9), "Ada Lovelace"),
        ((9, 0), "Hopper"),
        ((10, 0), "Blackwell"),
        ((6, 1), None),
    ],
)
def test_the_architecture_is_nvmls_name_for_the_compute_capability(
    cc: tuple[int, int], name: str | None
) -> None:
    assert architecture_of(cc) == name


def test_driver_versions_are_published_as_semver() -> None:
    assert semver("580.95.05") == "580.95.5"
    assert semver("13.0") == "13.0.0"
    with pytest.raises(ValueError, match="not one to three dotted numbers"):
        semver("580.x")
