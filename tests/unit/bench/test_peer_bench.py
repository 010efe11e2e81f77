"""The side-by-side benchmark's own bookkeeping (`bench/hami_peer.py`, `bench/peer_measure.py`):
what it writes for HAMi is HAMi's format, what it reads back of HAMi's allocations and of
`tmi`'s is counted right, and the stranded measure counts only capacity no waiting Pod could
use. HAMi itself is not needed: the formats are those of its source (`pkg/device/devices.go`),
quoted here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import hami_peer  # noqa: E402
import peer_measure  # noqa: E402

from localcluster.nodes.kwok import FakeNode  # noqa: E402


def test_the_registration_has_the_fields_hamis_scheduler_unmarshals() -> None:
    # DeviceInfo's JSON names (pkg/device/devices.go); health must be true or HAMi skips it.
    devices = json.loads(
        hami_peer.register_annotation("n1", hami_peer.Card("NVIDIA L40S", 49152), 2)
    )
    assert [d["index"] for d in devices] == [0, 1]
    assert len({d["id"] for d in devices}) == 2
    for device in devices:
        assert set(device) == {
            "id",
            "index",
            "count",
            "devmem",
            "devcore",
            "type",
            "numa",
            "mode",
            "health",
        }
        assert device["devmem"] == 49152
        assert device["count"] == hami_peer.SPLIT
        assert device["health"] is True
        assert device["mode"] == "hami-core"


def test_a_whole_gpu_pod_names_no_memory_and_a_share_names_its_mib() -> None:
    whole = hami_peer.pod("w", 4, None, "H100")
    share = hami_peer.pod("s", 1, 16 * 1024, "L40S")
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert share["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "16384",
    }
    assert whole["metadata"]["annotations"][hami_peer.USE_TYPE] == "H100"


def _hami_pod(name: str, node: str | None, allocated: str) -> dict[str, Any]:
    annotations = {hami_peer.ALLOCATED: allocated} if allocated else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node, "containers": []} if node else {"containers": []},
    }


def test_device_usage_reads_hamis_allocation_annotation() -> None:
    # EncodePodSingleDevice: "uuid,type,usedmem,usedcores:" per device, ";" per container.
    pods = [
        _hami_pod("a", "l40s-00", "GPU-l40s-00-00,NVIDIA,16384,0:;"),
        _hami_pod("b", "l40s-00", "GPU-l40s-00-00,NVIDIA,8192,0:;"),
        _hami_pod("c", "h100-00", "GPU-h100-00-00,NVIDIA,81559,0:GPU-h100-00-01,NVIDIA,81559,0:;"),
        _hami_pod("waiting", None, ""),
    ]
    usage = hami_peer.device_usage(pods)
    assert usage == {
        "l40s-00": {"GPU-l40s-00-00": 24576},
        "h100-00": {"GPU-h100-00-00": 81559, "GPU-h100-00-01": 81559},
    }


class _Pods:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert method == "GET"
        return {"items": self.items}


def _tmi_pod(name: str, node: str | None, resource: str, amount: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"resources": {"requests": {resource: str(amount)}}}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


NODES = [FakeNode("h100-00", gpus=8), FakeNode("h100-01", gpus=8), FakeNode("l40s-00", gpus=1)]


def test_free_gpus_are_stranded_only_where_no_waiting_pod_fits_them() -> None:
    items = [("whole", 4, 0), ("whole", 4, 0), ("whole", 2, 0), ("whole", 4, 0), ("share", 1, 40)]
    names = ["a", "b", "c", "d", "e"]
    pods = [
        _tmi_pod("a", "h100-00", "nvidia.com/gpu", 4),
        _tmi_pod("b", "h100-01", "nvidia.com/gpu", 4),
        _tmi_pod("c", "h100-00", "nvidia.com/gpu", 2),
        _tmi_pod("d", None, "nvidia.com/gpu", 4),
        _tmi_pod("e", "l40s-00", peer_measure.SHARE_RESOURCE, 40),
    ]
    out = peer_measure.stranded(_Pods(pods), "tmi", "ns", items, names, NODES)
    assert out["placed"] == {"whole": 3, "share": 1}
    assert out["waiting"] == {"whole": 1, "share": 0}
    # h100-00 has 2 free, fewer than the 4 the waiting Pod needs: stranded. h100-01 has 4 free:
    # the waiting Pod fits there, so nothing of it is stranded. No share waits: the card's 8 GB
    # free are not stranded.
    assert out["stranded_by_class"] == {"whole_gpus": 2.0, "share_gpus": 0.0}
    assert out["free_gpus"] == pytest.approx(6 + 8 / 48, abs=0.01)


def test_hamis_placements_are_counted_from_its_device_annotations() -> None:
    items = [("whole", 1, 0), ("share", 1, 40), ("share", 1, 16)]
    names = ["a", "b", "c"]
    pods = [
        _hami_pod("a", "h100-00", "GPU-h100-00-03,NVIDIA,81559,0:;"),
        _hami_pod("b", "l40s-00", "GPU-l40s-00-00,NVIDIA,40960,0:;"),
        _hami_pod("c", None, ""),
    ]
    out = peer_measure.stranded(_Pods(pods), "hami", "ns", items, names, NODES)
    assert out["placed"] == {"whole": 1, "share": 1}
    # The card has 8 GB left and a 16 GB share waits: those 8 GB are stranded.
    assert out["stranded_by_class"]["share_gpus"] == pytest.approx(8 / 48, abs=0.01)
    assert out["stranded_by_class"]["whole_gpus"] == 0.0


def test_the_summary_reports_the_slow_tail() -> None:
    samples = [0.001] * 99 + [0.5]
    out = peer_measure.summary(samples)
    assert out["p50_ms"] == 1.0
    assert out["p99_ms"] == 500.0
    assert out["count"] == 100
