"""Prometheus metrics for the controller, on a registry of its own.

Each controller gets its own `CollectorRegistry`, so tests and the benchmark can run several in
one process. Labels are bounded: verdicts are counted by status and by reason, which come from a
fixed list, never by Pod name or message.

A process serving several tenants (`allocation_controller.fleet`) gives its controllers one
`Metrics`, so /metrics has each series once: counters and histograms add up across tenants, the
rights are labelled by namespace already, and the gauges that each tenant would otherwise
overwrite (the revisions known, the queue depth) are kept per tenant here and exported summed.
"""

from __future__ import annotations

from collections.abc import Sized

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inference_policy.base.codes import (
    ALLOCATION_REASONS,
    VERIFIED,
    VERIFIED_PROFILE_EXPIRED,
    VERIFIED_REVISION_UNAVAILABLE,
    VERIFIED_SHARED_WITH_ANOTHER_TENANT,
)

RECONCILE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
VERIFY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The reasons written with status True; every other reason is a False verdict's.
TRUE_REASONS = frozenset(
    {
        VERIFIED,
        VERIFIED_PROFILE_EXPIRED,
        VERIFIED_REVISION_UNAVAILABLE,
        VERIFIED_SHARED_WITH_ANOTHER_TENANT,
    }
)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.verdicts = Counter(
            "tmi_allocation_verdicts",
            "AllocationVerified conditions written, by status and reason",
            ["status", "reason"],
            registry=self.registry,
        )
        # Every verdict's series from 0: Prometheus has no sample of a series before it
        # appears, so the first False verdict of a reason would be no increase to
        # TmiAllocationVerifiedFalse, which alerts on one.
        for reason in ALLOCATION_REASONS:
            self.verdicts.labels("True" if reason in TRUE_REASONS else "False", reason)
        self.reconciles = Counter(
            "tmi_allocation_reconciles",
            "Reconciles by result: written, unchanged, waiting, skipped, conflict, error",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "tmi_allocation_reconcile_duration_seconds",
            "Time one reconcile took, API calls included",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.bind_to_verified = Histogram(
            "tmi_allocation_bind_to_verdict_seconds",
            "From this controller seeing a Pod bound to a node to its first verdict being written",
            buckets=VERIFY_BUCKETS,
            registry=self.registry,
        )
        self.is_leader = Gauge(
            "tmi_allocation_is_leader",
            "1 while this replica holds the leader Lease and may write",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "tmi_allocation_queue_depth",
            "Pods waiting for a worker",
            registry=self.registry,
        )
        self.revisions = Gauge(
            "tmi_allocation_profile_revisions",
            "Profile revisions known, by state (verified or refused)",
            ["state"],
            registry=self.registry,
        )
        self.rights_missing = Gauge(
            "tmi_allocation_rights_missing",
            "1 for each right the API server says this controller lacks in its tenant namespace "
            "(its verdicts there cannot be kept), 0 for each it holds",
            ["namespace", "resource", "verb"],
            registry=self.registry,
        )
        self.event_failures = Counter(
            "tmi_allocation_event_failures",
            "Events that could not be recorded (the condition was still written)",
            registry=self.registry,
        )
        self._revisions: dict[str, tuple[int, int]] = {}
        self._queues: list[Sized] = []
        self.queue_depth.set_function(lambda: float(sum(len(q) for q in self._queues)))

    def count_revisions(self, namespace: str, verified: int, refused: int) -> None:
        """One tenant's profile revisions known; the gauge is every tenant's sum."""
        self._revisions[namespace] = (verified, refused)
        self.revisions.labels("verified").set(sum(v for v, _ in self._revisions.values()))
        self.revisions.labels("refused").set(sum(r for _, r in self._revisions.values()))

    def follow_queue(self, queue: Sized) -> None:
        """Count `queue` (a tenant's work queue) in the queue depth, read at each scrape."""
        self._queues.append(queue)
