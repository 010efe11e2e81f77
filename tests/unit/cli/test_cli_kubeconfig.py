"""The `tmi` commands that read the API find credentials as kubectl does: --kubeconfig, then
$KUBECONFIG's first file, then ~/.kube/config, then the in-cluster account (None)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tmi_cli.kubeconfig import kubeconfig_for


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return tmp_path


def test_the_flag_wins(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/from/env")
    assert kubeconfig_for("/given") == "/given"


def test_kubeconfig_names_a_list_and_its_first_existing_file_is_used(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = home / "second"
    second.write_text("apiVersion: v1\n")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(["", "/absent", str(second)]))
    assert kubeconfig_for(None) == str(second)
    # None exists: the first is named, so the error says which file was looked for.
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(["/absent", "/also-absent"]))
    assert kubeconfig_for(None) == "/absent"


def test_the_home_file_only_when_it_is_there(home: Path) -> None:
    assert kubeconfig_for(None) is None
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text("apiVersion: v1\n")
    assert kubeconfig_for(None) == str(home / ".kube" / "config")
