"""What the tenant's junk costs the owner's parts: their memory while the tenant's namespace admin
writes hundreds of labelled ConfigMaps where every part looks for signed profile revisions.

The whole stack runs on the local control plane as the e2e tests run it
(`localcluster.install.stack`: the chart installed, the extender, two allocation-controller
replicas and the tenant's webhook as local processes under their ServiceAccounts, following
revisions), with one fake H100 node and one engine Pod placed and verified. Then, as the
namespace's admin identity, in phases:

* `large`: ConfigMaps of 900,000 bytes of data each, near the API server's 1 MiB limit and
  over the 256 KiB cap (`policy_io.caps`): refused unread. Each is the costliest junk there is
  to verify (`junk`): before the cap, 48 of them kept 930 MiB of refusals alive in one feed;
* `under-cap`: ConfigMaps of 250,000 bytes of the same junk, just under the cap: each parsed,
  refused and let go;
* `small`: many small junk ConfigMaps;
* `copies`: copies of the owner's own signed profile, past the count cap of 32;
* `loop`: one ConfigMap rewritten again and again (each write a new revision, judged once);
* `restart`: every part killed (SIGKILL, as an OOM kill ends it) and started again, listing
  all of the above;
* `check`: the engine Pod verified before is as it was, and a new one is placed and verified.

Each part's resident memory (VmRSS, and VmHWM for the peak between samples) is sampled every
quarter second throughout, and each phase's figures are written to
bench/results/tenant_junk.json as it ends. The figure: each part's RSS flat (at the end within
`FLAT_MIB` of where it started) and below its chart limit (charts/tmi/values.yaml).

Run: `.venv/bin/python bench/bench_tenant_junk.py [--large N] [--under-cap N] [--small N]
[--copies N] [--rewrites N]`; the default run takes about three minutes on 2 cores. It measures;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path

from inference_policy.trust.signing import BUNDLE_KEY, DIGEST_KEY, PAYLOAD_TYPE  # noqa: E402
from kits.profilekit import CLUSTER, Owner, with_profiles  # noqa: E402
from kits.stackkit import LARGE, dated, whole_h100_profile  # noqa: E402
from localcluster import (  # noqa: E402
    ControlPlane,
    FakeNode,
    Kube,
    bin_dir,
    create_fake_nodes,
    wait_until,
)
from localcluster.install.stack import (  # noqa: E402
    CONDITION,
    StackSettings,
    TenantStack,
    condition,
    deploy_stack,
    engine_pod,
)
from localcluster.plane.metrics import metric  # noqa: E402
from localcluster.servers.server import LocalServer  # noqa: E402
from policy_io import caps  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "tenant_junk.json"
PROFILE = "kamiwaza-inference-profiles-r1"
LABELS = {"kamiwaza.ai/inference-profile": "true"}
# Under the API server's 1 MiB and under the verifier's own bound on a bundle (900 KiB), so a
# verifier without the cap parses it whole.
NEAR_LIMIT = 900_000
UNDER_CAP = 250_000
SMALL = 4_000
REWRITTEN = 200_000
SAMPLE_SECONDS = 0.25
SETTLE_SECONDS = 10.0
FLAT_MIB = 32.0
PARTS = ("extender", "controller-0", "controller-1", "webhook")


def chart_limits() -> dict[str, float]:
    """Each part's memory limit in MiB, as charts/tmi/values.yaml sets it."""
    values = yaml.safe_load((ROOT / "charts" / "tmi" / "values.yaml").read_text())

    def mib(text: str) -> float:
        units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
        return float(text[:-2]) * units[text[-2:]]

    owner = values["owner"]
    controller = mib(owner["controller"]["resources"]["limits"]["memory"])
    return {
        "extender": mib(owner["extender"]["resources"]["limits"]["memory"]),
        "controller-0": controller,
        "controller-1": controller,
        "webhook": mib(values["tenant"]["webhook"]["resources"]["limits"]["memory"]),
    }


