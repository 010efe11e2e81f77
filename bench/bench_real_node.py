"""Benchmark of the real node: what its tests and the demo pay, and what a Pod's start costs.

One run brings up a plane with a pod network and the real node (``localcluster.nodes.realnode``),
and times: the node from nothing to Ready with the fixture's GPUs allocatable; the tmi image's
assembly and import; the chart installed with its Deployments until every one is available;
Pods of the probe image from create to every container running (default scheduler, no tmi in
the namespace); and engine Pods from create to Ready through the chart's own Pods (webhook,
owner's scheduler with the extender, allocation controller), one at a time, each deleted before
the next. Times are wall clock on this machine, polled every 20 ms.

Run with ``.venv/bin/python bench/bench_real_node.py [--pods N] [--engines N]``. It writes
bench/results/real_node.json and prints it; it measures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kits.nodekit import is_ready, probe_pod, running  # noqa: E402
from kits.profilekit import CLUSTER, Owner, with_profiles  # noqa: E402
from kits.stackkit import LARGE, dated, whole_h100_profile  # noqa: E402
from localcluster import ControlPlane, Kube  # noqa: E402
from localcluster.install.stack_settings import StackSettings  # noqa: E402
from localcluster.nodes.node_images import (  # noqa: E402
    PROBE,
    engine_image_map,
    scheduler_image,
    tmi_image,
)
from localcluster.nodes.node_stack import deploy_chart  # noqa: E402
from localcluster.nodes.podnet import PodNetwork  # noqa: E402
from localcluster.nodes.realnode import RealNode  # noqa: E402
from localcluster.plane.binaries import versions  # noqa: E402
from localcluster.plane.process import wait_until  # noqa: E402
from localcluster.servers.engine_pods import engine_pod  # noqa: E402

RESULT = ROOT / "bench" / "results" / "real_node.json"


def _until(kube: Kube, namespace: str, name: str, holds: Callable[[Any], bool]) -> None:
    """Poll the Pod every 20 ms until ``holds`` (the benchmark's own clock times the wait)."""
    wait_until(
        lambda: holds(kube.get("v1", "Pod", name, namespace)),
        timeout=120.0,
        what=f"Pod {namespace}/{name}",
        interval=0.02,
        max_interval=0.02,
    )


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "p50_s": round(statistics.median(ordered), 3),
        "p99_s": round(p99, 3),
        "max_s": round(ordered[-1], 3),
    }


def _probe_pods(plane: ControlPlane, count: int) -> list[float]:
    kube = plane.kube("admin")
    namespace = plane.create_namespace(f"bench-{uuid.uuid4().hex[:6]}")["metadata"]["name"]
    times = []
    for _ in range(count):
        name = f"probe-{uuid.uuid4().hex[:6]}"
        start = time.monotonic()
        kube.create(probe_pod(namespace, name))
        _until(kube, namespace, name, running)
        times.append(time.monotonic() - start)
        kube.delete("v1", "Pod", name, namespace, grace_period_seconds=0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--engines", type=int, default=5)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": os.getloadavg()[0],
    }
    started = time.monotonic()
    with ControlPlane.start(pod_network=PodNetwork(), start_kwok=False) as plane:
        result["plane_start_s"] = round(time.monotonic() - started, 2)
        begun = time.monotonic()
        node = RealNode.start(plane)
        result["node_ready_s"] = round(time.monotonic() - begun, 2)
        try:
            begun = time.monotonic()
            images = [
                tmi_image(plane.workdir / "images" / "tmi"),
                scheduler_image(plane.workdir / "images", versions().kubernetes),
            ]
            for image in images:
                node.import_image(image)
            result["images_assembled_and_imported_s"] = round(time.monotonic() - begun, 2)
            result["probe_pod_start"] = _summary(_probe_pods(plane, args.pods))
            # Kept as soon as measured: the chart's part below can be stopped without losing it.
            RESULT.write_text(json.dumps(result, indent=2) + "\n")

            owner = Owner()
            envelope = dated(with_profiles(owner, whole_h100_profile()), "kamiwaza")
            settings = StackSettings(
                owner_public_keys=(owner.public_key,),
                cluster_binding_id=CLUSTER,
                engine_image_map=engine_image_map(node.images[PROBE]),
            )
            begun = time.monotonic()
            with deploy_chart(
                plane, settings, owner.sign(envelope), tmi=images[0], scheduler=images[1]
            ) as chart:
                result["chart_available_s"] = round(time.monotonic() - begun, 2)
                kube = plane.kube("admin")
                times = []
                for _ in range(args.engines):
                    pod = engine_pod(chart.namespace, LARGE)
                    name = pod["metadata"]["name"]
                    start = time.monotonic()
                    kube.create(pod)
                    _until(kube, chart.namespace, name, is_ready)
                    times.append(time.monotonic() - start)
                    kube.delete("v1", "Pod", name, chart.namespace, grace_period_seconds=0)
                    wait_until(
                        lambda n=name: _gone(kube, chart.namespace, n),  # type: ignore[misc]
                        timeout=120.0,
                        what=f"Pod {name} gone",
                        interval=0.02,
                    )
                result["engine_pod_create_to_ready"] = _summary(times)
        finally:
            node.stop()
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _gone(kube: Kube, namespace: str, name: str) -> bool:
    listed = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    return all(p["metadata"]["name"] != name for p in listed.get("items") or [])


if __name__ == "__main__":
    sys.exit(main())
