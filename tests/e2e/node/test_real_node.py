"""Engine Pods on the real node: what the running containers actually get.

The node is the session's real one (kubelet, containerd, runc; GPUs simulated through the
device-plugin API, ``tmi-fakegpu``). The tmi servers here run as local processes beside the
plane (the stack's local-process mode), because the readiness-gate test stops the allocation
controller at a precise moment; ``test_real_node_chart.py`` runs the chart's own Deployments.
Every engine image is mapped to the probe, whose own configuration sets
``NVIDIA_VISIBLE_DEVICES=all`` as CUDA base images do; each test reads the environment the
probe's process was started with from its log.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kits.nodekit import (
    condition_is,
    engine_with_sidecar,
    is_ready,
    probe_pod,
    real_node_stack,
    wait_pod,
)
from localcluster import ControlPlane, FakeNode, create_fake_nodes, delete_fake_nodes
from localcluster.install.image import Layout
from localcluster.install.stack import TenantStack
from localcluster.nodes.kwok import is_node_ready
from localcluster.nodes.node_images import PROBE
from localcluster.nodes.realnode import RealNode, probe_report
from localcluster.plane.binaries import versions
from localcluster.plane.components import KWOK_NODE_ANNOTATION
from localcluster.servers.engine_pods import CONDITION, condition
from tests.evidencekit import H200_UUID, SHARED, FakeSmi
from tmi_cli import evidence_command
from tmi_cli.gpu_processes import NvidiaSmiReader
from tmi_cli.main import main

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(node_plane: ControlPlane, real_node: RealNode) -> Iterator[TenantStack]:
    with real_node_stack(node_plane, real_node, "tmi-node") as up:
        yield up


def test_the_real_node_joins_beside_kwok_nodes_with_its_own_runtime(
    node_plane: ControlPlane, real_node: RealNode
) -> None:
    admin = node_plane.kube("admin")
    (fake,) = create_fake_nodes(admin, [FakeNode(f"kwok-{real_node.name}", gpus=0, vram_gb=None)])
    try:
        real = admin.get("v1", "Node", real_node.name)
        info = real["status"]["nodeInfo"]
        # Registered by the kubelet itself, under the identity the harness issued.
        assert info["kubeletVersion"] == versions().kubernetes
        assert info["containerRuntimeVersion"].startswith("containerd://2.")
        assert KWOK_NODE_ANNOTATION not in (real["metadata"].get("annotations") or {})
        assert is_node_ready(real) and is_node_ready(fake)
        labels = real["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == real_node.fixture.product
        assert real["status"]["allocatable"]["nvidia.com/gpu"] == str(
            len(real_node.fixture.devices)
        )
    finally:
        delete_fake_nodes(admin, [fake["metadata"]["name"]])


def test_the_probe_image_itself_asks_for_every_gpu(real_node: RealNode) -> None:
    # The precondition of every test below: without the runtime's override the probe's own
    # process would see "all", as a process in a CUDA base image does.
    config = Layout.read(real_node.images[PROBE].layout).config["config"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"]  # type: ignore[index]
    assert PROBE in real_node.ctr("images", "ls", "-q").split()


def test_the_engine_container_sees_exactly_the_allocated_uuid_and_its_sidecar_void(
    node_plane: ControlPlane, real_node: RealNode, stack: TenantStack
) -> None:
    ns = stack.settings.namespace
    tenant = node_plane.kube("tmi-installer")
    created = tenant.create(engine_with_sidecar(stack, "engine-uuid"))
    try:
        pod = wait_pod(node_plane.kube("admin"), ns, "engine-uuid", is_ready)
        assert pod["spec"]["nodeName"] == real_node.name
        engine = probe_report(tenant, ns, "engine-uuid", "engine")
        sidecar = probe_report(tenant, ns, "engine-uuid", "sidecar")
        allocated = real_node.allocations(created["metadata"]["uid"])
        assert list(allocated) == [("engine", "nvidia.com/gpu")]
        (uuid,) = allocated[("engine", "nvidia.com/gpu")]
        assert uuid in real_node.fixture.uuids()
        assert engine["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert sidecar["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
        # The image's non-root user reached the process too.
        assert engine["uid"] != 0
    finally:
        node_plane.kube("admin").delete("v1", "Pod", "engine-uuid", ns, grace_period_seconds=0)


def test_a_pod_whose_image_sets_all_runs_with_void(
    node_plane: ControlPlane, real_node: RealNode, stack: TenantStack
) -> None:
    ns = stack.settings.namespace
    tenant = node_plane.kube("tmi-installer")
    pod = probe_pod(ns, "plain")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": real_node.name}
    tenant.create(pod)
    try:
        wait_pod(tenant, ns, "plain")
        report = probe_report(tenant, ns, "plain", "tool")
        assert report["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    finally:
        node_plane.kube("admin").delete("v1", "Pod", "plain", ns, grace_period_seconds=0)


def test_the_engine_pod_runs_but_is_not_ready_until_allocation_verified(
    node_plane: ControlPlane, real_node: RealNode, stack: TenantStack
) -> None:
    ns = stack.settings.namespace
    admin = node_plane.kube("admin")
    assert stack.controller is not None
    stack.controller.stop()
    try:
        node_plane.kube("tmi-installer").create(engine_with_sidecar(stack, "engine-gate"))
        # Every container runs and the kubelet says they are ready, yet the Pod is not: the gate.
        pod = wait_pod(
            admin, ns, "engine-gate", lambda p: condition_is(p, "ContainersReady", "True")
        )
        assert condition(pod, CONDITION) is None
        assert not is_ready(pod)
    finally:
        stack.controller.start()
    try:
        pod = wait_pod(admin, ns, "engine-gate", is_ready)
        verified = condition(pod, CONDITION)
        assert verified is not None and verified["status"] == "True"
    finally:
        with contextlib.suppress(Exception):
            admin.delete("v1", "Pod", "engine-gate", ns, grace_period_seconds=0)


def _smi_host(directory: Path, uuid: str, processes: dict[int, int]) -> Path:
    """The recorded H200 host's nvidia-smi answers, for the fake device ``uuid`` and with
    ``processes`` (host pid -> MiB) on it: the GPU reading is the fixture's, the pids are the
    running containers' own."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nvidia-smi-L.txt").write_text(
        (SHARED / "nvidia-smi-L.txt").read_text().replace(H200_UUID, uuid)
    )
    blocks = "".join(
        "<process_info><gpu_instance_id>N/A</gpu_instance_id>"
        f"<compute_instance_id>N/A</compute_instance_id><pid>{pid}</pid><type>C</type>"
        f"<process_name>/usr/bin/tmi-probe</process_name><used_memory>{mib} MiB</used_memory>"
        "</process_info>"
        for pid, mib in processes.items()
    )
    xml = (SHARED / "nvidia-smi-q.xml").read_text().replace(H200_UUID, uuid)
    xml = re.sub(r"<processes>.*?</processes>", f"<processes>{blocks}</processes>", xml, flags=re.S)
    (directory / "nvidia-smi-q.xml").write_text(xml)
    return directory


