"""The servers' per-request counter and histogram write what prometheus_client's own would.

`LoopCounter` and `LoopHistogram` replace the library's `Counter` and `Histogram` on the
admission and scheduling paths (no label validation or lock per update); dashboards, alerts and
tests read their exposition, so it must be the library's, series for series, but for the
`_created` timestamps they do not write.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from serving.metrics import LATENCY_BUCKETS, LoopCounter, LoopHistogram

# Values on, between and past the bucket bounds, and zero.
OBSERVED = [0.0, 0.0002, 0.00021, 0.0009, 0.001, 0.0049, 0.3, 1.0, 2.5, 2.6, 400.0]


def _lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_the_histogram_and_counter_expose_what_the_library_would() -> None:
    # auto_describe as the servers make theirs: the registry collects a collector when it joins.
    ours, theirs = CollectorRegistry(auto_describe=True), CollectorRegistry()
    latency = LoopHistogram("t_seconds", "Latency.", ["endpoint"], ours)
    reference = Histogram(
        "t_seconds", "Latency.", ["endpoint"], registry=theirs, buckets=LATENCY_BUCKETS
    )
    decisions = LoopCounter("t_decisions", "Decisions.", ["endpoint", "status"], ours)
    counted = Counter("t_decisions", "Decisions.", ["endpoint", "status"], registry=theirs)
    for index, value in enumerate(OBSERVED):
        endpoint = ("mutate", "plan")[index % 2]
        latency.observe((endpoint,), value)
        reference.labels(endpoint).observe(value)
        # A status given as an int is written as the library writes its string.
        decisions.inc((endpoint, 200 + index % 3), 2.0)
        counted.labels(endpoint, str(200 + index % 3)).inc(2.0)
    assert _lines(ours) == _lines(theirs)
    assert decisions.value(("mutate", 200)) == counted.labels("mutate", "200")._value.get()


def test_an_unlabelled_histogram_with_its_own_buckets() -> None:
    # auto_describe as the servers make theirs: the registry collects a collector when it joins.
    ours, theirs = CollectorRegistry(auto_describe=True), CollectorRegistry()
    buckets = (1, 10, 50, 100, 500, 1000, 2000, 5000, 10000)
    nodes = LoopHistogram("t_nodes", "Nodes.", [], ours, buckets=buckets)
    reference = Histogram("t_nodes", "Nodes.", registry=theirs, buckets=buckets)
    LoopCounter("t_calls", "Calls.", [], ours)
    Counter("t_calls", "Calls.", registry=theirs)
    # Unlabelled series exist, at zero, before anything is observed.
    assert _lines(ours) == _lines(theirs)
    for value in (0, 1, 2, 10, 11, 4999, 5000, 10000, 10001):
        nodes.observe((), value)
        reference.observe(value)
    assert _lines(ours) == _lines(theirs)


def test_labels_of_the_wrong_arity_are_refused_before_they_are_kept() -> None:
    registry = CollectorRegistry(auto_describe=True)
    counter = LoopCounter("t_total", "T.", ["verb"], registry)
    histogram = LoopHistogram("t_seconds", "T.", ["verb"], registry)
    with pytest.raises(ValueError, match=r"t_total takes labels \('verb',\)"):
        counter.inc(("filter", "extra"))
    with pytest.raises(ValueError, match="t_seconds takes labels"):
        histogram.observe((), 0.1)
    assert "t_total{" not in generate_latest(registry).decode()


def test_buckets_must_ascend() -> None:
    with pytest.raises(ValueError, match="buckets must ascend"):
        LoopHistogram("t_seconds", "T.", [], CollectorRegistry(), buckets=(1.0, 0.5))
