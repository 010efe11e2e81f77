"""Replicas of one deployment on distinct nodes first (`inference_policy.placing.spread`), packing
kept among the nodes alike in what they hold of it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from inference_policy.placing.spread import APART, ReplicaIndex, deployment_of, spread_replicas


def test_without_a_replica_placed_the_scores_are_unchanged() -> None:
    assert spread_replicas([10, 3, 0], [0, 0, 0]) == [10, 3, 0]


def test_a_node_holding_a_replica_ranks_below_every_node_holding_none() -> None:
    # Best fit would put the second replica on the first node, which the first part-filled.
    spread = spread_replicas([10, 2, 0], [1, 0, 0])
    assert spread[1] > spread[0] and spread[2] > spread[0]
    assert spread[1] > spread[2]  # best fit still orders the nodes holding none
    assert spread[0] >= 1  # a score, not a filter


def test_fewer_replicas_rank_higher_among_nodes_holding_some() -> None:
    spread = spread_replicas([5, 5, 5], [3, 1, 2])
    assert spread[1] > spread[2] > spread[0] >= 1


@given(
    st.lists(
        st.tuples(st.integers(0, 10), st.integers(0, 5)),
        min_size=1,
        max_size=30,
    )
)
def test_the_order_is_replicas_first_then_best_fit(rows: list[tuple[int, int]]) -> None:
    scores = [s for s, _ in rows]
    replicas = [r for _, r in rows]
    spread = spread_replicas(scores, replicas)
    assert all(0 <= v <= 10 for v in spread)
    if not any(replicas):
        assert spread == scores
        return
    for (s1, r1), v1 in zip(rows, spread, strict=True):
        assert v1 >= 1
        assert (v1 >= APART) is (r1 == 0)
        for (s2, r2), v2 in zip(rows, spread, strict=True):
            if r1 == 0 < r2 or (r1 and r2 and r1 < r2 and r2 < APART):
                assert v1 > v2
            if r1 == r2 == 0 and s1 > s2:
                assert v1 >= v2


def test_the_index_follows_binds_moves_and_deletes() -> None:
    index = ReplicaIndex()
    index.apply("ns/a", "d1", "n1")
    index.apply("ns/b", "d1", "n1")
    index.apply("ns/c", "d1", "n2")
    index.apply("ns/x", "d2", "n1")
    index.apply("ns/y", None, "n1")  # no deployment: not counted
    assert dict(index.counts("d1")) == {"n1": 2, "n2": 1}
    assert dict(index.counts("d2")) == {"n1": 1}
    index.apply("ns/a", "d1", "n1")  # a status update changes nothing
    index.apply("ns/b", "d1", None)  # terminated
    index.apply("ns/c", "d1", "n3")  # recreated elsewhere under the same key
    assert dict(index.counts("d1")) == {"n1": 1, "n3": 1}
    index.apply("ns/a", None, None)
    index.apply("ns/c", None, None)
    assert dict(index.counts("d1")) == {}
    assert dict(index.counts(None)) == {}


def test_the_deployment_is_the_engine_label_within_its_namespace() -> None:
    def pod(namespace: str, value: str) -> dict[str, Any]:
        labels = {"kamiwaza.ai/deployment-id": value}
        return {"metadata": {"namespace": namespace, "labels": labels}}

    assert deployment_of(pod("tenant-a", "d1")) == "tenant-a/d1"
    # Another tenant naming the same id is another deployment.
    assert deployment_of(pod("tenant-b", "d1")) != deployment_of(pod("tenant-a", "d1"))
    assert deployment_of(pod("tenant-a", "")) is None
    assert deployment_of({"metadata": {"labels": "junk"}}) is None
    assert deployment_of({}) is None
