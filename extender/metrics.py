"""Prometheus metrics for the extender, on a registry of the app's own.

Each app gets its own `CollectorRegistry`, so tests and the benchmark can build several apps in
one process. Label values are bounded: a node verdict is counted by its reason class (`arch`,
`vram-bucket`, ...), never by its free-text reason, which names nodes and bindings. Cache and
profile gauges are computed at scrape time from the view, so they cannot go stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.view import ClusterView
from serving.metrics import LoopCounter, LoopHistogram, profile_gauges


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
        yield from profile_gauges(
            "tmi_extender",
            view.policy,
            datetime.now(UTC),
            expiry=False,
            refused=[feed.state for feed in view.feeds.values()],
        )
        verifications = CounterMetricFamily(
            "tmi_extender_profile_verifications",
            "Full verifications of a profile ConfigMap revision.",
        )
        verifications.add_metric([], float(view.policy.verifications))
        yield verifications
        if view.rights is not None:
            yield from _rights_gauges(view)


def _rights_gauges(view: ClusterView) -> Iterator[Metric]:
    """Per tenant namespace, whether the allocation controller's rights are confirmed (engine
    Pods are placed only then), and which of them the API server says it lacks."""
    confirmed = GaugeMetricFamily(
        "tmi_extender_controller_rights_confirmed",
        "1 while the allocation controller's rights in the namespace are confirmed; 0: no engine "
        "Pod of the namespace is placed (a right missing, or no recent answer).",
        labels=["namespace"],
    )
    missing = GaugeMetricFamily(
        "tmi_extender_controller_rights_missing",
        "1 for each right the API server says the allocation controller lacks in the namespace, "
        "0 for each it holds.",
        labels=["namespace", "resource", "verb"],
    )
    assert view.rights is not None
    for namespace, present, known in view.rights.series():
        confirmed.add_metric([namespace], 1.0 if present else 0.0)
        for right, lacking in known.items():
            missing.add_metric([namespace, right.resource_path, right.verb], float(lacking))
    yield confirmed
    yield missing


# The outcomes of a call that fails (TmiExtenderErrors), each verb's counted from 0: Prometheus
# has no sample of a series before it appears, so the first failure would be no rate at all.
FAILED_OUTCOMES = ("error", "not-ready", "profile-refused")
VERBS = ("filter", "prioritize")


class ExtenderMetrics:
    def __init__(self, view: ClusterView) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = LoopCounter(
            "tmi_extender_requests",
            "Extender calls by verb and outcome (planned, unplanned, plan-invalid, "
            "profile-refused, owner-rights, not-ready, bad-request, unencodable, error).",
            ["verb", "outcome"],
            self.registry,
        )
        for verb in VERBS:
            for outcome in FAILED_OUTCOMES:
                self.requests.inc((verb, outcome), 0)
        self.latency = LoopHistogram(
            "tmi_extender_request_seconds",
            "Time to answer an extender call, body decoding and encoding included.",
            ["verb"],
            self.registry,
        )
        self.verdicts = LoopCounter(
            "tmi_extender_node_verdicts",
            "Per-node filter verdicts by reason class (fits for a node that passed).",
            ["code"],
            self.registry,
        )
        self.nodes_per_call = LoopHistogram(
            "tmi_extender_nodes_per_call",
            "Candidate nodes per filter call.",
            [],
            self.registry,
            buckets=(1, 10, 50, 100, 500, 1000, 2000, 5000, 10000),
        )
        self.registry.register(_ViewCollector(view))

    def call(self, verb: str, outcome: str, seconds: float) -> None:
        self.requests.inc((verb, outcome))
        self.latency.observe((verb,), seconds)

    def filtered(self, nodes: int) -> None:
        self.nodes_per_call.observe((), nodes)

    def verdict(self, code: str, count: int) -> None:
        self.verdicts.inc((code,), count)
