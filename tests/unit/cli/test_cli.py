"""Golden tests of the owner CLI: output, errors on stderr, exit statuses, file safety."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from inference_policy.planning.recipes import load_catalog
from kits.profilekit import NOW_TEXT, Owner, catalog_image, request
from localcluster.plane.process import python_module
from tmi_cli.detect import DetectionError
from tmi_cli.main import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    try:
        parsed: Any = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        parsed = out
    return code, parsed, err


@pytest.fixture
def owner_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    key = tmp_path / "owner.pem"
    code, identity, _ = run(capsys, "keygen", "--private-key-out", str(key))
    assert code == 0
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    owner = Owner(load_pem_private_key(key.read_bytes(), None))  # type: ignore[arg-type]
    envelope = tmp_path / "envelope.json"
    envelope.write_text(json.dumps(owner.envelope()))
    return {"key": key, "identity": identity, "owner": owner, "envelope": envelope, "dir": tmp_path}


def test_keygen_file_mode_and_output(owner_files: dict[str, Any]) -> None:
    key: Path = owner_files["key"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    identity = owner_files["identity"]
    assert set(identity) == {"keyId", "publicKey"}
    assert identity["keyId"].startswith("sha256:") and len(identity["keyId"]) == 71


def test_keygen_refuses_existing_path(owner_files: dict[str, Any], capsys: Any) -> None:
    key: Path = owner_files["key"]
    before = key.read_bytes()
    code, out, err = run(capsys, "keygen", "--private-key-out", str(key))
    assert code == 1
    assert out is None
    assert err == f"error: {key} already exists; refusing to replace it\n"
    assert key.read_bytes() == before


@pytest.mark.parametrize("dangling", [True, False])
def test_keygen_never_writes_through_a_symlink(tmp_path: Path, capsys: Any, dangling: bool) -> None:
    target = tmp_path / "target"
    if not dangling:
        target.write_text("precious")
    link = tmp_path / "link.pem"
    link.symlink_to(target)
    code, _, err = run(capsys, "keygen", "--private-key-out", str(link))
    assert code == 1
    assert err.startswith("error: ")
    assert target.exists() is not dangling
    if not dangling:
        assert target.read_text() == "precious"


def test_pubkey_matches_keygen(owner_files: dict[str, Any], capsys: Any) -> None:
    code, identity, _ = run(capsys, "pubkey", "--private-key", str(owner_files["key"]))
    assert code == 0
    assert identity == owner_files["identity"]


def test_pubkey_refuses_non_ed25519(tmp_path: Path, capsys: Any) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "ec.pem"
    path.write_bytes(pem)
    code, _, err = run(capsys, "pubkey", "--private-key", str(path))
    assert code == 1
    assert err == f"error: private key {path} is not an Ed25519 key\n"


def render(capsys: Any, catalog: Path, capability: str) -> tuple[int, Any, str]:
    return run(
        capsys,
        "render-catalog",
        "--catalog",
        str(catalog),
        "--namespace",
        "kamiwaza",
        "--capability",
        capability,
    )


def sign(files: dict[str, Any], capsys: Any, *extra: str) -> tuple[int, Any, str]:
    return run(
        capsys,
        "sign",
        "--envelope",
        str(files["envelope"]),
        "--private-key",
        str(files["key"]),
        "--now",
        NOW_TEXT,
        *extra,
    )


def test_sign_then_verify(owner_files: dict[str, Any], capsys: Any) -> None:
    code, configmap, _ = sign(owner_files, capsys)
    assert code == 0
    assert configmap["immutable"] is True
    bundle = owner_files["dir"] / "cm.json"
    bundle.write_text(json.dumps(configmap))
    code, summary, _ = run(
        capsys,
        "verify",
        "--bundle",
        str(bundle),
        "--owner-public-key",
        owner_files["identity"]["publicKey"],
        "--cluster-binding-id",
        "demo-cluster",
        "--namespace",
        "kamiwaza",
        "--now",
        NOW_TEXT,
    )
    assert code == 0
    assert summary["verified"] is True
    assert summary["version"] == 1
    assert summary["bundleSha256"] == configmap["data"]["bundle.sha256"]


def test_sign_refuses_expired(owner_files: dict[str, Any], capsys: Any) -> None:
    code, out, err = run(
        capsys,
        "sign",
        "--envelope",
        str(owner_files["envelope"]),
        "--private-key",
        str(owner_files["key"]),
        "--now",
        "2030-01-01T00:00:00Z",
    )
    assert code == 1
    assert out is None
    assert err.splitlines()[0] == (
        "error: signed bundle would be refused: invalid inference profile authorization: "
        "bundle is expired or its window is empty"
    )


def test_sign_refuses_schema_error_naming_the_field(
    owner_files: dict[str, Any], capsys: Any
) -> None:
    envelope = json.loads(owner_files["envelope"].read_text())
    envelope["profiles"][1]["bindings"][0]["nodeSelector"]["gpu"] = "yes"
    owner_files["envelope"].write_text(json.dumps(envelope))
    code, _, err = sign(owner_files, capsys)
    assert code == 1
    assert err.startswith("error: signed bundle would be refused: ")
    assert "profiles[1].bindings[0].nodeSelector" in err


def test_sign_refuses_other_key(owner_files: dict[str, Any], capsys: Any) -> None:
    envelope = json.loads(owner_files["envelope"].read_text())
    envelope["keyId"] = Owner().key_id
    owner_files["envelope"].write_text(json.dumps(envelope))
    code, _, err = sign(owner_files, capsys)
    assert code == 1
    assert "bundle is signed by a key this cluster does not trust" in err


def test_sign_refuses_malformed_json(owner_files: dict[str, Any], capsys: Any) -> None:
    owner_files["envelope"].write_text('{"version": 1, "version": 2}')
    code, _, err = sign(owner_files, capsys)
    assert code == 1
    assert "duplicate key 'version'" in err


def test_verify_refusal(owner_files: dict[str, Any], capsys: Any) -> None:
    _, configmap, _ = sign(owner_files, capsys)
    bundle = owner_files["dir"] / "cm.json"
    bundle.write_text(json.dumps(configmap))
    code, out, err = run(
        capsys,
        "verify",
        "--bundle",
        str(bundle),
        "--owner-public-key",
        Owner().public_key,
        "--cluster-binding-id",
        "demo-cluster",
        "--namespace",
        "kamiwaza",
        "--now",
        NOW_TEXT,
    )
    assert code == 1
    assert out == {
        "status": 503,
        "detail": "owner profile bundle: invalid inference profile "
        "authorization: bundle is signed by a key this cluster does not trust",
    }
    assert err.startswith("error: invalid inference profile authorization:")


def test_verify_bad_public_key_is_usage_error(owner_files: dict[str, Any], capsys: Any) -> None:
    _, configmap, _ = sign(owner_files, capsys)
    bundle = owner_files["dir"] / "cm.json"
    bundle.write_text(json.dumps(configmap))
    code, _, err = run(
        capsys,
        "verify",
        "--bundle",
        str(bundle),
        "--owner-public-key",
        "AAAA",
        "--cluster-binding-id",
        "c",
        "--namespace",
        "kamiwaza",
    )
    assert code == 2
    assert err.startswith("error: --owner-public-key:")


def plan_args(files: dict[str, Any], capsys: Any, req: dict[str, Any], *extra: str) -> list[str]:
    _, configmap, _ = sign(files, capsys)
    bundle = files["dir"] / "cm.json"
    bundle.write_text(json.dumps(configmap))
    path = files["dir"] / "request.json"
    path.write_text(json.dumps(req))
    return [
        "plan",
        "--bundle",
        str(bundle),
        "--owner-public-key",
        files["identity"]["publicKey"],
        "--cluster-binding-id",
        "demo-cluster",
        "--namespace",
        "kamiwaza",
        "--request",
        str(path),
        "--now",
        NOW_TEXT,
        *extra,
    ]


def test_plan_exit_statuses(owner_files: dict[str, Any], capsys: Any) -> None:
    code, body, _ = run(capsys, *plan_args(owner_files, capsys, request()))
    assert (code, body["status"], body["bindingId"]) == (0, 200, "nvidia-mig-3g40gb-amd64")
    code, body, _ = run(capsys, *plan_args(owner_files, capsys, request("mlx")))
    assert (code, body["status"]) == (1, 422)
    args = plan_args(owner_files, capsys, request())
    args[args.index("--cluster-binding-id") + 1] = "other"
    code, body, _ = run(capsys, *args)
    assert (code, body["status"]) == (3, 503)


def test_plan_reads_stdin(owner_files: dict[str, Any], capsys: Any, monkeypatch: Any) -> None:
    args = plan_args(owner_files, capsys, request())
    args[args.index("--request") + 1] = "-"
    stdin = io.TextIOWrapper(
        io.BytesIO(json.dumps(request("whispercpp", model__format="checkpoint")).encode())
    )
    monkeypatch.setattr(sys, "stdin", stdin)
    code, body, _ = run(capsys, *args)
    assert code == 0
    assert body["path"] == "cpu"


def test_plan_disabled_needs_no_bundle(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(request()))
    code, body, _ = run(capsys, "plan", "--request", str(path), "--disabled")
    assert code == 1
    assert body == {
        "status": 422,
        "detail": "Core cannot see a GPU on this install",
        "code": "tenant-mode-off",
    }


def test_plan_missing_flags_is_usage_error(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(request()))
    code, _, err = run(capsys, "plan", "--request", str(path))
    assert code == 2
    assert err.startswith("error: --bundle, --owner-public-key")


def test_plan_with_image_map(owner_files: dict[str, Any], capsys: Any) -> None:
    image_map = owner_files["dir"] / "map.json"
    image_map.write_text(json.dumps({"ghcr.io/old/x@sha256:" + "1" * 64: "r/x@sha256:" + "2" * 64}))
    code, body, _ = run(
        capsys, *plan_args(owner_files, capsys, request(), "--engine-image-map", str(image_map))
    )
    assert code == 3
    assert body == {
        "status": 503,
        "detail": "engine image map carries no image from this release's catalog",
        "code": "image-map",
    }


def test_usage_errors(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan"])
    assert exit_info.value.code == 2
    assert "error: the following arguments are required: --request" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2


def test_catalog_tsv(capsys: Any) -> None:
    assert main(["catalog"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split("\t") for line in lines]
    assert all(len(row) == 5 for row in rows)
    assert [
        "llamacpp",
        "nvidia",
        "amd64",
        "13",
        catalog_image("llamacpp", "nvidia", "amd64", 13),
    ] in rows
    assert ["whispercpp", "cpu", "arm64", "-", catalog_image("whispercpp", "cpu", "arm64")] in rows
    assert {row[0] for row in rows} == {"llamacpp", "vllm", "diffusion", "whispercpp"}
    assert not any(row[0] == "diffusion" and row[2] == "arm64" for row in rows)


RECIPES = {
    "schemaVersion": 1,
    "capability": "gpu",
    "recipes": [
        {
            "id": "qwen-8k",
            "engine": "llamacpp",
            "model": "Qwen/Qwen2.5-7B-Instruct-GGUF",
            "match": {"max_model_len": 8192},
            "variantId": "llamacpp-nvidia-amd64",
            "image": catalog_image("llamacpp", "nvidia", "amd64", 13),
        }
    ],
}


def test_render_catalog(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "gpu-recipes.json"
    path.write_text(json.dumps(RECIPES, indent=2))
    code, configmap, _ = render(capsys, path, "gpu")
    assert code == 0
    digest = configmap["data"]["catalog.sha256"]
    assert configmap["metadata"]["name"] == f"kamiwaza-inference-gpu-recipes-{digest}"
    assert configmap["immutable"] is True
    assert configmap["metadata"]["annotations"]["kamiwaza.ai/catalog-sha256"] == digest
    assert load_catalog(configmap, "gpu").recipes[0].id == "qwen-8k"
    code, again, _ = render(capsys, path, "gpu")
    assert again == configmap


def test_render_catalog_refuses_wrong_capability_and_bad_recipes(
    tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(RECIPES))
    code, _, err = render(capsys, path, "cpu")
    assert code == 1
    assert "capability is 'gpu', not 'cpu'" in err
    bad = json.loads(json.dumps(RECIPES))
    bad["recipes"][0]["image"] = "ghcr.io/x:latest"
    path.write_text(json.dumps(bad))
    code, _, err = render(capsys, path, "gpu")
    assert code == 1
    assert "recipes[0].image" in err


def test_plan_with_rendered_recipe_catalog(owner_files: dict[str, Any], capsys: Any) -> None:
    path = owner_files["dir"] / "gpu-recipes.json"
    path.write_text(json.dumps(RECIPES))
    _, configmap, _ = render(capsys, path, "gpu")
    rendered = owner_files["dir"] / "gpu-catalog.json"
    rendered.write_text(json.dumps(configmap))
    code, body, _ = run(
        capsys, *plan_args(owner_files, capsys, request(), "--gpu-recipe-catalog", str(rendered))
    )
    assert code == 0
    assert body["recipe"] == "qwen-8k"


def test_detect_without_gpu_fails_clearly(capsys: Any, monkeypatch: Any) -> None:
    import tmi_cli.main as cli

    def no_gpu(*_: Any, **__: Any) -> Any:
        raise DetectionError("no NVIDIA driver found: NVML and nvidia-smi are unavailable")

    monkeypatch.setattr(cli, "detect_accelerator", no_gpu)
    code, out, err = run(capsys, "detect")
    assert code == 1
    assert out is None
    assert err == "error: no NVIDIA driver found: NVML and nvidia-smi are unavailable\n"


def test_console_script_module_runs() -> None:
    import subprocess

    result = subprocess.run(
        [*python_module("tmi_cli"), "catalog"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == 0
    assert (
        result.stdout.count("\n")
        == len(Path("inference_policy/data/engine-catalog.json").read_text().split('"image":')) - 1
    )


H200_BLOCK = {"accelerator": {"vendor": "nvidia", "computeCapability": "9.0"}}


@pytest.mark.parametrize(
    ("toml", "found", "envvar", "mounts"),
    [
        (None, False, True, False),
        ("[nvidia-container-runtime]\nmode = 'auto'\n", True, True, False),
        (
            "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
            "accept-nvidia-visible-devices-as-volume-mounts = true\n",
            True,
            False,
            True,
        ),
    ],
    ids=["toolkit-defaults", "config-without-the-keys", "envvar-refused"],
)
def test_detect_reports_the_container_toolkit(
    capsys: Any,
    monkeypatch: Any,
    tmp_path: Path,
    toml: str | None,
    found: bool,
    envvar: bool,
    mounts: bool,
) -> None:
    import tmi_cli.main as cli

    monkeypatch.setattr(cli, "detect_accelerator", lambda *_, **__: dict(H200_BLOCK))
    config = tmp_path / "config.toml"
    if toml is not None:
        config.write_text(toml)
    code, out, _ = run(capsys, "detect", "--container-toolkit", f"--toolkit-config={config}")
    assert code == 0
    assert out == {
        **H200_BLOCK,
        "containerToolkit": {
            "configFile": str(config),
            "configFound": found,
            "acceptEnvvarWhenUnprivileged": envvar,
            "acceptVolumeMounts": mounts,
            "imageEnvironmentSelectsGpus": envvar,
        },
    }
    # Without the flag the output is the seed's block alone.
    code, out, _ = run(capsys, "detect")
    assert (code, out) == (0, H200_BLOCK)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "accept-nvidia-visible-devices-envvar-when-unprivileged = 'no'\n",
            "must be true or false",
        ),
        ("this is = = not toml\n", "is not TOML"),
    ],
)
def test_detect_refuses_an_unreadable_toolkit_config(
    capsys: Any, monkeypatch: Any, tmp_path: Path, toml: str, message: str
) -> None:
    import tmi_cli.main as cli

    monkeypatch.setattr(cli, "detect_accelerator", lambda *_, **__: dict(H200_BLOCK))
    config = tmp_path / "config.toml"
    config.write_text(toml)
    code, out, err = run(capsys, "detect", "--container-toolkit", f"--toolkit-config={config}")
    assert code == 1 and out is None
    assert message in err


def test_remove_webhooks_deletes_only_a_configuration_for_its_namespace_alone() -> None:
    from tmi_cli.cleanup_command import selects_only

    def entry(*names: str) -> dict[str, Any]:
        return {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kamiwaza.ai/tenant-inference", "operator": "In", "values": ["on"]},
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [*names]},
                ]
            }
        }

    assert selects_only({"webhooks": [entry("team-a")]}, "team-a")
    assert selects_only({"webhooks": [entry("team-a"), entry("team-a")]}, "team-a")
    assert not selects_only({"webhooks": [entry("team-a")]}, "team-b")
    assert not selects_only({"webhooks": [entry("team-a", "team-b")]}, "team-a")
    assert not selects_only({"webhooks": [entry("team-a"), {"namespaceSelector": {}}]}, "team-a")
    assert not selects_only({"webhooks": []}, "team-a")
