"""What the servers' metrics share: one set of latency buckets, and the profile gauges every
server that holds a verified profile exports, computed at scrape time.

Read from the `PolicyState` when Prometheus scrapes, so they cannot go stale between profile
revisions: a profile expires by the clock, not by an event. Each server names them with its own
prefix (`tmi_webhook`, `tmi_extender`) on its app's own registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from policy_io.state import PolicyState

# Request-latency buckets every server uses, from 0.2 ms (a memoised admission answer) to 2.5 s
# (past every caller's timeout), so dashboards can compare the servers bucket for bucket.
LATENCY_BUCKETS = (
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
    2.5,
)


def profile_gauges(
    prefix: str, state: PolicyState, now: datetime, *, expiry: bool = True
) -> Iterator[Metric]:
    """`<prefix>_profile_version`, `<prefix>_profile_valid` and, with `expiry`,
    `<prefix>_profile_expiry_seconds`."""
    profile = state.profile
    version = GaugeMetricFamily(
        f"{prefix}_profile_version",
        "Version of the verified owner profile in use (0: none verified).",
    )
    version.add_metric([], float(profile.version) if profile else 0.0)
    yield version
    valid = GaugeMetricFamily(
        f"{prefix}_profile_valid",
        "1 when a verified profile inside its window is in use, else 0.",
    )
    remaining = profile.seconds_until_expiry(now) if profile is not None else None
    in_use = remaining is not None and remaining > 0 and state.profile_refusal is None
    valid.add_metric([], 1.0 if in_use else 0.0)
    yield valid
    if expiry:
        seconds = GaugeMetricFamily(
            f"{prefix}_profile_expiry_seconds",
            "Seconds until the verified profile expires (negative: expired; absent: none).",
        )
        if remaining is not None:
            seconds.add_metric([], remaining)
        yield seconds
