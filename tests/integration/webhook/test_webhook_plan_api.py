"""POST /v1/plan gives exactly the decision `tmi plan` gives on the same inputs.

Both run here on the same files: the signed ConfigMap, the request and the relocation settings.
The CLI's exit status is checked against the HTTP status too (0 for 200, 1 for 4xx, 3 for 5xx).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pytest_aiohttp import AiohttpClient

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from kits.profilekit import CLUSTER, EXAMPLES, NAMESPACE, NOW_TEXT, Owner, catalog_image, request
from kits.webhookkit import published, webhook_app
from tmi_cli.main import main as tmi_main

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    (path.stem, json.loads(path.read_text())) for path in sorted(EXAMPLES.glob("request-*.json"))
] + [
    ("force-cpu", request(config__force_cpu=True)),
    ("vllm-7b", request(engine="vllm")),
    ("diffusion", request(engine="diffusion")),
    ("embedding-without-pooling", request(config__embedding=True, config__pooling=None)),
    ("no-context", request(config__max_model_len=None, model__contextLength=None)),
    ("malformed", {"schemaVersion": 1, "engine": 7}),
    ("external-with-block", request(external=True, inferenceResources={"schemaVersion": 1})),
    (
        "own-block",
        request(
            inferenceResources={
                "schemaVersion": 1,
                "accelerator": {
                    "capability": "gpu",
                    "count": 1,
                    "memory": {"minimum": "500Gi"},
                    "isolation": "any-qualified",
                },
                "runtime": {"selection": "automatic"},
            }
        ),
    ),
]

VARIANTS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("defaults", {}, []),
    (
        "registry-prefix",
        {"image_registry_prefix": "registry.example.com/mirror"},
        ["--image-registry-prefix", "registry.example.com/mirror"],
    ),
    (
        "airgap",
        {"airgap_registry": "https://airgap.example.com:5000"},
        ["--airgap-registry", "https://airgap.example.com:5000"],
    ),
]


def _tmi_plan(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    status = tmi_main(["plan", *args, "--now", NOW_TEXT])
    out = capsys.readouterr().out
    return status, json.loads(out)


def _exit_for(status: int) -> int:
    return 0 if status == 200 else 3 if status >= 500 else 1


@pytest.mark.parametrize(("variant", "settings", "flags"), VARIANTS, ids=[v[0] for v in VARIANTS])
async def test_plan_api_matches_tmi_plan(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    aiohttp_client: AiohttpClient,
    variant: str,
    settings: dict[str, Any],
    flags: list[str],
) -> None:
    owner = Owner()
    configmap = owner.sign()
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(configmap))
    app, _, _ = webhook_app(
        owner, configmaps={DEFAULT_CONFIGMAP_NAME: published(configmap)}, **settings
    )
    client = await aiohttp_client(app)
    common = [
        "--bundle",
        str(bundle),
        "--owner-public-key",
        owner.public_key,
        "--cluster-binding-id",
        CLUSTER,
        "--namespace",
        NAMESPACE,
        *flags,
    ]
    statuses = set()
    for name, body in REQUESTS:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(body))
        exit_status, cli = _tmi_plan(capsys, [*common, "--request", str(path)])
        resp = await client.post("/v1/plan", json=body)
        api = await resp.json()
        assert api == cli, name
        assert resp.status == api["status"], name
        assert exit_status == _exit_for(resp.status), name
        statuses.add(resp.status)
    assert statuses == {200, 422}


async def test_plan_api_matches_tmi_plan_for_a_foreign_image_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aiohttp_client: AiohttpClient
) -> None:
    owner = Owner()
    configmap = owner.sign()
    (tmp_path / "bundle.json").write_text(json.dumps(configmap))
    foreign = {"ghcr.io/other/llamacpp@sha256:" + "0" * 64: "r.example/x@sha256:" + "1" * 64}
    (tmp_path / "map.json").write_text(json.dumps(foreign))
    (tmp_path / "req.json").write_text(json.dumps(request()))
    app, _, _ = webhook_app(
        owner, configmaps={DEFAULT_CONFIGMAP_NAME: published(configmap)}, engine_image_map=foreign
    )
    client = await aiohttp_client(app)
    exit_status, cli = _tmi_plan(
        capsys,
        [
            "--bundle", str(tmp_path / "bundle.json"),
            "--owner-public-key", owner.public_key,
            "--cluster-binding-id", CLUSTER,
            "--namespace", NAMESPACE,
            "--engine-image-map", str(tmp_path / "map.json"),
            "--request", str(tmp_path / "req.json"),
        ],
    )  # fmt: skip
    resp = await client.post("/v1/plan", json=request())
    assert await resp.json() == cli
    assert cli == {
        "status": 503,
        "detail": "engine image map carries no image from this release's catalog",
        "code": "image-map",
    }
    assert resp.status == 503 and exit_status == 3


async def test_plan_api_matches_tmi_plan_with_tenant_mode_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aiohttp_client: AiohttpClient
) -> None:
    owner = Owner()
    app, _, _ = webhook_app(owner, enabled=False)
    client = await aiohttp_client(app)
    for body in (request(), request(config__force_cpu=True)):
        (tmp_path / "req.json").write_text(json.dumps(body))
        _, cli = _tmi_plan(capsys, ["--disabled", "--request", str(tmp_path / "req.json")])
        resp = await client.post("/v1/plan", json=body)
        assert await resp.json() == cli


async def test_plan_api_image_map_relocates(aiohttp_client: AiohttpClient) -> None:
    owner = Owner()
    source = catalog_image("llamacpp", "nvidia", "amd64", 13)
    target = "mirror.example.com/llamacpp-cuda13@sha256:" + "a" * 64
    app, _, _ = webhook_app(owner, engine_image_map={source: target})
    client = await aiohttp_client(app)
    resp = await client.post("/v1/plan", json=request())
    assert resp.status == 200
    assert (await resp.json())["image"] == target
    resp = await client.post("/v1/plan", json=request(engine="vllm"))
    assert (await resp.json())["detail"] == (
        "cannot derive inference resources for this deployment: engine 'vllm' is not "
        "qualified in this release"
    )


async def test_plan_api_refuses_a_body_that_is_not_json(aiohttp_client: AiohttpClient) -> None:
    app, _, _ = webhook_app(Owner())
    client = await aiohttp_client(app)
    resp = await client.post("/v1/plan", data=b'{"engine": "a", "engine": "b"}')
    assert resp.status == 400
    body = await resp.json()
    assert "duplicate key" in body["detail"]
    # The runbook's code, as every refusal carries it; one that breaks the schema is a 422.
    assert body["code"] == "request-invalid"
    resp = await client.post("/v1/plan", json={"schemaVersion": 1, "engine": 7})
    assert resp.status == 422
    assert (await resp.json())["code"] == "request-invalid"
