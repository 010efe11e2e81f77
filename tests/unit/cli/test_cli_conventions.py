"""The owner CLI's conventions and the traps an owner met on day one, each closed: the seed's
ConfigMap name end to end, signing that refuses what the seed says not to write, files written
whole or not at all, YAML input, one value per flag, `--version`, `-o yaml`, and the refusal's
code beside the seed's text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from kits.profilekit import CLUSTER, NAMESPACE, NOW_TEXT, Owner, request
from tmi_cli.main import main


@pytest.fixture
def owner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Owner, Path]:
    key = tmp_path / "owner.pem"
    assert main(["keygen", "--private-key-out", str(key)]) == 0
    capsys.readouterr()
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return Owner(load_pem_private_key(key.read_bytes(), None)), key  # type: ignore[arg-type]


def _sign(key: Path, envelope: Path, *extra: str) -> list[str]:
    return [
        "sign",
        "--envelope",
        str(envelope),
        "--private-key",
        str(key),
        "--now",
        NOW_TEXT,
        *extra,
    ]


def _verify(bundle: Path, owner: Owner, *extra: str) -> list[str]:
    return [
        "verify",
        "--bundle",
        str(bundle),
        "--owner-public-key",
        owner.public_key,
        "--cluster-binding-id",
        CLUSTER,
        "--namespace",
        NAMESPACE,
        "--now",
        NOW_TEXT,
        *extra,
    ]


def _with_features(envelope: dict[str, Any], profile: str, features: list[str]) -> None:
    found = next(p for p in envelope["profiles"] if p["name"] == profile)
    found["bindings"][0]["accelerator"]["features"] = features


@pytest.mark.parametrize(
    ("profile", "features", "said"),
    [
        ("nvidia-mig-3g40gb", ["bf16", "mig", "p2p"], "attests p2p, which a slice"),
        ("nvidia-mig-3g40gb", ["bf16", "mig", "nvlink", "p2p"], "attests p2p and nvlink"),
    ],
)
def test_signing_refuses_a_slice_binding_that_attests_a_peer_path(
    owner: tuple[Owner, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    profile: str,
    features: list[str],
    said: str,
) -> None:
    who, key = owner
    envelope = who.envelope()
    if not any(p["name"] == profile for p in envelope["profiles"]):
        pytest.fail(f"the template envelope has no profile {profile}")
    _with_features(envelope, profile, features)
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps(envelope))
    out = tmp_path / "cm.json"
    assert main(_sign(key, path, "--output-file", str(out))) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: not signed: profile nvidia-mig-3g40gb binding ")
    assert said in err and "drop p2p and nvlink from a MIG or VRAM-share binding" in err
    assert not out.exists()


def test_sign_output_file_is_written_whole_and_a_refusal_leaves_the_last_one(
    owner: tuple[Owner, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    who, key = owner
    envelope = tmp_path / "envelope.json"
    envelope.write_text(json.dumps(who.envelope()))
    out = tmp_path / "cm.json"
    assert main(_sign(key, envelope, "--output-file", str(out))) == 0
    assert capsys.readouterr().out == ""
    signed = json.loads(out.read_text())
    assert signed["metadata"]["name"] == DEFAULT_CONFIGMAP_NAME
    # A refused signing (the window is over by then) keeps the good file as it was.
    before = out.read_bytes()
    argv = _sign(key, envelope, "--output-file", str(out))
    argv[argv.index("--now") + 1] = "2030-01-01T00:00:00Z"
    assert main(argv) == 1
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".cm.json")] == []


def test_verify_says_which_name_it_checked(
    owner: tuple[Owner, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    who, _ = owner
    bundle = tmp_path / "cm.json"
    bundle.write_text(json.dumps(who.sign(name="kamiwaza-inference-profiles-r2")))
    assert main(_verify(bundle, who)) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["configMap"] == "kamiwaza-inference-profiles-r2"
    assert captured.err.startswith(
        "note: checked as ConfigMap 'kamiwaza-inference-profiles-r2', the name it carries"
    )
    # Against the name the servers are configured with, the renamed copy is refused.
    assert main(_verify(bundle, who, "--bundle-configmap", DEFAULT_CONFIGMAP_NAME)) == 1
    captured = capsys.readouterr()
    assert "note:" not in captured.err
    assert json.loads(captured.out)["status"] == 503


def test_yaml_input_reads_as_json_does_and_is_as_strict(
    owner: tuple[Owner, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    who, key = owner
    # What `kubectl get configmap -o yaml` prints: YAML, with server fields and timestamps.
    configmap = who.sign()
    configmap["metadata"]["creationTimestamp"] = "2026-12-01T00:00:00Z"
    bundle = tmp_path / "cm.yaml"
    text = yaml.safe_dump(configmap).replace("'2026-12-01T00:00:00Z'", "2026-12-01T00:00:00Z")
    bundle.write_text(text)
    assert main(_verify(bundle, who)) == 0
    assert json.loads(capsys.readouterr().out)["verified"] is True
    envelope = tmp_path / "envelope.yaml"
    envelope.write_text(yaml.safe_dump(who.envelope()))
    assert main(_sign(key, envelope)) == 0
    assert json.loads(capsys.readouterr().out)["data"] == who.sign()["data"]
    for body, said in [
        ("version: 1\nversion: 2\n", "duplicate key 'version'"),
        ("a: &x [1]\nb: *x\n", "aliases are not accepted"),
        ("version: !!set {a, b}\n", "version is a YAML set, which JSON cannot carry"),
        ("a: 1\n---\nb: 2\n", "holds 2 YAML documents"),
        ("version: .nan\n", "version is nan, which JSON cannot carry"),
    ]:
        envelope.write_text(body)
        assert main(_sign(key, envelope)) == 1
        err = capsys.readouterr().err
        assert said in err and str(envelope) in err, (body, err)


def test_a_flag_given_twice_is_a_usage_error_not_the_last_one_silently(
    owner: tuple[Owner, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        path.write_text(json.dumps(request()))
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--disabled", "--request", str(first), "--request", str(second)])
    assert exited.value.code == 2
    assert "error: --request is given twice; it takes one value" in capsys.readouterr().err


def test_version_and_yaml_output(
    owner: tuple[Owner, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("tmi 0.")
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request()))
    assert main(["plan", "--disabled", "--request", str(path), "-o", "yaml"]) == 1
    refusal = yaml.safe_load(capsys.readouterr().out)
    # The runbook's code beside the seed's text, unchanged.
    assert refusal == {
        "status": 422,
        "detail": "Core cannot see a GPU on this install",
        "code": "tenant-mode-off",
    }


def test_every_flag_of_every_command_says_what_it_is() -> None:
    import argparse

    from tmi_cli.main import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [
        (name, action.option_strings)
        for name, command in commands.choices.items()
        for action in command._actions
        if action.option_strings and action.dest != "help" and not action.help
    ]
    assert silent == []


def test_shell_completion_knows_every_command_and_is_valid_bash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import subprocess

    from tmi_cli.main import build_parser

    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    path = tmp_path / "tmi.bash"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in commands.choices:
        assert name in script, name
    for flag in ("--output-file", "--from-detect", "--as-installer", "--bundle-configmap"):
        assert flag in script, flag


def test_the_documented_recipe_catalog_renders_and_pins_its_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/recipe-catalog-gpu.json, as docs/contract.md section 7 shows it: rendered, and
    a request it matches planned with its image and named recipe."""
    from kits.profilekit import EXAMPLES, catalog_image

    example = EXAMPLES / "recipe-catalog-gpu.json"
    catalog = json.loads(example.read_text())
    assert catalog["recipes"][0]["image"] == catalog_image("llamacpp", "nvidia", "amd64", 13)
    argv = ["render-catalog", "--catalog", str(example), "--namespace", NAMESPACE]
    assert main([*argv, "--capability", "gpu", "--output-file", str(tmp_path / "cm.json")]) == 0
    assert json.loads((tmp_path / "cm.json").read_text())["immutable"] is True
    who = Owner()
    bundle = tmp_path / "profile.json"
    bundle.write_text(json.dumps(who.sign()))
    requested = tmp_path / "request.json"
    requested.write_text(json.dumps(request()))
    argv = ["plan", "--bundle", str(bundle), "--owner-public-key", who.public_key]
    argv += ["--cluster-binding-id", CLUSTER, "--namespace", NAMESPACE, "--now", NOW_TEXT]
    argv += ["--request", str(requested), "--gpu-recipe-catalog", str(tmp_path / "cm.json")]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["recipe"], plan["image"]) == ("qwen7b-gguf-8k", catalog["recipes"][0]["image"])
