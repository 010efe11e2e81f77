"""The 15,000-node benchmark sends the extender as many node names as kube-scheduler v1.36 does
by default (`numFeasibleNodesToFind`, pkg/scheduler/schedule_one.go): its headline figure is only
what a cluster sees if that count is right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from bench_scale import default_names_sent  # noqa: E402


@pytest.mark.parametrize(
    ("nodes", "sent"),
    [
        (48, 48),  # below 100 nodes every node is filtered
        (100, 100),  # 50% of 100 is under the floor of 100 nodes
        (500, 230),  # 50 - 4 = 46%
        (1_000, 420),  # 50 - 8 = 42%
        (5_000, 500),  # 50 - 40 = 10%
        (15_000, 750),  # 50 - 120 is below 5%: 5%
    ],
)
def test_the_names_sent_follow_kube_schedulers_adaptive_share(nodes: int, sent: int) -> None:
    assert default_names_sent(nodes) == sent
