"""The servers' credentials for the API server, read without the official client.

Importing `kubernetes` costs each server about 9 MiB of resident memory beyond the libraries
it shares with the server (its generated models; 32 MiB in a bare interpreter), and the servers
use it for nothing but reading credentials (`bench/bench_peer.py` measures each server's
memory beside HAMi's). What they run with is read here instead: the
in-cluster service account (the API server's address from the environment, the CA and the
bound token from the mounted files, the token re-read as the kubelet rotates it) and the
kubeconfig shapes a server is started with (a CA, a client certificate, a token or a token
file, inline or by path, paths relative to the file). A kubeconfig whose user needs more (an
exec plugin, an auth provider, a username) is handed to the official loader
(`serving.kube.load_configuration`), imported only then, so nothing is lost. Either way the
result is one `Credentials`, and a configuration that cannot be used is a `ClientConfigError`
naming what is wrong.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serving.kube import ClientConfigError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The official client re-reads a projected token at most this often; the kubelet renews it
# well before it expires.
TOKEN_REREAD_SECONDS = 60.0
# User fields only the official loader understands.
DELEGATED_USER_FIELDS = ("exec", "auth-provider", "username", "password")


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who this server is to it."""

    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    token: Callable[[], str | None] = lambda: None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings for an https server (None for plain http)."""
        if not self.server.startswith("https"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def authorization(self) -> str | None:
        token = self.token()
        return f"Bearer {token}" if token else None


class _TokenFile:
    """A token read from a file, again once `TOKEN_REREAD_SECONDS` have passed."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.value = self._read()
        self.read_at = clock()

    def _read(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError as exc:
            raise ClientConfigError(f"cannot read the token file {self.path}: {exc}") from None

    def __call__(self) -> str | None:
        if self.clock() - self.read_at >= TOKEN_REREAD_SECONDS:
            # The last token stands until the file can be read again.
            with contextlib.suppress(ClientConfigError):
                self.value = self._read()
            self.read_at = self.clock()
        return self.value


def load_credentials(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None
) -> Credentials:
    """From a kubeconfig file, or the in-cluster service account (None)."""
    if kubeconfig:
        return _from_kubeconfig(Path(kubeconfig))
    return _in_cluster(os.environ if environ is None else environ, SERVICE_ACCOUNT)


def _in_cluster(environ: Mapping[str, str], mount: Path) -> Credentials:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ClientConfigError(
            "cannot load the Kubernetes client configuration from the in-cluster service "
            "account: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a "
            "Pod? pass --kubeconfig)"
        )
    if not (mount / "ca.crt").is_file():
        raise ClientConfigError(
            "cannot load the Kubernetes client configuration from the in-cluster service "
            f"account: {mount / 'ca.crt'} does not exist (automountServiceAccountToken off?)"
        )
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Credentials(server, ca_file=str(mount / "ca.crt"), token=_TokenFile(mount / "token"))


def _named(document: Mapping[str, Any], kind: str, name: str, where: Path) -> Mapping[str, Any]:
    for entry in document.get(kind + "s") or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            body = entry.get(kind)
            return body if isinstance(body, Mapping) else {}
    raise ClientConfigError(
        f"cannot load the Kubernetes client configuration from {where}: no {kind} named {name!r}"
    )


def _from_kubeconfig(path: Path) -> Credentials:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClientConfigError(
            f"cannot load the Kubernetes client configuration from {path}: {exc}"
        ) from None
    if not isinstance(document, Mapping):
        raise ClientConfigError(
            f"cannot load the Kubernetes client configuration from {path}: not a kubeconfig"
        )
    current = document.get("current-context")
    if not isinstance(current, str) or not current:
        raise ClientConfigError(
            f"cannot load the Kubernetes client configuration from {path}: no current-context"
        )
    context = _named(document, "context", current, path)
    cluster = _named(document, "cluster", str(context.get("cluster", "")), path)
    user = (
        _named(document, "user", str(context.get("user", "")), path) if context.get("user") else {}
    )
    if any(field in user for field in DELEGATED_USER_FIELDS):
        return _delegated(path)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise ClientConfigError(
            f"cannot load the Kubernetes client configuration from {path}: cluster "
            f"{context.get('cluster')!r} names no server"
        )
    base = path.parent
    ca_data = _inline(cluster, "certificate-authority-data", path)
    token: Callable[[], str | None] = lambda: None  # noqa: E731
    if isinstance(user.get("token"), str):
        fixed = str(user["token"])
        token = lambda: fixed  # noqa: E731
    elif isinstance(user.get("tokenFile"), str):
        token = _TokenFile(_relative(base, user["tokenFile"]))
    cert_file = _file_or_data(user, "client-certificate", base, path)
    key_file = _file_or_data(user, "client-key", base, path)
    ca_file = (
        _relative(base, cluster["certificate-authority"])
        if isinstance(cluster.get("certificate-authority"), str)
        else None
    )
    return Credentials(
        server,
        ca_file=str(ca_file) if ca_file else None,
        ca_data=ca_data,
        cert_file=cert_file,
        key_file=key_file,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=token,
    )


def _relative(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _inline(section: Mapping[str, Any], key: str, where: Path) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise ClientConfigError(
            f"cannot load the Kubernetes client configuration from {where}: {key} is not "
            "base64-encoded PEM"
        ) from None


def _file_or_data(user: Mapping[str, Any], key: str, base: Path, where: Path) -> str | None:
    """A path to the PEM `ssl` loads: the kubeconfig's file, or its inline data written to a
    private file (as the official client does: `load_cert_chain` reads files only)."""
    if isinstance(user.get(key), str):
        return str(_relative(base, user[key]))
    data = _inline(user, key + "-data", where)
    if data is None:
        return None
    handle, name = tempfile.mkstemp(prefix="tmi-credential-", suffix=".pem")
    with os.fdopen(handle, "w") as out:
        out.write(data)
    return name


def _delegated(path: Path) -> Credentials:
    from serving.kube import load_configuration  # noqa: PLC0415 - the official loader, only here

    configuration = load_configuration(str(path))
    return Credentials(
        str(configuration.host),
        ca_file=configuration.ssl_ca_cert or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        insecure=not configuration.verify_ssl,
        token=lambda: _bearer(
            configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        ),
    )


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    return header.removeprefix("Bearer ").strip() or None


__all__ = ["Credentials", "load_credentials"]
