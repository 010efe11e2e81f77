"""What the servers share for the API server: client configuration, errors, backoff, and the
informer's pure parts (collection paths and keys, duplicate detection)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.apiserver import from_kubeconfig
from serving.informer import Collection, ObjectStore, same_revision
from serving.kube import (
    ApiError,
    Backoff,
    ClientConfigError,
    Conflict,
    Gone,
    NotFound,
    api_error,
    describe_error,
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
    api = from_kubeconfig(str(tmp_path / "kc"))
    assert api.server == "https://api.example:6443"
    assert api._authorization() == "Bearer secret-token"


def test_an_unusable_configuration_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ClientConfigError, match=r"configuration from .*/missing: "):
        from_kubeconfig(str(tmp_path / "missing"))
    (tmp_path / "no-context").write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(ClientConfigError, match="no-context"):
        load_configuration(str(tmp_path / "no-context"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClientConfigError, match="the in-cluster service account"):
        load_configuration(None)


def test_status_codes_become_specific_errors() -> None:
    assert type(api_error(404)) is NotFound
    assert type(api_error(409, "Conflict")) is Conflict
    assert type(api_error(410, "Expired", "too old resource version")) is Gone
    other = api_error(500, "InternalError", "etcd")
    assert type(other) is ApiError and other.status == 500 and "etcd" in str(other)


def test_collections_have_paths_and_keys_by_scope() -> None:
    pods = Collection("pods", "Pod", "kamiwaza", label_selector="app")
    assert pods.path == "/api/v1/namespaces/kamiwaza/pods"
    assert pods.params() == {"labelSelector": "app"}
    assert pods.key({"metadata": {"name": "p", "namespace": "kamiwaza"}}) == "p"
    everywhere = Collection("pods", "Pod")
    assert everywhere.path == "/api/v1/pods"
    assert everywhere.key({"metadata": {"name": "p", "namespace": "a"}}) == "a/p"
    assert Collection("nodes", "Node").key({"metadata": {"name": "n1"}}) == "n1"
    leases = Collection("leases", "Lease", "ns", api_version="coordination.k8s.io/v1")
    assert leases.path == "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
    assert pods.key({"metadata": "not an object"}) is None


def test_duplicates_are_the_same_uid_and_version_compared_as_text() -> None:
    def obj(uid: str, version: str) -> dict[str, object]:
        return {"metadata": {"name": "x", "uid": uid, "resourceVersion": version}}

    assert same_revision(obj("u1", "10"), obj("u1", "10"))
    # Opaque: "010" is not "10", and a lower-looking version is still a different one.
    assert not same_revision(obj("u1", "010"), obj("u1", "10"))
    assert not same_revision(obj("u1", "9"), obj("u1", "10"))
    assert not same_revision(obj("u2", "10"), obj("u1", "10"))
    assert not same_revision(None, obj("u1", "10"))


def test_write_through_only_replaces_the_same_object() -> None:
    store = ObjectStore(Collection("pods", "Pod", "ns").key)
    store.put({"metadata": {"name": "p", "uid": "u1", "resourceVersion": "5"}})
    store.write_through({"metadata": {"name": "p", "uid": "u1", "resourceVersion": "7"}})
    assert store.get("p") == {"metadata": {"name": "p", "uid": "u1", "resourceVersion": "7"}}
    store.write_through({"metadata": {"name": "p", "uid": "u2", "resourceVersion": "8"}})
    store.write_through({"metadata": {"name": "q", "uid": "u3", "resourceVersion": "9"}})
    assert store.names() == ["p"] and store.get("p")["metadata"]["uid"] == "u1"  # type: ignore[index]


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
