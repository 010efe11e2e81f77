"""`tmi capacity` reading the deployments and the fleet through the real API server: a
namespace's engine Pods as the tenant reads them, the Nodes as only the owner may.

The servers here are none (the replay is the CLI's own); the plane is the session's KWOK one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kits.profilekit import CLUSTER, Owner
from kits.stackkit import LARGE, whole_h100_envelope
from localcluster import ControlPlane, FakeNode
from localcluster.servers.engine_pods import engine_pod
from tmi_cli.main import main

pytestmark = pytest.mark.e2e


def _capacity(
    capsys: pytest.CaptureFixture[str], bundle: Path, owner: Owner, ns: str, *source: str
) -> tuple[int, Any, str]:
    status = main(
        [
            "capacity", "--bundle", str(bundle), "--owner-public-key", owner.public_key,
            "--cluster-binding-id", CLUSTER, "--namespace", ns, "-o", "json", *source,
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else None), err


def test_capacity_reads_the_namespace_as_the_tenant_and_the_nodes_as_the_owner(
    control_plane: ControlPlane,
    namespace: str,
    fake_nodes: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    owner = Owner()
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(owner.sign(whole_h100_envelope(owner, namespace))))
    node = f"cap-{namespace[-8:]}"
    fake_nodes(FakeNode(node, gpus=1, vram_gb=80))
    control_plane.grant_namespace_admin("tmi-installer", namespace)
    tenant = control_plane.kube("tmi-installer")
    for name in ("first", "second"):
        tenant.create(engine_pod(namespace, LARGE, name=name, deployment_id=name))
    tenant_config = str(control_plane.kubeconfig("tmi-installer"))
    admin_config = str(control_plane.kubeconfig("admin"))

    # The fleet as the owner sees it, written out, is what the API read must replay alike.
    nodes = control_plane.kube("admin").request("GET", "/api/v1/nodes")
    fleet = tmp_path / "nodes.json"
    fleet.write_text(json.dumps(nodes))
    from_namespace = ("--deployments-from-namespace", namespace, "--fleet-from-api")
    status, from_api, _ = _capacity(
        capsys, bundle, owner, namespace, *from_namespace, "--kubeconfig", admin_config
    )
    assert status == 0
    names = {p["name"] for p in from_api["placed"]} | {w["name"] for w in from_api["waiting"]}
    assert names == {"first", "second"}
    assert any(p["node"] == node for p in from_api["placed"]) or node in from_api["left"]

    pods = tenant.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    listed = tmp_path / "pods.json"
    listed.write_text(json.dumps({"items": [{**p, "kind": "Pod"} for p in pods["items"]]}))
    status, from_files, _ = _capacity(
        capsys, bundle, owner, namespace, "--deployments", str(listed), "--fleet", str(fleet)
    )
    assert status == 0
    if {n["metadata"]["name"] for n in nodes["items"]} == {
        n["metadata"]["name"]
        for n in control_plane.kube("admin").request("GET", "/api/v1/nodes")["items"]
    }:
        assert from_files == from_api

    # The tenant reads its own engine Pods, but not the Nodes.
    status, report, err = _capacity(
        capsys, bundle, owner, namespace, *from_namespace, "--kubeconfig", tenant_config
    )
    assert status == 1 and report is None
    assert "cannot list Nodes: HTTP 403 Forbidden" in err
