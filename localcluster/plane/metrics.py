"""Prometheus text exposition as the tests read it from the tmi servers' /metrics.

The e2e tests and benchmarks assert on counters and gauges the servers export (decisions,
leadership, cache sizes). The text is read by prometheus_client's own parser, the reference
reader of the format the servers write with the same library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of an exposition (a counter's `_total`, a histogram's `_bucket`, ...)."""
    return [
        Sample(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def metric(samples: Iterable[Sample], name: str, /, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


__all__ = ["Sample", "metric", "parse_metrics"]