def memory(pid: int) -> tuple[float, float]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), MiB."""
    found = {"VmRSS": 0.0, "VmHWM": 0.0}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in found:
                found[key] = int(line.split()[1]) / 1024
    return round(found["VmRSS"], 1), round(found["VmHWM"], 1)


class Sampler:
    """Every part's RSS every `SAMPLE_SECONDS`, labelled with the phase, on a thread of its own;
    a part restarted is found again by its new process."""

    def __init__(self, servers: Callable[[], dict[str, LocalServer]]) -> None:
        self.servers = servers
        self.phase = "start"
        self.samples: list[tuple[float, str, dict[str, float]]] = []
        self.peaks: dict[str, dict[str, float]] = {}
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> dict[str, float]:
        now: dict[str, float] = {}
        for part, server in self.servers().items():
            if server.process is None or not server.running():
                continue
            rss, hwm = memory(server.process.pid)
            now[part] = rss
            peaks = self.peaks.setdefault(self.phase, {})
            peaks[part] = max(peaks.get(part, 0.0), rss, hwm)
        self.samples.append((round(time.monotonic() - self.started, 2), self.phase, now))
        return now

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def junk(namespace: str, name: str, size: int, *, immutable: bool = True) -> dict[str, Any]:
    """A labelled ConfigMap of about `size` bytes that costs a verifier the most: immutable, a
    bundle with its true sha256 and strict JSON, so it is parsed whole, whose signatures are
    `size / 3` empty lists (some 19 MiB of Python objects from 900 KB of text) refused only
    after the parse. (One rewritten in a loop cannot be immutable.)"""
    head = json.dumps({"payloadType": PAYLOAD_TYPE, "payload": ""}, separators=(",", ":"))
    count = max(0, size - len(head) - 80) // 3
    bundle = head[:-1] + ',"signatures":[' + ",".join(["[]"] * count) + "]}"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS},
        "immutable": immutable,
        "data": {BUNDLE_KEY: bundle, DIGEST_KEY: hashlib.sha256(bundle.encode()).hexdigest()},
    }


def verdict(kube: Kube, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    pod = kube.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
        timeout=timeout,
        what=f"Pod {name} verified",
    )
    return dict(condition(pod, CONDITION) or {})


def refused_counts(stack: TenantStack) -> dict[str, dict[str, float]]:
    """Each part's `*_profile_revisions_refused_total`, by reason."""
    counts: dict[str, dict[str, float]] = {}
    for part, server in servers_of(stack).items():
        prefix = {"extender": "tmi_extender", "webhook": "tmi_webhook"}.get(part, "tmi_allocation")
        with contextlib.suppress(Exception):
            samples = server.metrics()
            counts[part] = {
                reason: metric(samples, f"{prefix}_profile_revisions_refused_total", reason=reason)
                for reason in caps.REFUSAL_REASONS
            }
    return counts


def servers_of(stack: TenantStack) -> dict[str, LocalServer]:
    assert stack.extender and stack.controller and stack.webhook
    return {
        "extender": stack.extender,
        "controller-0": stack.controller.replicas[0],
        "controller-1": stack.controller.replicas[1],
        "webhook": stack.webhook,
    }


