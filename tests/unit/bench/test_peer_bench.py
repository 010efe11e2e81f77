"""The side-by-side benchmark's own bookkeeping (`bench/hami_peer.py`, `bench/peer_measure.py`,
`bench/peer_arrival.py`, `bench/peer_audit.py`, `bench/peer_report.py`): what it writes for HAMi is
HAMi's format, what it reads back of HAMi's allocations and of `tmi`'s is counted right, the
stranded measure counts only capacity no waiting Pod could use, an unbound Pod is slower than
any bound one, the audit log is counted once a request, and the targets are judged as stated.
HAMi itself is not needed: the formats are those of its source (`pkg/device/devices.go`), quoted
here."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import hami_peer  # noqa: E402
import peer_measure  # noqa: E402
import peer_systems  # noqa: E402

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
        _tmi_pod("e", "l40s-00", peer_systems.SHARE_RESOURCE, 40),
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


def test_an_unbound_pod_ranks_above_every_bound_one() -> None:
    import peer_arrival

    samples: list[float | None] = [*([0.010] * 98), 0.020, None]
    out = peer_arrival.percentiles(samples)
    assert out["unbound"] == 1
    assert out["p50_ms"] == 10.0
    # The 99th of 100 is the unbound Pod: no figure, slower than any.
    assert out["p99_ms"] is None
    assert out["max_bound_ms"] == 20.0


def test_the_targets_hold_tmi_to_the_constant_pair_and_ahead_of_hami_as_installed() -> None:
    import peer_report

    def window(p99: float | None, unbound: int = 0) -> dict[str, Any]:
        figures = {"p50_ms": 10.0, "p99_ms": p99, "count": 24, "unbound": unbound}
        return {
            "create_to_bound": figures,
            "create_call": figures,
            "created_to_bound": figures,
            "api_requests_per_pod_bound": {"total": 2.0},
            "load_average_1m": 1.0,
        }

    steady = {
        "tmi": {"2": window(30.0), "20": window(40.0)},
        "constant": {"2": window(27.0), "20": window(30.0)},
        "hami-installed": {"2": window(900.0), "20": window(None, unbound=3)},
    }
    out = peer_report.targets(peer_report.steady_table(steady))
    assert out["tmi_p99_vs_constant"]["by_rate"] == {"2": 1.111, "20": 1.333}
    assert out["tmi_p99_vs_constant"]["met"] is False
    assert out["tmi_p99_vs_hami_installed"]["met"] is True
    assert out["tmi_p99_vs_hami_installed"]["by_rate"]["20"]["peer_p99_ms"] is None


def test_the_audit_tail_counts_each_request_of_the_named_users_once(tmp_path: Path) -> None:
    import peer_audit

    def event(audit_id: str, user: str, verb: str, resource: str, stage: str, code: int) -> str:
        return json.dumps(
            {
                "auditID": audit_id,
                "stage": stage,
                "verb": verb,
                "user": {"username": user},
                "objectRef": {"resource": resource},
                "responseStatus": {"code": code},
                "requestReceivedTimestamp": "2026-12-06T10:00:00.500000Z",
            }
        )

    lines = [
        event("a", "hami", "patch", "nodes", "ResponseComplete", 200),
        event("a", "hami", "patch", "nodes", "ResponseComplete", 200),
        event("b", "hami", "watch", "pods", "ResponseStarted", 200),
        event("c", "hami", "get", "pods", "ResponseComplete", 404),
        event("d", "other", "get", "pods", "ResponseComplete", 200),
    ]
    (tmp_path / "audit.log").write_text("\n".join(lines) + "\n")
    tail = peer_audit.AuditTail(tmp_path)
    at = datetime(2026, 12, 6, 10, 0, 0, 500000, tzinfo=UTC).timestamp()
    counts = tail.count({"hami"}, at - 1, at + 1)
    assert counts == {
        "failed": 1,
        "failed get pods 404": 1,
        "get pods": 1,
        "patch nodes": 1,
        "total": 2,
    }
    assert tail.count({"hami"}, at + 1, at + 2) == {}


def test_the_constant_answer_can_name_another_scheduler() -> None:
    import base64

    import constant_pair

    ops = [{"op": "add", "path": "/spec/schedulerName", "value": "kamiwaza-inference-scheduler"}]
    answer = {"allowed": True, "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    renamed = constant_pair.with_scheduler_name(answer, "bench-constant-scheduler")
    assert json.loads(base64.b64decode(renamed["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "bench-constant-scheduler"}
    ]


def test_the_ratio_interval_spans_one_for_the_same_samples_and_none_with_an_unbound_pod() -> None:
    import peer_report

    samples: list[float | None] = [10.0 + index for index in range(24)]
    interval = peer_report.p99_ratio_interval(samples, samples)
    assert interval is not None
    assert interval[0] <= 1.0 <= interval[1]
    assert peer_report.p99_ratio_interval([*samples, None], samples) is None
