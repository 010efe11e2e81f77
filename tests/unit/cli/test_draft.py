"""`tmi draft`: from `tmi detect --host` outputs to an envelope that signs, verifies and plans,
by the seed's rules (the lowest facts and the least memory of a binding's nodes)."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from inference_policy.tools.draft import (
    DraftError,
    draft_envelope,
    observed,
    observed_node,
    usable_memory_gi,
)
from kits.profilekit import request
from policy_io.catalog import packaged_catalog
from tests.gpukit import FIXTURE
from tmi_cli.main import main

NOW = datetime(2026, 12, 1, tzinfo=UTC)
NOW_TEXT = "2026-12-01T00:00:00Z"


def _detected(capsys: pytest.CaptureFixture[str], node: str) -> dict[str, Any]:
    assert main(["detect", "--from", str(FIXTURE), "--host", "--node", node]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_the_seeds_memory_rule() -> None:
    # The recorded H200: 143771 MiB, 616 reserved; the seed's 80 GB card: 79Gi.
    assert usable_memory_gi(143771, 616) == 139
    assert usable_memory_gi(81559, 512) == 79
    # Unmeasured (labels give the total only), a GiB is assumed: the safe direction.
    assert usable_memory_gi(81559, None) == 78
    assert usable_memory_gi(143771, None) == 139


def test_a_binding_attests_what_holds_on_every_node(capsys: pytest.CaptureFixture[str]) -> None:
    first = _detected(capsys, "gpu-a")
    older = copy.deepcopy(_detected(capsys, "gpu-b"))
    older["accelerator"]["cudaDriverMajor"] = 12
    older["accelerator"]["features"] = ["bf16"]
    older["host"]["gpus"][0]["memoryTotalMiB"] = 140000
    envelope, notes = draft_envelope(
        [observed(first, "a"), observed(older, "b")],
        packaged_catalog(),
        key_id="sha256:" + "0" * 64,
        cluster_binding_id="c1",
        namespace="kamiwaza",
        now=NOW,
    )
    (gpu_profile,) = [p for p in envelope["profiles"] if p["capability"] == "gpu"]
    (binding,) = gpu_profile["bindings"]
    assert binding["accelerator"]["cudaDriverMajor"] == 12
    assert binding["accelerator"]["features"] == ["bf16"]
    assert binding["capacity"]["usableMemory"] == f"{(140000 - 616) // 1024}Gi"
    assert any("gpu-a, gpu-b" in note for note in notes)


def test_what_is_not_detect_output_is_named(tmp_path: Path) -> None:
    with pytest.raises(DraftError, match=r"x\.json is not `tmi detect --host` output"):
        observed({"accelerator": {}}, "x.json")


def test_keygen_detect_draft_sign_verify_and_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The owner's path with no arithmetic by hand: the draft signs as it stands, verifies,
    and a 7B model is planned on the H200 binding it drafted."""
    key = tmp_path / "owner.pem"
    assert main(["keygen", "--private-key-out", str(key)]) == 0
    public_key = json.loads(capsys.readouterr().out)["publicKey"]
    detected = tmp_path / "gpu-a.json"
    argv = ["detect", "--from", str(FIXTURE), "--host", "--output-file", str(detected)]
    assert main(argv) == 0
    envelope = tmp_path / "envelope.json"
    argv = [
        "draft",
        "--from-detect",
        str(detected),
        "--cluster-binding-id",
        "c1",
        "--namespace",
        "kamiwaza",
        "--private-key",
        str(key),
        "--now",
        NOW_TEXT,
        "--output-file",
        str(envelope),
    ]
    assert main(argv) == 0
    assert "note: binding nvidia-h200-amd64: 1 NVIDIA H200 GPU(s) on vm" in capsys.readouterr().err
    signed = tmp_path / "cm.json"
    argv = ["sign", "--envelope", str(envelope), "--private-key", str(key)]
    assert main([*argv, "--now", NOW_TEXT, "--output-file", str(signed)]) == 0
    trust = [
        "--owner-public-key",
        public_key,
        "--cluster-binding-id",
        "c1",
        "--namespace",
        "kamiwaza",
        "--now",
        NOW_TEXT,
    ]
    assert main(["verify", "--bundle", str(signed), *trust]) == 0
    capsys.readouterr()
    request_file = tmp_path / "request.json"
    request_file.write_text(json.dumps(request()))
    assert main(["plan", "--bundle", str(signed), *trust, "--request", str(request_file)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["bindingId"] == "nvidia-h200-amd64"
    assert plan["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_sign_fills_in_the_key_id_an_envelope_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "owner.pem"
    assert main(["keygen", "--private-key-out", str(key)]) == 0
    key_id = json.loads(capsys.readouterr().out)["keyId"]
    detected = tmp_path / "d.json"
    assert main(["detect", "--from", str(FIXTURE), "--host", "--output-file", str(detected)]) == 0
    envelope = tmp_path / "envelope.json"
    argv = ["draft", "--from-detect", str(detected), "--cluster-binding-id", "c1"]
    argv += ["--namespace", "kamiwaza", "--key-id", key_id, "--now", NOW_TEXT]
    assert main([*argv, "--output-file", str(envelope)]) == 0
    document = json.loads(envelope.read_text())
    del document["keyId"]
    envelope.write_text(json.dumps(document))
    argv = ["sign", "--envelope", str(envelope), "--private-key", str(key), "--now", NOW_TEXT]
    assert main(argv) == 0
    signed = json.loads(capsys.readouterr().out)
    bundle = json.loads(signed["data"]["bundle.json"])
    payload = json.loads(base64.b64decode(bundle["payload"]))
    assert payload["keyId"] == key_id


def test_a_draft_from_gfd_labels_of_the_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl get nodes -o json` as GPU Feature Discovery labels them: the same rules, with
    the reserve assumed and no peer path drafted (labels carry neither)."""
    from kits.fleetkit import a100_mig, h100

    nodes = [
        h100("h100-a", gpus=8).manifest(),
        h100("h100-b", gpus=4, cuda_driver_major=12).manifest(),
        a100_mig("a100-mig").manifest(),
        {"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8"}}},
    ]
    seen = [o for o in (observed_node(n) for n in nodes) if o is not None]
    assert [o.node for o in seen] == ["h100-a", "h100-b"]
    envelope, notes = draft_envelope(
        seen,
        packaged_catalog(),
        key_id="sha256:" + "0" * 64,
        cluster_binding_id="c1",
        namespace="kamiwaza",
        now=NOW,
    )
    (gpu_profile,) = [p for p in envelope["profiles"] if p["capability"] == "gpu"]
    (binding,) = gpu_profile["bindings"]
    assert binding["id"] == "nvidia-h100-80gb-hbm3-amd64"
    assert binding["accelerator"]["cudaDriverMajor"] == 12
    assert "p2p" not in binding["accelerator"]["features"]
    assert binding["capacity"]["usableMemory"] == "79Gi"  # 80 GiB labelled, a GiB assumed
    assert any("12 NVIDIA H100 80GB HBM3 GPU(s) on h100-a, h100-b" in n for n in notes)
    assert any("the reserve assumed" in n for n in notes)


def test_draft_from_a_nodes_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kits.fleetkit import h100

    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "NodeList", "items": [h100("gpu-1").manifest()]}))
    argv = ["draft", "--from-nodes", str(nodes), "--cluster-binding-id", "c1"]
    argv += ["--namespace", "kamiwaza", "--key-id", "sha256:" + "0" * 64, "--now", NOW_TEXT]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["profiles"][-1]["bindings"][0]["id"].startswith("nvidia-h100")
    assert "on gpu-1" in captured.err
    with pytest.raises(SystemExit):
        main([*argv, "--from-detect", str(nodes)])
