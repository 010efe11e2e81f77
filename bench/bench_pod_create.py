"""Pod-create latency through the real API server: without a webhook, with a constant-answer
webhook, and with `tmi`'s admission webhook, the three interleaved burst by burst.

What a tenant notices of the webhook is the time `kubectl apply` (or the platform's client)
waits for a Pod create. This measures exactly that on the local control plane (etcd and
kube-apiserver v1.36 from `localcluster`). `tmi`'s webhook runs as its own process under the
shipped Role, behind the owner's MutatingWebhookConfiguration, for the tenant namespace it
serves. A second configuration, the same document with its own name, webhook names and opt-in
label value, sends a second namespace's Pods to a webhook that answers every review with `tmi`'s
own answer for that kind of Pod, prepared once (`bench/constant_webhook.py`). A third namespace
is opted in to neither. The gap between "without" and "constant" is what any webhook costs, the
gap between "constant" and "with" is what this webhook's decisions cost. Nothing else differs:
the namespaces carry the same labels but the opt-in, and the Pods are the same.

The modes are interleaved in bursts (one create, or `--concurrency` creates sent at once, of one
mode), the bursts' modes going round all six orders of the three, so each mode comes after each
other mode equally often; they are not measured one after another: on a shared machine a
neighbour's load comes and goes within seconds, and a p99 is the few slowest creates, so modes
measured minutes apart differed by more than `tmi` adds. Interleaved, a slow second hits every
mode alike. Both configurations stay in
place throughout, so every create, "without" included, passes the API server's two namespace
selector checks (microseconds against milliseconds).

Cases, each `--creates` real (stored) creates per mode, spread over `--rounds` rounds:

* engine Pods (label, deployment request) created one after another: each is planned, one
  call from the API server to the webhook and a JSON Patch back;
* the same, `--concurrency` at once (a Deployment scaled by that many): each burst's creates are
  of one mode, sent together, and the next burst waits for all of them;
* tenant Pods without accelerator fields, one after another. In `tmi`'s namespace the owner's
  admission policies shield them (`NVIDIA_VISIBLE_DEVICES=void` on each container) and check
  them inside the API server, and no webhook is called; the constant webhook's copy is the
  chart's fallback for clusters without admission policies, whose guard entry is sent such
  Pods to shield them, a small patch back. Against "without" (a namespace not opted in) this is
  what opting a namespace in costs the Pods that are not engine Pods.

Pods are created as cluster admin through one keep-alive connection pool, timed from request
to response. Each is checked to have been admitted as its mode says (planned or shielded with a
webhook, neither without), and each webhook's count of reviews answered must equal its mode's
creates, so none went to the other. Each round deletes its Pods (untimed) so etcd does not grow
across rounds. No scheduler or KWOK runs: the Pods stay Pending, which is all a create needs.
Creates per second per mode are the mode's creates over the wall time of its bursts.

etcd fsyncs its log as it does by default on a real cluster (`--no-fsync` gives the tests'
faster etcd, for comparison with earlier figures); everything runs on loopback. The webhook's
cost is a fixed round trip (reported as `added_*_ms` and broken down by the API server's and the
webhooks' own metrics).

The constant webhook, its configuration and the namespaces are `constant_pair.py`'s, shared with
`bench_peer.py`.

Needs the control-plane binaries (`make controlplane`). Run:
`.venv/bin/python bench/bench_pod_create.py [--creates 1800] [--rounds 12] [--concurrency 4]
[--no-fsync]` (about six minutes; 2,400 in 16 rounds took eight under a load of 3-6; `--creates
3600 --rounds 24` is the longer run of the earlier figures). Writes bench/results/pod_create.json
after each round, so a run stopped early keeps its completed rounds. It measures and compares
with the target; it asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path
sys.path.insert(0, str(ROOT / "bench"))


from constant_pair import (  # noqa: E402
    CONSTANT_WEBHOOKS,
    NAMESPACES,
    ConstantWebhook,
    create_namespaces,
    engine,
    in_namespace,
    metrics_text,
    tenant,
)

from inference_policy.base.access import unshielded  # noqa: E402
from kits.profilekit import CLUSTER, NAMESPACE, Owner  # noqa: E402
from localcluster import ControlPlane, Kube, versions  # noqa: E402
from localcluster.plane.metrics import metric, parse_metrics  # noqa: E402
from localcluster.servers.webhook import (  # noqa: E402
    DEFAULT_BUNDLE_CONFIGMAP,
    LocalWebhook,
    WebhookSettings,
    deploy_webhook,
    is_planned,
)

RESULTS = ROOT / "bench" / "results" / "pod_create.json"
TARGET_P99_VS_CONSTANT = 1.15
TARGET_P99_VS_NONE = 1.2
WARMUP = 20
MODES = ("without_webhook", "constant_webhook", "with_webhook")
BOOTSTRAP = 2000


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def p99_ratio_interval(
    numerator: list[float], denominator: list[float], seed: int = 0
) -> tuple[float, float]:
    """A 90% bootstrap interval for p99(numerator) / p99(denominator).

    A p99 of 3,600 samples is the 36th worst, so two runs of the same code can differ by a few
    milliseconds; the interval says whether a ratio's distance from a target is larger than
    that. Each side is resampled with replacement, independently: the modes' creates are
    interleaved in time, and ignoring that pairing makes the interval wider, not narrower."""
    rng = random.Random(seed)
    ratios = sorted(
        _p99(rng.choices(numerator, k=len(numerator)))
        / _p99(rng.choices(denominator, k=len(denominator)))
        for _ in range(BOOTSTRAP)
    )
    return round(ratios[int(0.05 * BOOTSTRAP)], 3), round(ratios[int(0.95 * BOOTSTRAP)], 3)


def _summary(samples: list[float]) -> dict[str, float | int]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)

    return {
        "count": len(ordered),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def _create(kube: Kube, pod: dict[str, Any], mode: str, engine: bool) -> float:
    start = time.perf_counter()
    stored = kube.create(pod)
    elapsed = time.perf_counter() - start
    # A create that was not admitted the way its mode says would measure the wrong thing: with
    # a webhook an engine Pod comes back planned and a tenant Pod shielded, without one neither.
    # (Which webhook answered is checked by the reviews each one counted, after the run.)
    changed = is_planned(stored) if engine else not unshielded(stored)
    if changed != (mode != "without_webhook"):
        raise SystemExit(
            f"Pod {pod['metadata']['namespace']}/{pod['metadata']['name']} ({mode}): "
            f"{'planned' if engine else 'shielded'}={changed}"
        )
    return elapsed


# Every order of the three modes, taken in turn: each mode then comes after each other mode
# equally often, so what one mode leaves behind (a busy webhook, a warm cache) falls on all.
ORDERS = tuple(itertools.permutations(MODES))


def _interleaved(
    kube: Kube,
    build: Callable[[str], dict[str, Any]],
    per_mode: int,
    concurrency: int,
    engine: bool,
    sent: dict[str, int],
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """About ``per_mode`` creates in each mode, in bursts of ``concurrency`` creates of one mode
    sent at once (a Deployment scaled by that many), the bursts' modes going round every order
    of the three. Returns each create's time and each mode's wall time, by mode; counts what
    each mode sent in ``sent``."""
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    walls = dict.fromkeys(MODES, 0.0)
    with ThreadPoolExecutor(concurrency) as pool:
        for burst in range(max(1, per_mode // concurrency)):
            for mode in ORDERS[burst % len(ORDERS)]:
                pods = [
                    in_namespace(build(f"bench-{uuid.uuid4().hex[:10]}"), NAMESPACES[mode])
                    for _ in range(concurrency)
                ]
                started = time.perf_counter()
                if concurrency == 1:
                    elapsed = [_create(kube, pods[0], mode, engine)]
                else:
                    modes = [mode] * len(pods)
                    elapsed = list(
                        pool.map(_create, [kube] * len(pods), pods, modes, [engine] * len(pods))
                    )
                walls[mode] += time.perf_counter() - started
                times[mode] += elapsed
                # tmi's webhook is sent engine Pods only; the policies answer for the others.
                if engine or mode != "with_webhook":
                    sent[mode] += len(pods)
    return times, walls


def _clear(kube: Kube) -> None:
    for namespace in NAMESPACES.values():
        kube.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"gracePeriodSeconds": 0}
        )


def _metric_mean_ms(text: str, family: str, **labels: str) -> float | None:
    """Mean of a Prometheus histogram family over the series with all of ``labels``."""
    samples = parse_metrics(text)
    count = metric(samples, family + "_count", **labels)
    return round(metric(samples, family + "_sum", **labels) / count * 1000, 3) if count else None


def _webhook_call_times(
    plane: ControlPlane, hook: LocalWebhook
) -> dict[str, float | dict[str, float | None] | None]:
    """Where the added time goes: the API server's call to each webhook, and `tmi`'s own
    handling of it (body received to answer ready), all as means over the whole run."""
    kube = plane.kube("admin")
    apiserver = kube.api_client.rest_client.pool_manager.request("GET", plane.server + "/metrics")
    own = metrics_text(hook.url, plane.ca_file)
    text = apiserver.data.decode()
    family = "apiserver_admission_webhook_admission_duration_seconds"
    return {
        "apiserver_webhook_call_mean_ms": {
            "tmi": _metric_mean_ms(text, family, name="pods.tenant-inference.kamiwaza.ai"),
            "tmi_guard": _metric_mean_ms(text, family, name="guard.tenant-inference.kamiwaza.ai"),
            "constant": _metric_mean_ms(text, family, name=f"pods.{CONSTANT_WEBHOOKS}"),
            "constant_guard": _metric_mean_ms(text, family, name=f"guard.{CONSTANT_WEBHOOKS}"),
        },
        "webhook_handling_mean_ms": _metric_mean_ms(
            own, "tmi_webhook_request_duration_seconds", endpoint="mutate"
        ),
    }


# The constant configuration's webhooks are `tmi`'s with this suffix, so the API server's
# metrics keep the two apart.
def _report(
    args: argparse.Namespace,
    per_round: int,
    rounds_done: int,
    load_before: float,
    samples: dict[str, dict[str, list[float]]],
    round_p99s: dict[str, dict[str, list[float]]],
    walls: dict[str, dict[str, float]],
) -> dict[str, Any]:
    """Every figure of the rounds done so far."""
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "kubernetes": versions().kubernetes,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        # The webhook process imports what this one does (the same PYTHONPATH, `python -P`).
        "setup": (
            f"etcd ({'fsync on, its default' if args.fsync else '--unsafe-no-fsync'}) + "
            "kube-apiserver from localcluster (no scheduler, no KWOK); tmi's webhook as its own "
            "process (uvloop, TLS) under the shipped Role, and a constant-answer webhook "
            "process (uvloop, TLS) returning tmi's own answers, each behind its own copy of "
            "the owner's MutatingWebhookConfiguration for its own namespace, and a third "
            "namespace opted in to neither; the three modes interleaved burst by burst; "
            "real creates as cluster admin over keep-alive connections, client, API server, "
            "etcd and both webhooks all on this machine"
        ),
        "etcd_fsync": args.fsync,
        "targets": {
            "p99 with tmi / p99 with the constant webhook": TARGET_P99_VS_CONSTANT,
            "p99 with tmi / p99 without a webhook": TARGET_P99_VS_NONE,
        },
        "creates_per_case_and_mode": per_round * rounds_done,
        "rounds": args.rounds,
        "rounds_done": rounds_done,
        "interleaved": (
            "in bursts of one create (or of the concurrency) per mode, the bursts' modes going "
            "round every order of the three"
        ),
        "warmup_per_batch_and_mode": WARMUP,
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_now": round(os.getloadavg()[0], 2),
        "cases": {},
    }
    for case, by_mode in samples.items():
        summaries = {mode: _summary(by_mode[mode]) for mode in MODES}
        without, constant_, with_ = (summaries[m] for m in MODES)

        def ratio(a: dict[str, Any], b: dict[str, Any], key: str = "p99_ms") -> float:
            return round(float(a[key]) / float(b[key]), 3)

        wall = walls[case]
        results["cases"][case] = {
            **summaries,
            "creates_per_second": {
                mode: round(len(by_mode[mode]) / wall[mode], 1) if wall[mode] else None
                for mode in MODES
            },
            "added_p50_ms": round(float(with_["p50_ms"]) - float(without["p50_ms"]), 2),
            "added_p99_ms": round(float(with_["p99_ms"]) - float(without["p99_ms"]), 2),
            "p99_ratio_vs_constant": ratio(with_, constant_),
            "p99_ratio_vs_constant_90pct_interval": p99_ratio_interval(
                by_mode["with_webhook"], by_mode["constant_webhook"]
            ),
            "p99_ms_per_round": round_p99s[case],
            "p99_ratio_vs_none": ratio(with_, without),
            "p99_ratio_vs_none_90pct_interval": p99_ratio_interval(
                by_mode["with_webhook"], by_mode["without_webhook"]
            ),
            "p99_ratio_constant_vs_none": ratio(constant_, without),
        }
        # A tenant Pod calls no webhook in `tmi`'s namespace: its ratio is information (what
        # opting a namespace in costs it); the target for it is bench_admission_policies.py's.
        if not case.startswith("tenant"):
            results["cases"][case]["meets_targets"] = (
                ratio(with_, constant_) <= TARGET_P99_VS_CONSTANT
                and ratio(with_, without) <= TARGET_P99_VS_NONE
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--creates", type=int, default=1800, help="creates per case and mode")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--no-fsync",
        dest="fsync",
        action="store_false",
        help="run etcd with --unsafe-no-fsync, as the tests do",
    )
    args = parser.parse_args()
    per_round = max(1, args.creates // args.rounds)
    cases: dict[str, tuple[Callable[[str], dict[str, Any]], int, bool]] = {
        "engine_sequential": (engine, 1, True),
        f"engine_concurrency_{args.concurrency}": (engine, args.concurrency, True),
        "tenant_sequential": (tenant, 1, False),
    }
    samples: dict[str, dict[str, list[float]]] = {c: {m: [] for m in MODES} for c in cases}
    round_p99s: dict[str, dict[str, list[float]]] = {c: {m: [] for m in MODES} for c in cases}
    walls: dict[str, dict[str, float]] = {c: dict.fromkeys(MODES, 0.0) for c in cases}
    owner = Owner()
    load_before = os.getloadavg()[0]
    plane = ControlPlane.start(start_scheduler=False, start_kwok=False, etcd_fsync=args.fsync)
    try:
        settings = WebhookSettings(
            owner_public_keys=(owner.public_key,),
            cluster_binding_id=CLUSTER,
            namespace=NAMESPACE,
            gpu_registry_credentials_secret="kamiwaza-pull",
            cpu_registry_credentials_secret="kamiwaza-pull",
            # The production default; the benchmark rotates nothing.
            cert_reload_seconds=10.0,
        )
        profile = owner.sign(name=DEFAULT_BUNDLE_CONFIGMAP)
        with deploy_webhook(plane, settings, profile) as hook:
            kube = plane.kube("admin")
            create_namespaces(plane)
            constant = ConstantWebhook(plane, hook)
            constant.install()
            answered_before = {
                "with_webhook": hook.reviews(),
                "constant_webhook": constant.reviews(),
            }
            sent = dict.fromkeys(MODES, 0)
            for round_ in range(args.rounds):
                for case, (build, concurrency, is_engine) in cases.items():
                    # Warm the connection pool and the servers' paths for this case.
                    _interleaved(kube, build, WARMUP, concurrency, is_engine, sent)
                    batch, wall = _interleaved(kube, build, per_round, concurrency, is_engine, sent)
                    for mode in MODES:
                        samples[case][mode] += batch[mode]
                        round_p99s[case][mode].append(round(_p99(batch[mode]) * 1000, 2))
                        walls[case][mode] += wall[mode]
                    _clear(kube)
                results = _report(
                    args, per_round, round_ + 1, load_before, samples, round_p99s, walls
                )
                # Each webhook answered exactly its own mode's creates: none went to the other.
                reviews = hook.reviews()
                answered = {
                    "with_webhook": reviews - answered_before["with_webhook"],
                    "constant_webhook": constant.reviews() - answered_before["constant_webhook"],
                }
                for mode, count in answered.items():
                    if count != sent[mode]:
                        raise SystemExit(f"{mode}: {count} reviews answered for {sent[mode]}")
                results["webhook_reviews_answered"] = reviews
                results["reviews_answered_during_the_rounds_by_mode"] = answered
                results.update(_webhook_call_times(plane, hook))
                RESULTS.parent.mkdir(exist_ok=True)
                RESULTS.write_text(json.dumps(results, indent=2) + "\n")
                print(f"round {round_ + 1}/{args.rounds} written", file=sys.stderr)
            constant.stop()
    finally:
        plane.stop()
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
