"""`tmi diff` and `tmi test`: a revision's changes, whose plans move, and a suite's report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inference_policy.tools.revisions_compare import binding_changes
from inference_policy.trust.profile import parse_envelope
from kits.profilekit import CLUSTER, NAMESPACE, NOW_TEXT, Owner, request
from tmi_cli.main import main

MIG = "nvidia-mig-3g40gb-amd64"
WHOLE = "nvidia-whole-amd64"
SHARE = "nvidia-vram-l40s-amd64"


def _revision(owner: Owner, version: int, edit: Any = None) -> dict[str, Any]:
    envelope = owner.envelope(version=version)
    if edit is not None:
        edit(envelope)
    return envelope


def _binding(envelope: dict[str, Any], binding_id: str) -> dict[str, Any]:
    found = [b for p in envelope["profiles"] for b in p["bindings"] if b["id"] == binding_id]
    assert found, binding_id
    return dict(found[0])


def _r2(envelope: dict[str, Any]) -> None:
    """The MIG binding dropped, the share's usable memory lowered, a second whole binding."""
    for profile in envelope["profiles"]:
        profile["bindings"] = [b for b in profile["bindings"] if b["id"] != MIG]
    envelope["profiles"] = [p for p in envelope["profiles"] if p["bindings"]]
    for profile in envelope["profiles"]:
        for binding in profile["bindings"]:
            if binding["id"] == SHARE:
                binding["capacity"]["usableMemory"] = "40Gi"
            if binding["id"] == WHOLE:
                twin = json.loads(json.dumps(binding))
                twin["id"] = "nvidia-whole-b-amd64"
                profile["bindings"].append(twin)
                break


def test_the_binding_changes_name_what_was_added_removed_and_which_fields_changed() -> None:
    owner = Owner()
    old = parse_envelope(_revision(owner, 1))
    new = parse_envelope(_revision(owner, 2, _r2))
    changes = {(c.binding, c.change): c.fields for c in binding_changes(old, new)}
    assert changes == {
        (SHARE, "changed"): ("capacity.usableMemory",),
        ("nvidia-whole-b-amd64", "added"): (),
        (MIG, "removed"): (),
    }


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Any]:
    owner = Owner()
    paths = {}
    for name, envelope in (("r1", _revision(owner, 1)), ("r2", _revision(owner, 2, _r2))):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(owner.sign(envelope)))
        paths[name] = path
    return {"owner": owner, "dir": tmp_path, **paths}


def _trust(owner: Owner) -> list[str]:
    return [
        "--owner-public-key",
        owner.public_key,
        "--cluster-binding-id",
        CLUSTER,
        "--namespace",
        NAMESPACE,
        "--now",
        NOW_TEXT,
    ]


def test_diff_reports_the_bindings_and_whose_plan_moves(
    files: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    requests = files["dir"] / "requests.yaml"
    requests.write_text(
        yaml.safe_dump(
            [
                {"name": "qwen-7b", "request": request()},
                {"name": "on-cpu", "request": request(config__force_cpu=True)},
            ]
        )
    )
    argv = ["diff", "--old", str(files["r1"]), "--new", str(files["r2"])]
    assert main([*argv, *_trust(files["owner"]), "--requests", str(requests)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["old"]["version"], report["new"]["version"]) == (1, 2)
    assert {(b["binding"], b["change"]) for b in report["bindings"]} == {
        (SHARE, "changed"),
        ("nvidia-whole-b-amd64", "added"),
        (MIG, "removed"),
    }
    # The 7B model leaves the MIG slice that r2 removes; the CPU deployment stays as it was.
    (moved,) = report["plans"]
    assert moved["name"] == "qwen-7b"
    assert moved["before"]["bindingId"] == MIG and moved["after"]["bindingId"] != MIG


def test_diff_refuses_a_revision_the_servers_would_refuse_naming_which(
    files: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    stranger = Owner()
    foreign = files["dir"] / "foreign.json"
    foreign.write_text(json.dumps(stranger.sign(_revision(stranger, 3))))
    argv = ["diff", "--old", str(files["r1"]), "--new", str(foreign), *_trust(files["owner"])]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: new revision {foreign}: invalid inference profile")
    assert "does not trust" in err


def test_a_suite_reports_each_case_and_fails_on_any_mismatch(
    files: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    (files["dir"] / "big.json").write_text(json.dumps(request(model__weightsBytes=10**13)))
    suite = files["dir"] / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "schemaVersion": 1,
                "cases": [
                    {"name": "7b on the slice", "request": request(), "expect": {"bindingId": MIG}},
                    {
                        "name": "a 10 TB model fits nowhere",
                        "requestFile": "big.json",
                        "expect": {"status": 422, "code": "no-fit"},
                    },
                    {"name": "wrong on purpose", "request": request(), "expect": {"path": "cpu"}},
                ],
            }
        )
    )
    argv = ["test", "--bundle", str(files["r1"]), "--suite", str(suite), *_trust(files["owner"])]
    assert main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "PASS  7b on the slice"
    assert out[1] == "PASS  a 10 TB model fits nowhere"
    assert out[2] == "FAIL  wrong on purpose"
    assert out[3] == "      path: expected 'cpu', got 'gpu'"
    assert out[-1] == "2 passed, 1 failed"
    assert main([*argv, "-o", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["passed"], report["failed"]) == (2, 1)
    # Against r2 the slice is gone: the first case fails there.
    argv[2] = str(files["r2"])
    assert main(argv) == 1
    assert capsys.readouterr().out.splitlines()[0] == "FAIL  7b on the slice"


@pytest.mark.parametrize(
    ("suite", "said"),
    [
        ({"schemaVersion": 1, "cases": []}, "cases"),
        ({"schemaVersion": 1, "cases": [{"name": "x", "expect": {"path": "gpu"}}]}, "exactly one"),
        (
            {"schemaVersion": 2, "cases": [{"name": "x", "request": {}, "expect": {"a": 1}}]},
            "schemaVersion",
        ),
    ],
)
def test_a_malformed_suite_is_named(
    files: dict[str, Any], capsys: pytest.CaptureFixture[str], suite: Any, said: str
) -> None:
    path = files["dir"] / "suite.json"
    path.write_text(json.dumps(suite))
    argv = ["test", "--bundle", str(files["r1"]), "--suite", str(path), *_trust(files["owner"])]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: suite {path}: ") and said in err, err
