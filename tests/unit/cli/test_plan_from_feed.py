"""`tmi plan` plans from the servers' own feed: the ConfigMaps it reads from files go through
`policy_io.feed` as a watch would deliver them, so what a server refuses the CLI refuses the same
way, and no second record of the planning inputs exists for the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kits.profilekit import NOW, Owner, request
from policy_io.catalog import packaged_catalog
from policy_io.feed import PolicyFeed
from policy_io.offline import snapshot_of
from tests.unit.cli.test_cli import RECIPES, owner_files, plan_args, render, run

__all__ = ["owner_files"]


def test_the_cli_decides_as_a_server_that_read_the_same_configmap() -> None:
    owner = Owner()
    configmap = owner.sign()
    settings = owner.settings()
    server = PolicyFeed(settings, packaged_catalog(), clock=lambda: NOW)
    server.read(settings.bundle_configmap, configmap)
    offline = snapshot_of(settings, NOW, profile=configmap, catalog=packaged_catalog())
    for document in (request(), request("vllm"), request(model__weightsBytes=10**15)):
        assert offline.decide(document, NOW).body == server.snapshot.decide(document, NOW).body


def test_a_catalog_from_another_namespace_is_refused_as_the_servers_refuse_it(
    owner_files: dict[str, Any], capsys: Any
) -> None:
    path = owner_files["dir"] / "gpu-recipes.json"
    path.write_text(json.dumps(RECIPES))
    _, configmap, _ = render(capsys, path, "gpu")
    configmap["metadata"]["namespace"] = "someone-else"
    rendered = Path(owner_files["dir"]) / "foreign-catalog.json"
    rendered.write_text(json.dumps(configmap))
    code, body, _ = run(
        capsys, *plan_args(owner_files, capsys, request(), "--gpu-recipe-catalog", str(rendered))
    )
    assert code == 3, body
    assert "recipe catalog" in body["detail"] and "'someone-else'" in body["detail"], body


def test_a_file_that_is_no_catalog_is_an_error_naming_it(
    owner_files: dict[str, Any], capsys: Any
) -> None:
    rendered = Path(owner_files["dir"]) / "not-a-catalog.json"
    rendered.write_text(json.dumps({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}))
    code, body, err = run(
        capsys, *plan_args(owner_files, capsys, request(), "--gpu-recipe-catalog", str(rendered))
    )
    assert code == 1 and body is None
    assert err.startswith("error: ") and "catalog" in err, err
