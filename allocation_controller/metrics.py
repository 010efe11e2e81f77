"""Prometheus metrics for the controller, on a registry of its own.

Each controller gets its own `CollectorRegistry`, so tests and the benchmark can run several in
one process. Labels are bounded: verdicts are counted by status and by reason, which come from a
fixed list, never by Pod name or message.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

RECONCILE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
VERIFY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.verdicts = Counter(
            "tmi_allocation_verdicts",
            "AllocationVerified conditions written, by status and reason",
            ["status", "reason"],
            registry=self.registry,
        )
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
