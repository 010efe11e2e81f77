"""Prometheus metrics for the webhook, on a registry of the app's own.

Each app gets its own `CollectorRegistry`, so tests and the benchmark can build several apps in
one process. Label values are bounded on purpose: a decision is counted by its HTTP status and,
for a refusal, the core's stable refusal code, never by its free-text detail, which carries model
names.
The profile gauges are computed at scrape time from the store, so they cannot go stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inference_policy.base.codes import RefusalCode
from serving.metrics import LoopCounter, LoopHistogram, profile_gauges
from serving.tls import CertificateReloader
from webhook.profile_source import Memo, PolicyStore


class _ProfileCollector(Collector):
    def __init__(self, store: PolicyStore) -> None:
        self.store = store
        self.memos: dict[str, Memo[Any, Any]] = {}

    def collect(self) -> Iterator[Metric]:
        state = self.store.state
        yield from profile_gauges("tmi_webhook", state, datetime.now(UTC))
        verifications = CounterMetricFamily(
            "tmi_webhook_profile_verifications",
            "Full verifications of a profile ConfigMap revision (one per revision).",
        )
        verifications.add_metric([], float(state.verifications))
        yield verifications
        ready = GaugeMetricFamily(
            "tmi_webhook_inputs_ready", "1 once every configured ConfigMap has been read once."
        )
        ready.add_metric([], 1.0 if self.store.ready else 0.0)
        yield ready
        hits = CounterMetricFamily(
            "tmi_webhook_memo_hits",
            "Answers reused: reviews that differ only in uid (answers), request texts (plans).",
            labels=["memo"],
        )
        for name, memo in self.memos.items():
            hits.add_metric([name], float(memo.hits))
        yield hits


# The server-side refusals (TmiWebhookErrors), each counted from 0 on both endpoints:
# Prometheus has no sample of a series before it appears, so the first refusal would be no rate
# at all. Their statuses are the planner's (inference_policy.planning.planner) and the
# handlers' own (webhook.app: a plan that fails is an error, a review that fails a refusal).
SERVER_ERRORS: tuple[tuple[str, str, int, str], ...] = (
    *(
        (endpoint, "refused", 503, code)
        for endpoint in ("mutate", "plan")
        for code in (RefusalCode.PROFILE_REFUSED, RefusalCode.CATALOG_UNAVAILABLE)
    ),
    ("mutate", "refused", 500, RefusalCode.INTERNAL_ERROR),
    ("plan", "error", 500, RefusalCode.INTERNAL_ERROR),
)


class WebhookMetrics:
    """The counters and histograms the handlers update, and the scrape-time profile gauges."""

    def __init__(self, store: PolicyStore) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = LoopCounter(
            "tmi_webhook_decisions",
            "Admission and plan decisions by endpoint, outcome, HTTP/denial status and reason.",
            ["endpoint", "outcome", "status", "reason"],
            self.registry,
        )
        for labels in SERVER_ERRORS:
            self.decisions.inc(labels, 0)
        self.latency = LoopHistogram(
            "tmi_webhook_request_duration_seconds",
            "Time from request body received to response ready, by endpoint.",
            ["endpoint"],
            self.registry,
        )
        self.cert_reloads = Counter(
            "tmi_webhook_certificate_reloads",
            "Serving certificate reloads by result (loaded, failed).",
            ["result"],
            registry=self.registry,
        )
        self._collector = _ProfileCollector(store)
        self.registry.register(self._collector)

    def decision(self, endpoint: str, outcome: str, status: int, reason: str) -> None:
        self.decisions.inc((endpoint, outcome, status, reason))

    def observe(self, endpoint: str, seconds: float) -> None:
        self.latency.observe((endpoint,), seconds)

    def watch_memos(self, memos: dict[str, Memo[Any, Any]]) -> None:
        self._collector.memos.update(memos)

    def watch_certificate(self, reloader: CertificateReloader) -> None:
        """Count the reloader's reloads and expose the served certificate's expiry."""
        reloader.on_reload = lambda result: self.cert_reloads.labels(result).inc()
        expiry = Gauge(
            "tmi_webhook_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate now in use, as a Unix time.",
            registry=self.registry,
        )
        expiry.set_function(lambda: reloader.not_after.timestamp())  # noqa: PLW0108 - re-read
