"""Prometheus metrics for the extender, on a registry of the app's own.

Each app gets its own `CollectorRegistry`, so tests and the benchmark can build several apps in
one process. Label values are bounded: a node verdict is counted by its reason class (`arch`,
`vram-bucket`, ...), never by its free-text reason, which names nodes and bindings. Cache and
profile gauges are computed at scrape time from the view, so they cannot go stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.view import ClusterView
from serving.metrics import LATENCY_BUCKETS, profile_gauges


class _ViewCollector(Collector):
    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        view = self.view
        nodes = GaugeMetricFamily("tmi_extender_nodes", "Nodes in the extender's node cache.")
        nodes.add_metric([], float(len(view.nodes)))
        yield nodes
        pods = GaugeMetricFamily(
            "tmi_extender_accounted_pods", "Planned Pods bound to a node and accounted."
        )
        pods.add_metric([], float(len(view.ledger)))
        yield pods
        synced = GaugeMetricFamily(
            "tmi_extender_cache_synced", "1 once nodes, pods and the profile have been read."
        )
        synced.add_metric([], 1.0 if view.ready else 0.0)
        yield synced
        events = CounterMetricFamily(
            "tmi_extender_informer_events", "Node and Pod watch events applied to the view."
        )
        events.add_metric([], float(view.events))
        yield events
        yield from profile_gauges("tmi_extender", view.policy, datetime.now(UTC), expiry=False)
        verifications = CounterMetricFamily(
            "tmi_extender_profile_verifications",
            "Full verifications of a profile ConfigMap revision.",
        )
        verifications.add_metric([], float(view.policy.verifications))
        yield verifications


class ExtenderMetrics:
    def __init__(self, view: ClusterView) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "tmi_extender_requests",
            "Extender calls by verb and outcome (planned, unplanned, plan-invalid, "
            "profile-refused, not-ready, bad-request, unencodable, error).",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tmi_extender_request_seconds",
            "Time to answer an extender call, body decoding and encoding included.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.verdicts = Counter(
            "tmi_extender_node_verdicts",
            "Per-node filter verdicts by reason class (fits for a node that passed).",
            ["code"],
            registry=self.registry,
        )
        self.nodes_per_call = Histogram(
            "tmi_extender_nodes_per_call",
            "Candidate nodes per filter call.",
            buckets=(1, 10, 50, 100, 500, 1000, 2000, 5000, 10000),
            registry=self.registry,
        )
        self.registry.register(_ViewCollector(view))
        # Label children by value: `labels()` validates and locks on every call, and each
        # scheduled Pod costs a handful of them. The label sets are few and bounded.
        self._requests: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        self._verdicts: dict[str, Any] = {}

    def call(self, verb: str, outcome: str, seconds: float) -> None:
        child = self._requests.get((verb, outcome))
        if child is None:
            child = self._requests[verb, outcome] = self.requests.labels(verb, outcome)
        child.inc()
        timer = self._latency.get(verb)
        if timer is None:
            timer = self._latency[verb] = self.latency.labels(verb)
        timer.observe(seconds)

    def verdict(self, code: str, count: int) -> None:
        child = self._verdicts.get(code)
        if child is None:
            child = self._verdicts[code] = self.verdicts.labels(code)
        child.inc(count)
