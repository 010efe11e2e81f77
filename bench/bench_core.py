"""Benchmark of the pure core: one plan, one profile verification, and verification per revision.

Run with `make bench` (or `.venv/bin/python bench/bench_core.py`). Prints a JSON summary and
writes it to bench/results/core.json. It measures; it asserts nothing.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from inference_policy.trust.signing import verify_configmap  # noqa: E402
from kits.profilekit import NOW, Owner, request  # noqa: E402
from policy_io.feed import PolicyFeed  # noqa: E402


def timed(fn: Callable[[], object], rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    return {
        "rounds": rounds,
        "p50_us": round(statistics.median(samples), 1),
        "p99_us": round(samples[int(len(samples) * 0.99) - 1], 1),
        "mean_us": round(statistics.fmean(samples), 1),
    }


def main() -> None:
    owner = Owner()
    configmap = owner.sign()
    policy = owner.policy()
    state = owner.state()
    derived_gpu = request()
    cpu = request("whispercpp", model__format="checkpoint")
    refused = request("mlx")
    for _ in range(200):
        state.decide(derived_gpu, NOW)

    results: dict[str, object] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "verify_profile": timed(lambda: verify_configmap(configmap, policy, NOW), 2000),
        "plan_gpu_derived": timed(lambda: state.decide(derived_gpu, NOW), 20000),
        "plan_cpu": timed(lambda: state.decide(cpu, NOW), 20000),
        "plan_refused_engine": timed(lambda: state.decide(refused, NOW), 20000),
    }
    # Serving code hands every ConfigMap event to the feed with its revision; only a new
    # revision costs a verification. 10,000 events and decisions on one revision -> 1.
    feed = PolicyFeed(owner.settings(), clock=lambda: NOW)
    first = {**configmap, "metadata": {**configmap["metadata"], "uid": "u", "resourceVersion": "1"}}
    for _ in range(10_000):
        feed.profile_read(first)
        feed.snapshot.decide(derived_gpu, NOW)
    feed.profile_read({**first, "metadata": {**first["metadata"], "resourceVersion": "2"}})
    results["verifications_for_10000_decisions_on_one_revision_then_one_more_revision"] = (
        feed.verifications
    )
    out = ROOT / "bench" / "results" / "core.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
