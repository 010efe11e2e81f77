"""The real node's pure parts: the GPU fixture and what it makes the Node carry, the pod
network's addresses and CNI configuration, the image layer's bytes and the engine image map."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from localcluster.nodes.fake_gpus import GpuFixture
from localcluster.nodes.node_images import NodeImage, _file_layer, engine_image_map
from localcluster.nodes.podnet import PodNetwork
from policy_io.catalog import packaged_catalog

FIXTURES = Path(__file__).resolve().parents[3] / "localcluster" / "data" / "fake-gpus"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_every_shipped_fixture_parses_and_names_distinct_devices(name: str) -> None:
    fixture = GpuFixture.named(name)
    assert len(set(fixture.uuids())) == len(fixture.devices) > 0


def test_the_node_carries_gfd_labels_and_the_plugin_resources_of_its_fixture() -> None:
    fixture = GpuFixture.named("h200-2x.json")
    node = fixture.fake_node("n")
    labels = node.gfd_labels()
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["nvidia.com/gpu.compute.major"] == "9"
    assert node.resources()["nvidia.com/gpu"] == "2"
    assert not node.kwok


def test_mig_devices_and_time_slicing_change_what_is_advertised() -> None:
    fixture = GpuFixture.model_validate(
        {
            "product": "NVIDIA-A100-SXM4-80GB",
            "computeCapability": "8.0",
            "memoryGB": 80,
            "driverVersion": "580.95.05",
            "cudaDriverVersion": "13.0",
            "replicas": 2,
            "devices": [
                {"index": 0, "uuid": "GPU-a", "mig": [{"profile": "3g.40gb", "uuid": "MIG-1"}]},
                {"index": 1, "uuid": "GPU-b"},
            ],
        }
    )
    node = fixture.fake_node("n")
    resources = node.resources()
    assert resources["nvidia.com/gpu"] == "2"  # one whole GPU, two time-sliced replicas
    assert resources["nvidia.com/mig-3g.40gb"] == "1"
    labels = fixture.node_labels("n")
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.replicas"] == "2"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"devices": [{"index": 0, "uuid": "0000"}]}, "uuid"),
        ({"computeCapability": "nine"}, "computeCapability"),
        ({"replicas": 0}, "replicas"),
        ({"colour": "green"}, "colour"),
    ],
)
def test_a_malformed_fixture_is_refused_naming_the_field(
    change: dict[str, object], where: str
) -> None:
    base: dict[str, object] = {
        "product": "p",
        "computeCapability": "9.0",
        "memoryGB": 80,
        "driverVersion": "1",
        "cudaDriverVersion": "13.0",
        "devices": [{"index": 0, "uuid": "GPU-x"}],
    }
    with pytest.raises(ValidationError) as caught:
        GpuFixture.model_validate({**base, **change})
    assert where in str(caught.value)


def test_the_pod_network_names_its_gateway_and_the_kubernetes_service() -> None:
    net = PodNetwork(subnet="10.77.0.0/24", service_cidr="10.95.0.0/24")
    assert net.gateway == "10.77.0.1"
    assert net.kubernetes_service_ip == "10.95.0.1"
    assert {"10.77.0.1", "10.95.0.1", "kubernetes.default.svc"} <= set(net.apiserver_hosts())
    bridge = net.cni_config()["plugins"][0]  # type: ignore[index]
    assert bridge["bridge"] == net.bridge
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.1"}]]


def test_an_image_layer_has_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF fake")
    first = _file_layer(tmp_path / "a.tar", {"usr/bin/tool": binary})
    second = _file_layer(tmp_path / "b.tar", {"usr/bin/tool": binary})
    assert (
        hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    )


def test_every_catalog_image_maps_to_the_probe_by_digest(tmp_path: Path) -> None:
    probe = NodeImage("tmi.local/probe:1", "sha256:" + "a" * 64, tmp_path)
    mapping = dict(engine_image_map(probe))
    assert set(mapping) == {row[4] for row in packaged_catalog().rows()}
    assert set(mapping.values()) == {"tmi.local/probe@sha256:" + "a" * 64}
