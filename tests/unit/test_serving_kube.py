"""What the servers share for the API server: client configuration, list items, errors, backoff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.kube import (
    Backoff,
    ClientConfigError,
    as_configmap,
    describe_error,
    kubernetes_api,
    load_configuration,
)


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def test_a_kubeconfig_is_loaded_when_the_server_starts(tmp_path: Path) -> None:
    configuration = load_configuration(
        str(_kubeconfig(tmp_path / "kc", "https://api.example:6443"))
    )
    assert configuration.host == "https://api.example:6443"
    api = kubernetes_api(str(tmp_path / "kc"))()
    assert api.api_client.configuration.host == "https://api.example:6443"


def test_an_unusable_configuration_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ClientConfigError, match=r"configuration from .*/missing: "):
        kubernetes_api(str(tmp_path / "missing"))
    (tmp_path / "no-context").write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(ClientConfigError, match="no-context"):
        load_configuration(str(tmp_path / "no-context"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClientConfigError, match="the in-cluster service account"):
        load_configuration(None)


def test_list_items_become_whole_configmaps() -> None:
    item = {"metadata": {"name": "p"}, "data": {}}
    assert as_configmap(item) == {
        "metadata": {"name": "p"},
        "data": {},
        "apiVersion": "v1",
        "kind": "ConfigMap",
    }
    assert as_configmap({"kind": "ConfigMap", "apiVersion": "v1"}) == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
    }
    assert as_configmap(None) is None
    assert as_configmap(["not", "an", "object"]) is None


def test_errors_are_described_by_their_status_when_they_have_one() -> None:
    class ApiException(Exception):
        status = 403
        reason = "Forbidden"

    assert describe_error(ApiException()) == "HTTP 403 Forbidden"
    assert describe_error(TimeoutError("read timed out")) == "TimeoutError: read timed out"


def test_backoff_doubles_to_its_ceiling_with_jitter_and_starts_over_after_success() -> None:
    backoff = Backoff(1.0, 4.0)
    delays = []
    for _ in range(4):
        delays.append(backoff.delay)
        wait = backoff.next()
        assert 0.5 * delays[-1] <= wait <= 1.5 * delays[-1]
    assert delays == [1.0, 2.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.delay == 1.0