def build() -> str:
    """The checkout's commit (the run is of the source, whatever else the tree holds)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"source {head}" if head else "source"


class Run:
    """The run's figures, written out as each phase ends."""

    def __init__(self, args: argparse.Namespace, sampler: Sampler) -> None:
        self.sampler = sampler
        self.limits = chart_limits()
        self.phases: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.results: dict[str, Any] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "build": build(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "caps": {
                "max_profile_revisions": caps.MAX_PROFILE_REVISIONS,
                "max_revision_bytes": caps.MAX_REVISION_BYTES,
            },
            "junk": {
                "large": [args.large, NEAR_LIMIT],
                "under_cap": [args.under_cap, UNDER_CAP],
                "small": [args.small, SMALL],
                "copies": args.copies,
                "rewrites": [args.rewrites, REWRITTEN],
            },
            "chart_limits_mib": self.limits,
            "flat_mib": FLAT_MIB,
        }

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        self.sampler.phase = name
        started = time.monotonic()
        figures: dict[str, Any] = {"phase": name}
        yield figures
        figures["seconds"] = round(time.monotonic() - started, 1)
        figures["rss_mib_end"] = self.sampler.sample()
        figures["rss_mib_peak"] = dict(self.sampler.peaks.get(name, {}))
        self.phases.append(figures)
        print(json.dumps(figures), flush=True)
        self.write()

    def summary(self) -> dict[str, Any]:
        """Each part: where it started, its peak, where it ended, its chart limit."""
        if not self.phases:
            return {}
        first, last = self.phases[0]["rss_mib_end"], self.phases[-1]["rss_mib_end"]
        out: dict[str, Any] = {}
        for part in PARTS:
            if part not in first or part not in last:
                continue
            peak = max(p["rss_mib_peak"].get(part, 0.0) for p in self.phases[1:] or self.phases)
            limit = self.limits[part]
            out[part] = {
                "start_mib": first[part],
                "peak_mib": peak,
                "end_mib": last[part],
                "limit_mib": limit,
                "peak_of_limit": round(peak / limit, 3),
                "flat": last[part] - first[part] <= FLAT_MIB,
                "below_limit": peak < limit,
            }
        return out

    def write(self) -> None:
        results = {
            **self.results,
            "phases": self.phases,
            **self.extra,
            "summary": self.summary(),
            # One sample a second is plenty to plot; the peaks above are from every sample.
            "samples": [s for i, s in enumerate(self.sampler.samples) if i % 4 == 0],
        }
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def write_junk(installer: Kube, namespace: str, prefix: str, count: int, size: int) -> None:
    for index in range(count):
        installer.create(junk(namespace, f"{prefix}-{index:04d}", size))


def settle(stack: TenantStack, expected: Callable[[dict[str, dict[str, float]]], bool]) -> None:
    """Until every part has judged what was written (its counters say so), then a few seconds
    more for what it let go to be collected."""
    wait_until(
        lambda: expected(refused_counts(stack)),
        timeout=300,
        what="every part to judge the junk",
        interval=1.0,
    )
    time.sleep(SETTLE_SECONDS)


def restart(stack: TenantStack) -> None:
    """Every part killed at once, then started again, each listing the junk afresh."""
    assert stack.extender and stack.controller and stack.webhook
    servers = servers_of(stack)
    for server in servers.values():
        server.kill()
    stack.extender.start()
    stack.controller.start()
    stack.webhook.start()


