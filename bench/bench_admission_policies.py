"""What the owner's admission policies cost a Pod create, piece by piece, on the real API server.

`bench_pod_create.py` measures what a tenant waits for; this says where the policies' part of it
goes, so a change to their CEL can be judged by a figure. One kube-apiserver 1.36 from
`localcluster` (no scheduler, no webhook), one namespace per variant, server-side dry-run creates
of a one-container Pod, the variants interleaved create by create:

* `none`: a namespace that is not opted in;
* `trivial-validation`: a ValidatingAdmissionPolicy whose only validation is `true` (the
  mechanism's own cost);
* `guard`: the chart's guard policy and its parameters (Pods sent already shielded);
* `shield-dispatched`: the chart's shield policy with a matchCondition that is false (dispatch,
  no mutation);
* `shield`: the chart's shield policy;
* `both`: both, as the chart installs them;
* `seed-guard`: seed 001's pod guard alone (`manifests/guard`), in `kamiwaza-extensions`, one of
  the two namespaces it binds;
* `seed-guard+tmi`: the seed's guard and every admission policy of the chart's owner part
  (shield, guard, claims, verdict, status, owner objects), in `kamiwaza`, opted in: what an
  owner who installed both asks of a Pod that is not an engine Pod. The target (Pod create of
  such a Pod within 1.2x, p99, of the seed's guard alone) is this pair's ratio, with a
  bootstrap interval.

Run: `.venv/bin/python bench/bench_admission_policies.py [--creates 1000]` (about two minutes).
Writes bench/results/admission_policies.json every 200 rounds and at the end. It measures; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from localcluster import ControlPlane, Kube, versions, wait_until  # noqa: E402
from localcluster.servers.admission_policies import enforced, render_policies  # noqa: E402
from localcluster.servers.guard import apply_guard  # noqa: E402
from localcluster.servers.webhook_objects import set_opt_in  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "admission_policies.json"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
WARMUP = 50
WRITE_EVERY = 200
VARIANTS = (
    "none",
    "trivial-validation",
    "guard",
    "shield-dispatched",
    "shield",
    "both",
    "seed-guard",
    "seed-guard+tmi",
)
# The namespaces seed 001's guard binds by name (`localcluster.servers.guard`).
SEED_NAMESPACES = {"seed-guard": "kamiwaza-extensions", "seed-guard+tmi": "kamiwaza"}
TARGET = 1.2


def _pod(namespace: str, shielded: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    if shielded:
        container["env"] = [VOID]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:10]}", "namespace": namespace},
        "spec": {"containers": [container]},
    }


def _trivial(kube: Kube, namespace: str) -> None:
    name = f"bench-trivial-{namespace}"
    rules = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods"],
        }
    ]
    kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": "true"}],
            },
        }
    )
    kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )


def _install(plane: ControlPlane, variant: str, namespace: str) -> None:
    kube = plane.kube("admin")
    if variant.startswith("seed-guard"):
        apply_guard(plane, namespace)
        if variant == "seed-guard":
            return
        variant = "both"
    if variant == "trivial-validation":
        _trivial(kube, namespace)
        return
    set_opt_in(plane, namespace, True)
    for doc in render_policies(namespace):
        kind = doc["kind"]
        mutating = kind.startswith("Mutating")
        if variant == "guard" and mutating:
            continue
        if variant.startswith("shield") and kind.startswith("Validating"):
            continue
        applied = copy.deepcopy(doc)
        if variant == "shield-dispatched" and kind == "MutatingAdmissionPolicy":
            applied["spec"]["matchConditions"].append({"name": "never", "expression": "false"})
        kube.apply(applied)
    if variant == "both":
        wait_until(
            lambda: enforced(plane, namespace, render_policies(namespace)),
            timeout=60,
            what="the policies to act",
        )


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)

    return {"p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99)}


def _seed_ratio(times: dict[str, list[float]]) -> dict[str, Any]:
    """p99 of the seed's guard with tmi's policies over the seed's guard alone, with a 95%
    bootstrap interval (each side resampled independently), against the 1.2x target."""
    with_tmi, alone = times["seed-guard+tmi"], times["seed-guard"]
    ratio = _p99(with_tmi) / _p99(alone)
    rng = random.Random(7)
    draws = sorted(
        _p99(rng.choices(with_tmi, k=len(with_tmi))) / _p99(rng.choices(alone, k=len(alone)))
        for _ in range(1000)
    )
    return {
        "p99_ratio": round(ratio, 3),
        "p99_ratio_95": [round(draws[25], 3), round(draws[974], 3)],
        "p50_ratio": round(_pct(with_tmi, 0.5) / _pct(alone, 0.5), 3),
        "target": TARGET,
        "met": ratio <= TARGET,
    }


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _p99(samples: list[float]) -> float:
    return _pct(samples, 0.99)


def _report(times: dict[str, list[float]], creates: int, load_before: float) -> dict[str, Any]:
    summaries = {v: _summary(s) for v, s in times.items()}
    base = summaries["none"]["p50_ms"]
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "kubernetes": versions().kubernetes,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_now": round(os.getloadavg()[0], 2),
        "creates_per_variant": creates,
        "creates_done_per_variant": len(times["none"]),
        "variants": summaries,
        "added_p50_ms": {v: round(s["p50_ms"] - base, 3) for v, s in summaries.items()},
        "seed_guard_target": _seed_ratio(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--creates", type=int, default=1000, help="measured creates per variant")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    plane = ControlPlane.start(start_scheduler=False, start_kwok=False)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        kube = plane.kube("admin")
        namespaces = {v: SEED_NAMESPACES.get(v, f"bench-policy-{v}") for v in VARIANTS}
        for variant, namespace in namespaces.items():
            plane.create_namespace(namespace)
            if variant != "none":
                _install(plane, variant, namespace)
        # Policies load asynchronously; the shielded variants prove themselves above, the rest
        # get the same settling time before anything is measured.
        time.sleep(5)
        for index in range(WARMUP + args.creates):
            for variant, namespace in namespaces.items():
                pod = _pod(
                    namespace,
                    shielded=variant in ("trivial-validation", "guard", "shield-dispatched"),
                )
                started = time.perf_counter()
                kube.create(pod, dry_run=True)
                elapsed = (time.perf_counter() - started) * 1000
                if index >= WARMUP:
                    times[variant].append(elapsed)
            # What is measured so far is kept, should the run be stopped.
            done = index + 1 - WARMUP
            if done > 0 and (done % WRITE_EVERY == 0 or done == args.creates):
                RESULTS.write_text(
                    json.dumps(_report(times, args.creates, load_before), indent=2) + "\n"
                )
    finally:
        plane.stop()
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
