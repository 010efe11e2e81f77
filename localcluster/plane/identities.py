"""Who talks to the local API server: identities, their credentials, kubeconfigs and clients.

Every component and every tmi server under test authenticates as its own user, so the RBAC
rules the project ships are really exercised. An identity is either a user with a client
certificate from the plane's CA or a ServiceAccount with a TokenRequest token; either way it
gets a kubeconfig file (for processes) and cached API clients (for the tests themselves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client as k8s

from localcluster.plane.kube import Kube
from localcluster.plane.pki import CertificateAuthority, KeyPair

# identity -> (Kubernetes user name, groups). The tmi-* users have no rights until the
# project's own RBAC manifests (or a test) bind them.
IDENTITIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("admin", ("system:masters",)),
    "scheduler": ("system:kube-scheduler", ()),
    "kwok": ("kwok", ()),
    "controller-manager": ("system:kube-controller-manager", ()),
    "tmi-webhook": ("tmi-webhook", ()),
    "tmi-extender": ("tmi-extender", ()),
    "tmi-controller": ("tmi-controller", ()),
    "tmi-installer": ("tmi-installer", ()),
}


def _file_name(identity: str) -> str:
    return identity.replace(":", "_")


@dataclass
class Identities:
    """The registered identities and what each has been issued so far."""

    workdir: Path
    ca: CertificateAuthority
    # The API server's URL, once it runs; kubeconfigs and clients point at it.
    server: str = ""
    users: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=lambda: dict(IDENTITIES))
    _kubeconfigs: dict[str, Path] = field(default_factory=dict)
    _client_certs: dict[str, KeyPair] = field(default_factory=dict)
    _tokens: dict[str, str] = field(default_factory=dict)
    _api_clients: list[k8s.ApiClient] = field(default_factory=list)
    _kubes: dict[str, Kube] = field(default_factory=dict)

    def _forget(self, identity: str) -> None:
        self._kubeconfigs.pop(identity, None)
        self._kubes.pop(identity, None)

    def add(self, identity: str, user: str | None = None, groups: Sequence[str] = ()) -> Path:
        """Register (or replace) a certificate identity and return its kubeconfig path."""
        self.users[identity] = (user or identity, tuple(groups))
        self._forget(identity)
        return self.kubeconfig(identity)

    def add_service_account(self, namespace: str, name: str, token: str) -> str:
        """Register the ServiceAccount ``namespace/name`` with ``token``; the identity's name.
        Registering it again replaces the token."""
        identity = f"sa:{namespace}:{name}"
        self._tokens[identity] = token
        self.users[identity] = (
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        )
        self._forget(identity)
        return identity

    def user(self, identity: str) -> str:
        """The Kubernetes user name an identity authenticates as."""
        return self.users[identity][0]

    def client_cert(self, identity: str) -> KeyPair:
        """The identity's client certificate and key, issued on first use."""
        self.kubeconfig(identity)
        return self._client_certs[identity]

    def kubeconfig(self, identity: str = "admin") -> Path:
        """Path of a kubeconfig file that authenticates as ``identity``."""
        cached = self._kubeconfigs.get(identity)
        if cached is not None:
            return cached
        if identity not in self.users:
            raise KeyError(f"unknown identity {identity!r}; add it with add_identity()")
        user, groups = self.users[identity]
        token = self._tokens.get(identity)
        credentials: dict[str, str]
        if token is not None:
            credentials = {"token": token}
        else:
            pair = self.ca.issue_client(f"client-{_file_name(identity)}", user, groups)
            self._client_certs[identity] = pair
            credentials = {
                "client-certificate": str(pair.cert_file),
                "client-key": str(pair.key_file),
            }
        path = self.workdir / "kubeconfig" / f"{_file_name(identity)}.yaml"
        path.parent.mkdir(exist_ok=True)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tmi-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.ca.cert_file),
                    },
                }
            ],
            "users": [{"name": identity, "user": credentials}],
            "contexts": [{"name": identity, "context": {"cluster": "tmi-local", "user": identity}}],
            "current-context": identity,
        }
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        self._kubeconfigs[identity] = path
        return path

    def api_client(self, identity: str = "admin") -> k8s.ApiClient:
        """A ``kubernetes.client.ApiClient`` authenticated as ``identity``."""
        if not self.server:
            raise RuntimeError("the API server is not running")
        token = self._tokens.get(identity)
        if token is not None:
            conf = k8s.Configuration(
                host=self.server,
                ssl_ca_cert=str(self.ca.cert_file),
                api_key={"authorization": token},
                api_key_prefix={"authorization": "Bearer"},
            )
        else:
            pair = self.client_cert(identity)
            conf = k8s.Configuration(
                host=self.server,
                ssl_ca_cert=str(self.ca.cert_file),
                cert_file=str(pair.cert_file),
                key_file=str(pair.key_file),
            )
        api = k8s.ApiClient(conf)
        self._api_clients.append(api)
        return api

    def kube(self, identity: str = "admin") -> Kube:
        """A raw-JSON client (requests, discovery, apply) for ``identity``, one per identity."""
        kube = self._kubes.get(identity)
        if kube is None:
            kube = Kube(self.api_client(identity))
            self._kubes[identity] = kube
        return kube

    def close(self) -> None:
        """Close every client handed out (their connection pools)."""
        for api in self._api_clients:
            api.close()
        self._api_clients.clear()