def run(args: argparse.Namespace, plane: ControlPlane) -> None:
    owner = Owner()
    namespace = f"tmi-junk-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        bundle_configmap=PROFILE,
        follow_revisions=True,
        scheduling_timeout_seconds=120,
    )
    envelope = dated(with_profiles(owner, whole_h100_profile()), namespace)
    admin = plane.kube("admin")
    with deploy_stack(plane, settings, owner.sign(envelope, name=PROFILE)) as stack:
        plane.grant_namespace_admin("tmi-installer", namespace)
        installer = plane.kube("tmi-installer")
        node = f"junk-h100-{uuid.uuid4().hex[:4]}"
        create_fake_nodes(
            admin, [FakeNode(node, gpu_product="NVIDIA-H100-80GB-HBM3", gpus=8, vram_gb=80)]
        )
        assert stack.extender is not None
        stack.extender.wait_nodes([node])
        sampler = Sampler(lambda: servers_of(stack))
        sampler.start()
        record = Run(args, sampler)
        try:
            with record.phase("baseline") as figures:
                installer.create(engine_pod(namespace, LARGE, name="before"))
                first = verdict(admin, namespace, "before")
                time.sleep(SETTLE_SECONDS)
                figures["verdict"] = first["reason"]
            written = {"too-large": 0, "unverified": 0, "too-many": 0}

            def judged(counts: dict[str, dict[str, float]]) -> bool:
                return len(counts) == len(PARTS) and all(
                    all(c.get(reason, 0) >= n for reason, n in written.items())
                    for c in counts.values()
                )

            with record.phase("large"):
                write_junk(installer, namespace, "junk-large", args.large, NEAR_LIMIT)
                written["too-large"] += args.large
                settle(stack, judged)
            with record.phase("under-cap"):
                write_junk(installer, namespace, "junk-under", args.under_cap, UNDER_CAP)
                written["unverified"] += args.under_cap
                settle(stack, judged)
            with record.phase("small"):
                write_junk(installer, namespace, "junk-small", args.small, SMALL)
                written["unverified"] += args.small
                settle(stack, judged)
            with record.phase("copies"):
                signed = stack.profile
                for index in range(args.copies):
                    metadata = {
                        k: v
                        for k, v in signed["metadata"].items()
                        if k not in ("uid", "resourceVersion", "creationTimestamp")
                    }
                    installer.create(
                        {**signed, "metadata": {**metadata, "name": f"copy-{index:03d}"}}
                    )
                written["too-many"] += max(0, args.copies + 1 - caps.MAX_PROFILE_REVISIONS)
                settle(stack, judged)
            with record.phase("loop"):
                installer.create(junk(namespace, "junk-looped", SMALL, immutable=False))
                path = f"/api/v1/namespaces/{namespace}/configmaps/junk-looped"
                data = junk(namespace, "junk-looped", REWRITTEN)["data"]
                for index in range(args.rewrites):
                    # Each write differs from the last (a write that changes nothing is no new
                    # revision).
                    body = {"data": {**data, "write": str(index)}}
                    installer.request(
                        "PATCH",
                        path,
                        body=body,
                        content_type="application/merge-patch+json",
                    )
                written["unverified"] += 1 + args.rewrites
                settle(stack, judged)
            record.extra["refused_before_restart"] = refused_counts(stack)
            with record.phase("restart") as figures:
                started = time.monotonic()
                restart(stack)
                figures["ready_seconds"] = round(time.monotonic() - started, 1)
                # Listed afresh, each judges every revision again, once.
                relisted = {k: v for k, v in written.items() if k != "unverified"}
                relisted["unverified"] = args.under_cap + args.small + 1
                written.update(relisted)
                settle(stack, judged)
            with record.phase("check") as figures:
                again = condition(admin.get("v1", "Pod", "before", namespace), CONDITION) or {}
                kept = ("status", "reason", "lastTransitionTime")
                figures["before_unchanged"] = all(again.get(k) == first.get(k) for k in kept)
                started = time.monotonic()
                installer.create(engine_pod(namespace, LARGE, name="after"))
                after = verdict(admin, namespace, "after")
                figures["after_verdict"] = after["reason"]
                figures["after_seconds"] = round(time.monotonic() - started, 2)
                pod = admin.get("v1", "Pod", "after", namespace)
                figures["after_node"] = pod["spec"].get("nodeName")
                time.sleep(SETTLE_SECONDS)
            record.extra["refused_after_restart"] = refused_counts(stack)
        finally:
            sampler.stop()
            record.write()
    print(json.dumps(record.summary(), indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--large", type=int, default=120, help="ConfigMaps near the 1 MiB limit")
    parser.add_argument("--under-cap", type=int, default=100, help="ConfigMaps just under the cap")
    parser.add_argument("--small", type=int, default=400, help="small junk ConfigMaps")
    parser.add_argument("--copies", type=int, default=40, help="copies of the owner's profile")
    parser.add_argument("--rewrites", type=int, default=300, help="writes of one ConfigMap")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tmi-junk-") as workdir:
        plane = ControlPlane.start(Path(workdir), bin_dir())
        try:
            run(args, plane)
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
