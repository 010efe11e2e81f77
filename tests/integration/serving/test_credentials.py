"""The servers' credentials (`serving.credentials`) against a real TLS server: a kubeconfig's CA,
client certificate and token, inline or by path, reach the API server as they name them; the
in-cluster account's token is re-read as the kubelet rotates it; a kubeconfig only the official
client understands is handed to it; and what cannot be used is one clear error."""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml
from aiohttp import web

from serving import credentials as creds
from serving.apiserver import ApiClient
from serving.kube import ClientConfigError


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def server(ca: trustme.CA) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An https server that requires a client certificate from `ca` and records each request's
    Authorization header and client certificate subject."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        seen.append({"authorization": request.headers.get("Authorization"), "peer": peer})
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_get("/version", handle)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_OPTIONAL
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://127.0.0.1:{port}", seen
    await runner.cleanup()


def _kubeconfig(tmp: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(document))
    return path


async def _get(kubeconfig: Path) -> None:
    client = ApiClient(**ApiClient.options(str(kubeconfig)))
    try:
        await client.request("GET", "/version")
    finally:
        await client.close()


async def test_inline_ca_and_client_certificate_reach_the_server(
    tmp_path: Path, ca: trustme.CA, server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = server
    client_cert = ca.issue_cert("tmi-extender@example.invalid")
    path = _kubeconfig(
        tmp_path,
        {"server": url, "certificate-authority-data": _b64(ca.cert_pem.bytes())},
        {
            "client-certificate-data": _b64(client_cert.cert_chain_pems[0].bytes()),
            "client-key-data": _b64(client_cert.private_key_pem.bytes()),
        },
    )
    await _get(path)
    assert seen[-1]["authorization"] is None
    # The server verified the client certificate the kubeconfig carries inline.
    assert ("email", "tmi-extender@example.invalid") in seen[-1]["peer"]["subjectAltName"]


async def test_files_relative_to_the_kubeconfig_and_a_token(
    tmp_path: Path, ca: trustme.CA, server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = server
    (tmp_path / "pki").mkdir()
    ca.cert_pem.write_to_path(str(tmp_path / "pki" / "ca.crt"))
    path = _kubeconfig(
        tmp_path, {"server": url, "certificate-authority": "pki/ca.crt"}, {"token": "s3cret"}
    )
    await _get(path)
    assert seen[-1]["authorization"] == "Bearer s3cret"
    assert seen[-1]["peer"] is None


async def test_a_server_whose_ca_is_not_named_is_refused(
    tmp_path: Path, server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, _ = server
    path = _kubeconfig(tmp_path, {"server": url}, {"token": "t"})
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _get(path)


def test_a_token_file_is_reread_as_it_rotates(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [0.0]
    read = creds._TokenFile(token, clock=lambda: now[0])
    assert read() == "first"
    token.write_text("second")
    now[0] = creds.TOKEN_REREAD_SECONDS - 1
    assert read() == "first"
    now[0] = creds.TOKEN_REREAD_SECONDS
    assert read() == "second"
    token.unlink()
    now[0] = 3 * creds.TOKEN_REREAD_SECONDS
    assert read() == "second"  # unreadable for now: the last token stands


def test_the_in_cluster_account_from_the_environment_and_the_mount(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("pem")
    (tmp_path / "token").write_text("bound-token")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = creds._in_cluster(env, tmp_path)
    assert found.server == "https://[fd00::1]:443"
    assert found.ca_file == str(tmp_path / "ca.crt")
    assert found.authorization() == "Bearer bound-token"
    with pytest.raises(ClientConfigError, match="KUBERNETES_SERVICE_HOST"):
        creds._in_cluster({}, tmp_path)
    with pytest.raises(ClientConfigError, match="automountServiceAccountToken"):
        creds._in_cluster(env, tmp_path / "absent")


def test_an_exec_user_goes_to_the_official_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    class Configuration:
        host = "https://api.example.invalid"
        ssl_ca_cert = "/ca.crt"
        cert_file = None
        key_file = None
        verify_ssl = True

        def get_api_key_with_prefix(self, key: str, alias: str) -> str:
            return "Bearer from-plugin"

    def load(path: str | None) -> Configuration:
        asked.append(str(path))
        return Configuration()

    monkeypatch.setattr("serving.kube.load_configuration", load)
    path = _kubeconfig(
        tmp_path, {"server": "https://ignored"}, {"exec": {"command": "aws", "apiVersion": "x"}}
    )
    found = creds.load_credentials(str(path))
    assert asked == [str(path)]
    assert found.server == "https://api.example.invalid"
    assert found.authorization() == "Bearer from-plugin"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("clusters: [unterminated\n", "cannot load the Kubernetes client configuration"),
        ("- a list\n", "not a kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", "no current-context"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n",
            "no cluster named 'c'",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {}}]\n",
            "names no server",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://a', "
            "certificate-authority-data: '%%%'}}]\n",
            "not base64-encoded PEM",
        ),
    ],
)
def test_an_unusable_kubeconfig_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(ClientConfigError, match=message):
        creds.load_credentials(str(path))


def test_a_missing_kubeconfig_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="absent"):
        creds.load_credentials(str(tmp_path / "absent"))
