"""`tmi capacity --quota-from-api`: the tenant reads its namespace's quota (the owner's
ResourceQuota tmi-quota) through the real API server, and the replay refuses what the quota
refuses and shows the headroom; a namespace without one has no quota."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference_policy.placing.quota import QUOTA_ANNOTATION, QUOTA_NAME
from kits.profilekit import CLUSTER, Owner
from kits.stackkit import LARGE, whole_h100_envelope
from localcluster import ControlPlane, FakeNode
from tmi_cli.main import main

pytestmark = pytest.mark.e2e


def test_the_tenant_reads_its_quota_and_sees_its_headroom(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    owner = Owner()
    bundle, deps, fleet = tmp_path / "bundle.json", tmp_path / "deps.json", tmp_path / "nodes.json"
    bundle.write_text(json.dumps(owner.sign(whole_h100_envelope(owner, namespace))))
    deps.write_text(json.dumps([{"name": f"d{i}", "request": LARGE} for i in range(3)]))
    fleet.write_text(json.dumps({"items": [FakeNode("cap-q", gpus=4, vram_gb=80).manifest()]}))
    control_plane.grant_namespace_admin("tmi-installer", namespace)
    argv = [
        "capacity", "--bundle", str(bundle), "--owner-public-key", owner.public_key,
        "--cluster-binding-id", CLUSTER, "--namespace", namespace, "-o", "json",
        "--deployments", str(deps), "--fleet", str(fleet), "--quota-from-api",
        "--kubeconfig", str(control_plane.kubeconfig("tmi-installer")),
    ]  # fmt: skip

    assert main(argv) == 0
    out, err = capsys.readouterr()
    report: Any = json.loads(out)
    assert f"namespace {namespace} has no {QUOTA_NAME}: no quota" in err
    assert len(report["placed"]) == 3 and report["quotas"] == []

    control_plane.kube("admin").create(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {
                "name": QUOTA_NAME,
                "namespace": namespace,
                "annotations": {QUOTA_ANNOTATION: json.dumps({"enginePods": 2})},
            },
            "spec": {"hard": {"requests.nvidia.com/gpu": "4"}},
        }
    )
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in report["placed"]] == ["d0", "d1"]
    assert [(r["name"], r["code"]) for r in report["refused"]] == [("d2", "quota-exceeded")]
    (tenant,) = report["quotas"]
    assert tenant["namespace"] == namespace and tenant["items"][-1] == {
        "item": "enginePods",
        "limit": 2,
        "held": 2,
        "left": 0,
    }
