"""The figures `bench_peer.py` reports from what it measured: medians over the burst's repeats,
the steady-arrival table, and the targets, each met or missed.

Targets (BENCHMARKS.md): under steady arrival, `tmi`'s create-to-bound p99 at most 1.2 times
the constant webhook and extender's at every rate (what `tmi`'s decisions add to the cheapest
webhook and extender written as its are), and ahead of HAMi as its chart installs it at every
rate. A Pod not bound by the end of its window is slower than any that was, so a p99 that
falls on one (None) is behind every measured one.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TARGET_VS_CONSTANT = 1.2
HEADLINE_PEER = "hami-installed"
BOOTSTRAP = 2000


def summary_ms(samples_ms: Sequence[float]) -> dict[str, float | int]:
    ordered = sorted(samples_ms)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2)

    return {
        "count": len(ordered),
        "p50_ms": pct(0.5),
        "p90_ms": pct(0.9),
        "p99_ms": pct(0.99),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


def combine(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The median over repeats of each figure the runs share."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [run[key] for run in runs if key in run]
        if len(values) != len(runs):
            continue
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = round(statistics.median(values), 3)
        elif all(isinstance(v, dict) for v in values):
            out[key] = combine(values)
    return out


def _slower(value: float | None) -> float:
    return math.inf if value is None else value


def steady_table(steady: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per rate, each system's create-to-bound p50 / p99 and unbound Pods, and the load."""
    table: dict[str, dict[str, Any]] = {}
    for system, by_rate in steady.items():
        for rate, window in by_rate.items():
            figures = window["create_to_bound"]
            table.setdefault(rate, {})[system] = {
                "p50_ms": figures["p50_ms"],
                "p99_ms": figures["p99_ms"],
                "unbound": figures["unbound"],
                "of": figures["count"],
                # Where the time goes: the create call (the webhook) and after it.
                "create_call_p50_p99_ms": [
                    window["create_call"]["p50_ms"],
                    window["create_call"]["p99_ms"],
                ],
                "created_to_bound_p50_p99_ms": [
                    window["created_to_bound"]["p50_ms"],
                    window["created_to_bound"]["p99_ms"],
                ],
                "api_requests_per_pod": window["api_requests_per_pod_bound"].get("total"),
                "load_average_1m": window["load_average_1m"],
            }
    return table


def _p99(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def p99_ratio_interval(
    numerator: Sequence[float | None], denominator: Sequence[float | None], seed: int = 0
) -> list[float] | None:
    """A 90% bootstrap interval for p99(numerator) / p99(denominator), each side resampled
    independently: with a few dozen Pods a p99 is the slowest one, and the interval says how
    far chance alone moves the ratio. None when an unbound Pod is among either side."""
    if any(v is None for v in (*numerator, *denominator)) or not numerator or not denominator:
        return None
    top = [float(v) for v in numerator if v is not None]
    bottom = [float(v) for v in denominator if v is not None]
    rng = random.Random(seed)
    ratios = sorted(
        _p99(rng.choices(top, k=len(top))) / _p99(rng.choices(bottom, k=len(bottom)))
        for _ in range(BOOTSTRAP)
    )
    return [round(ratios[int(0.05 * BOOTSTRAP)], 3), round(ratios[int(0.95 * BOOTSTRAP)], 3)]


def targets(
    table: Mapping[str, Mapping[str, Any]],
    samples: Mapping[str, Mapping[str, Sequence[float | None]]] | None = None,
) -> dict[str, Any]:
    """Each target, per rate and overall; `samples` (per rate, per system, each Pod's ms)
    adds the interval of each ratio."""
    against_constant: dict[str, float | None] = {}
    intervals: dict[str, list[float] | None] = {}
    against_peer: dict[str, dict[str, Any]] = {}
    for rate, systems in table.items():
        tmi = systems.get("tmi", {}).get("p99_ms")
        constant = systems.get("constant", {}).get("p99_ms")
        if "tmi" in systems and "constant" in systems:
            against_constant[rate] = (
                round(tmi / constant, 3) if tmi is not None and constant else None
            )
            if samples is not None and rate in samples:
                intervals[rate] = p99_ratio_interval(
                    samples[rate].get("tmi", []), samples[rate].get("constant", [])
                )
        if "tmi" in systems and HEADLINE_PEER in systems:
            peer = systems[HEADLINE_PEER]["p99_ms"]
            against_peer[rate] = {
                "tmi_p99_ms": tmi,
                "peer_p99_ms": peer,
                "ahead": _slower(tmi) < _slower(peer),
            }
    ratios = list(against_constant.values())
    return {
        "tmi_p99_vs_constant": {
            "target": f"at most {TARGET_VS_CONSTANT}x at every rate",
            "by_rate": against_constant,
            "by_rate_90pct_interval": intervals,
            "worst": max((_slower(r) for r in ratios), default=None),
            "met": bool(ratios) and all(r is not None and r <= TARGET_VS_CONSTANT for r in ratios),
        },
        "tmi_p99_vs_hami_installed": {
            "target": "ahead at every rate",
            "by_rate": against_peer,
            "met": bool(against_peer) and all(v["ahead"] for v in against_peer.values()),
        },
    }


def api_requests(steady: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each system's path's API requests per Pod bound over every rate, by kind."""
    out: dict[str, Any] = {}
    for system, by_rate in steady.items():
        totals: dict[str, int] = {}
        bound = 0
        for window in by_rate.values():
            bound += window["bound"]
            for key, value in window["api_requests"].items():
                totals[key] = totals.get(key, 0) + value
        if bound:
            out[system] = {key: round(value / bound, 2) for key, value in totals.items()}
    return out


def summarise(data: dict[str, Any]) -> None:
    """Add (or refresh) `data["summary"]` from what `data` holds so far."""
    out: dict[str, Any] = {
        "pod_create": {
            name: summary_ms(samples)
            for name, samples in data.get("pod_create_samples_ms", {}).items()
            if samples
        },
        "burst": {
            stream: {name: combine(runs) for name, runs in by_system.items()}
            for stream, by_system in data.get("burst", {}).items()
        },
    }
    steady = data.get("steady", {})
    if steady:
        table = steady_table(steady)
        samples: dict[str, dict[str, list[float | None]]] = {}
        for system, by_rate in steady.items():
            for rate, window in by_rate.items():
                samples.setdefault(rate, {})[system] = window.get("create_to_bound_ms", [])
        out["steady_create_to_bound"] = table
        out["targets"] = targets(table, samples)
        out["api_requests_per_pod_steady"] = api_requests(steady)
    data["summary"] = out


class Record:
    """Everything measured so far, rewritten to the results file after every run."""

    def __init__(self, path: Path, head: dict[str, Any]) -> None:
        self.path = path
        self.data = head
        self.started = time.monotonic()
        self.data["phases_started_at_s"] = {}

    def phase(self, name: str) -> None:
        """When a phase began, seconds into the run."""
        self.data["phases_started_at_s"][name] = round(time.monotonic() - self.started, 1)

    def write(self) -> None:
        self.data["wall_seconds"] = round(time.monotonic() - self.started, 1)
        self.data["load_average_1m"]["last"] = round(os.getloadavg()[0], 2)
        summarise(self.data)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


__all__ = ["Record", "combine", "steady_table", "summarise", "summary_ms", "targets"]
