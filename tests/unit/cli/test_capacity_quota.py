"""`tmi capacity` with each tenant's quota: deployments past a tenant's quota are refused as its
webhook refuses them (403 quota-exceeded), in order, before placement, and each tenant's
headroom is shown (`inference_policy.tools.quota_replay`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference_policy.placing.quota import QUOTA_ANNOTATION, QUOTA_NAME, Quota
from inference_policy.tools.capacity import Deployment, replay
from inference_policy.tools.quota_replay import within_quotas
from kits.profilekit import CLUSTER, NAMESPACE, NOW, NOW_TEXT, Owner, with_profiles
from kits.stackkit import LARGE, whole_h100_profile
from localcluster.nodes.kwok import FakeNode
from tmi_cli.main import main

GPU = "nvidia.com/gpu"


@pytest.fixture
def owner() -> Owner:
    return Owner()


def _ctx(owner: Owner) -> Any:
    return owner.state(with_profiles(owner, whole_h100_profile())).context(NOW)


def _nodes(*gpus: int) -> list[dict[str, Any]]:
    return [
        FakeNode(f"n{i}", gpus=g, vram_gb=80, gpu_product="NVIDIA-H100-80GB-HBM3").manifest()
        for i, g in enumerate(gpus)
    ]


def _quota_object(namespace: str, gpus: int, **limits: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": QUOTA_NAME,
            "namespace": namespace,
            "annotations": {QUOTA_ANNOTATION: json.dumps(limits)},
        },
        "spec": {"hard": {f"requests.{GPU}": str(gpus)}},
    }


def test_each_tenants_quota_admits_in_order_and_counts_what_waits(owner: Owner) -> None:
    deployments = [Deployment(f"d{i}", LARGE) for i in range(3)] + [
        Deployment("other", LARGE, tenant="team-b")
    ]
    quotas = {NAMESPACE: Quota(QUOTA_NAME, {GPU: 2}), "team-b": Quota(QUOTA_NAME, {GPU: 0})}
    passed = within_quotas(deployments, _ctx(owner), quotas)
    assert [d.name for d in passed.admitted] == ["d0", "d1"]
    assert [(r.name, r.status, r.code) for r in passed.refused] == [
        ("d2", 403, "quota-exceeded"),
        ("other", 403, "quota-exceeded"),
    ]
    assert "held now 2, this Pod asks 1" in passed.refused[0].detail
    # Admitted is held whether or not a node takes it: one GPU in the fleet, two admitted.
    report = replay(passed.admitted, _nodes(1), _ctx(owner))
    assert [p.name for p in report.placed] == ["d0"] and [w.name for w in report.waiting] == ["d1"]
    assert [(t.namespace, [h.to_json() for h in t.items]) for t in passed.headroom] == [
        (NAMESPACE, [{"item": f"{GPU} devices", "limit": 2, "held": 2, "left": 0}]),
        ("team-b", [{"item": f"{GPU} devices", "limit": 0, "held": 0, "left": 0}]),
    ]


def test_a_tenant_without_a_quota_is_not_held(owner: Owner) -> None:
    deployments = [Deployment(f"d{i}", LARGE) for i in range(3)]
    passed = within_quotas(deployments, _ctx(owner), {"team-b": Quota(QUOTA_NAME, {GPU: 0})})
    assert passed.admitted == deployments and not passed.refused


def test_the_cli_refuses_past_the_quota_and_prints_each_tenants_headroom(
    owner: Owner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, deps = tmp_path / "bundle.json", tmp_path / "deps.json"
    fleet, quota = tmp_path / "nodes.json", tmp_path / "quota.json"
    bundle.write_text(json.dumps(owner.sign(with_profiles(owner, whole_h100_profile()))))
    deps.write_text(json.dumps([{"name": f"d{i}", "request": LARGE} for i in range(3)]))
    fleet.write_text(json.dumps({"items": _nodes(4)}))
    # As `kubectl get resourcequota -A -o json` lists them: the owner's other quota is skipped.
    affinity = {"kind": "ResourceQuota", "metadata": {"name": "tmi-no-cross-namespace-affinity"}}
    listed = {"items": [affinity, _quota_object(NAMESPACE, 4, enginePods=2)]}
    quota.write_text(json.dumps(listed))
    argv = [
        "capacity", "--bundle", str(bundle), "--owner-public-key", owner.public_key,
        "--cluster-binding-id", CLUSTER, "--namespace", NAMESPACE, "--now", NOW_TEXT,
        "--deployments", str(deps), "--fleet", str(fleet), "--quota", str(quota),
    ]  # fmt: skip
    assert main([*argv, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in report["placed"]] == ["d0", "d1"]
    (refused,) = report["refused"]
    assert refused["name"] == "d2" and refused["code"] == "quota-exceeded"
    assert "enginePods: limit 2, held now 2, this Pod asks 1" in refused["detail"]
    assert report["quotas"] == [
        {
            "namespace": NAMESPACE,
            "quota": QUOTA_NAME,
            "items": [
                {"item": f"{GPU} devices", "limit": 4, "held": 2, "left": 2},
                {"item": "enginePods", "limit": 2, "held": 2, "left": 0},
            ],
        }
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "quota headroom" in table and "enginePods" in table
    # A quota object that cannot be read is a usage error, naming it.
    quota.write_text(
        json.dumps({**_quota_object(NAMESPACE, 1), "spec": {"hard": {f"requests.{GPU}": "x"}}})
    )
    assert main(argv) == 2
    assert "requests.nvidia.com/gpu" in capsys.readouterr().err
