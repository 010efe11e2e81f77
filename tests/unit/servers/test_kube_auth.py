"""The controller's API client authenticates with the kubeconfig's bearer token."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocation_controller.kubeapi import HttpKube
from serving.kube import ClientConfigError, load_configuration

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: s3cret-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_bearer_token_from_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    kube = HttpKube.from_kubeconfig(str(path), "kamiwaza")
    assert kube._authorization() == "Bearer s3cret-token"


def test_unparseable_kubeconfig_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: [unterminated\n")
    with pytest.raises(ClientConfigError, match="cannot load the Kubernetes client configuration"):
        load_configuration(str(path))