def test_evidence_maps_running_containers_to_their_pods_and_reports_two_on_one_uuid(
    node_plane: ControlPlane,
    real_node: RealNode,
    stack: TenantStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = stack.settings.namespace
    admin = node_plane.kube("admin")
    engine = node_plane.kube("tmi-installer").create(engine_with_sidecar(stack, "engine-evidence"))
    rogue_ns = node_plane.create_namespace(f"rogue-{engine['metadata']['uid'][:6]}")
    rogue_name = rogue_ns["metadata"]["name"]
    try:
        wait_pod(admin, ns, "engine-evidence", is_ready)
        (uuid,) = real_node.allocations(engine["metadata"]["uid"])[("engine", "nvidia.com/gpu")]
        # A Pod tmi never saw (its namespace is not a tenant's) given the same device by hand.
        rogue = probe_pod(rogue_name, "rogue", env={"NVIDIA_VISIBLE_DEVICES": uuid})
        rogue["spec"]["nodeName"] = real_node.name
        admin.create(rogue)
        wait_pod(admin, rogue_name, "rogue")
        pods = [
            admin.get("v1", "Pod", "engine-evidence", ns),
            admin.get("v1", "Pod", "rogue", rogue_name),
        ]
        pid_engine = real_node.container_pid(pods[0], "engine")
        pid_rogue = real_node.container_pid(pods[1], "tool")
        host = _smi_host(tmp_path / "smi", uuid, {pid_engine: 10240, pid_rogue: 2048})
        monkeypatch.setattr(evidence_command, "open_reader", lambda: NvidiaSmiReader(FakeSmi(host)))
        pods_file = tmp_path / "pods.json"
        pods_file.write_text(json.dumps({"items": pods}))
        status = main(
            ["evidence", "--pods", str(pods_file), "--proc", "/proc", "--node", real_node.name]
        )
        report = json.loads(capsys.readouterr().out)
        # Each process was found in its Pod through containerd's cgroups on this host.
        engine_ref, rogue_ref = f"{ns}/engine-evidence", f"{rogue_name}/rogue"
        (overlap,) = report["overlaps"]
        assert overlap["gpuUuid"] == uuid and overlap["sameMemory"] is True
        assert sorted(overlap["holders"]) == sorted([engine_ref, rogue_ref])
        assert status == 1 and report["verdict"]["status"] != "honoured"
    finally:
        admin.delete("v1", "Pod", "engine-evidence", ns, grace_period_seconds=0)
        admin.delete("v1", "Namespace", rogue_name)
