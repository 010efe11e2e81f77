"""manifests/installer: the seed's installer identity as the owner applies it, the same Role
the tests' installer holds (`localcluster.install.install.DELEGATION_RULES`), admin in the namespace
only, and nothing cluster-scoped."""

from __future__ import annotations

from pathlib import Path

import yaml

from localcluster.install.install import DELEGATION_ROLE, DELEGATION_RULES

MANIFEST = (
    Path(__file__).resolve().parents[3] / "manifests" / "installer" / "kamiwaza-installer.yaml"
)


def test_the_shipped_installer_is_the_tested_one() -> None:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["Role", "RoleBinding", "RoleBinding", "ServiceAccount"]
    assert {d["metadata"]["namespace"] for d in docs} == {"kamiwaza"}
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["metadata"]["name"] == DELEGATION_ROLE
    assert role["rules"] == DELEGATION_RULES
    bindings = {d["roleRef"]["name"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert bindings["admin"]["roleRef"]["kind"] == "ClusterRole"
    assert bindings[DELEGATION_ROLE]["roleRef"]["kind"] == "Role"
    for binding in bindings.values():
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kamiwaza-installer", "namespace": "kamiwaza"}
        ]
