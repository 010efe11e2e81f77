"""What the servers' metrics share: one set of latency buckets, the counter and histogram every
request updates, and the profile gauges every server that holds a verified profile exports,
computed at scrape time.

The profile gauges are read from the `PolicyState` when Prometheus scrapes, so they cannot go
stale between profile revisions: a profile expires by the clock, not by an event. Beside them,
the profile revisions refused by a cap or by the verifier (`policy_io.caps`). Each server
names them with its own prefix (`tmi_webhook`, `tmi_extender`) on its app's own registry.

The per-request counter and histogram (`LoopCounter`, `LoopHistogram`) are collectors of
prometheus_client's own families, updated without its locks: the webhook and the extender update
and scrape them on one event loop, and prometheus_client's `Counter` and `Histogram` validate
labels and take a lock on every update (0.5 and 0.9 µs, against a review's 35 µs in-process).
The exposition is the library's, with the same names, labels and buckets; only the `_created`
series are not written.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable, Iterator, Sequence
from datetime import datetime
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from policy_io.caps import REFUSAL_REASONS
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


class _Labelled(Collector):
    """A metric family's name, help and label names, registered on a registry (last, as the
    registry collects it at once to learn its names). Each series is a list of floats kept by
    its label values as a tuple, each written with `str` when scraped (a status code may be
    given as an int); an unlabelled family's one series exists from the start, at zero, as the
    library's does. Label values must be bounded: a series is never removed."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[Hashable, ...], list[float]] = (
            {} if self.labelnames else {(): self._zero()}
        )
        registry.register(self)

    def _zero(self) -> list[float]:
        raise NotImplementedError

    def _get(self, labels: tuple[Hashable, ...]) -> list[float]:
        series = self._series.get(labels)
        if series is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labels!r}")
            series = self._series[labels] = self._zero()
        return series


class LoopCounter(_Labelled):
    """A labelled counter updated from one event loop: `inc` is one dictionary lookup."""

    def _zero(self) -> list[float]:
        return [0.0]

    def inc(self, labels: tuple[Hashable, ...], amount: float = 1.0) -> None:
        self._get(labels)[0] += amount

    def value(self, labels: tuple[Hashable, ...]) -> float:
        series = self._series.get(labels)
        return series[0] if series is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in self._series.items():
            family.add_metric([str(label) for label in labels], series[0])
        yield family


class LoopHistogram(_Labelled):
    """A labelled histogram updated from one event loop: `observe` is a binary search and two
    list updates. Buckets are upper bounds, inclusive (Prometheus's `le`), ascending."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        self.bounds = tuple(float(bound) for bound in buckets)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"{name}: buckets must ascend without repeats, got {buckets!r}")
        # The library writes its own buckets' bounds so: 0.0002, 1.0, 2.5, +Inf.
        les = [floatToGoString(bound) for bound in self.bounds]  # type: ignore[no-untyped-call]
        self._les: list[str] = [*les, "+Inf"]
        super().__init__(name, documentation, labelnames, registry)

    def _zero(self) -> list[float]:
        # One count per bucket (the last for values above every bound), then the sum.
        return [0.0] * (len(self.bounds) + 2)

    def observe(self, labels: tuple[Hashable, ...], value: float) -> None:
        series = self._get(labels)
        series[bisect_left(self.bounds, value)] += 1.0
        series[-1] += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in self._series.items():
            counts = accumulate(series[:-1])
            family.add_metric(
                [str(label) for label in labels],
                list(zip(self._les, counts, strict=True)),
                series[-1],
            )
        yield family


def profile_gauges(
    prefix: str,
    state: PolicyState,
    now: datetime,
    *,
    expiry: bool = True,
    refused: Iterable[PolicyState] | None = None,
) -> Iterator[Metric]:
    """`<prefix>_profile_version`, `<prefix>_profile_valid`, with `expiry`
    `<prefix>_profile_expiry_seconds`, and `<prefix>_profile_revisions_refused_total` over
    `refused` (every tenant's state; by default `state`'s)."""
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
    yield refused_revisions(prefix, (state,) if refused is None else refused)


def refused_revisions(prefix: str, states: Iterable[PolicyState]) -> Metric:
    """`<prefix>_profile_revisions_refused_total{reason}`: revisions over the size cap
    (`too-large`), over the count cap (`too-many`) or refused by the verifier (`unverified`)."""
    family = CounterMetricFamily(
        f"{prefix}_profile_revisions_refused",
        "Profile revisions refused: over the size cap (too-large), over the count cap "
        "(too-many), or by the verifier (unverified).",
        labels=["reason"],
    )
    totals = dict.fromkeys(REFUSAL_REASONS, 0)
    for state in states:
        for reason, count in state.followed.refused_total.items():
            totals[reason] += count
    for reason, count in totals.items():
        family.add_metric([reason], float(count))
    return family
