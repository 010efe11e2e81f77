"""`make demo`, last part: the same signed profile on a real node, with the chart's own Pods.

A plane whose API server serves real Pods, one real node (kubelet, containerd, runc, the CNI
bridge, kube-proxy; two H200s simulated through the device-plugin API), and the chart installed
as users install it: the webhook, the extender, the allocation controller and the owner's
kube-scheduler run as Pods on that node from the image this checkout assembles. The tenant's
namespace admin then deploys one engine Pod; the demo prints where it runs, its verdict, and the
device UUID its process was given, read from inside the container, beside the kubelet's record
of what the device plugin allocated.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from localcluster.install.stack_settings import StackSettings
from localcluster.nodes.fake_gpus import GpuFixture
from localcluster.nodes.kwok import node_table
from localcluster.nodes.node_images import PROBE, engine_image_map, scheduler_image, tmi_image
from localcluster.nodes.node_stack import ChartStack, deploy_chart
from localcluster.nodes.podnet import PodNetwork
from localcluster.nodes.realnode import RealNode, probe_report
from localcluster.plane.binaries import versions
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import pod_condition
from localcluster.servers.engine_pods import engine_pod, step7_row, table

FIXTURE = "h200-2x.json"
# The 70B on vLLM: the profile plans it onto both whole H200s.
REQUEST = "request-llama70b-vllm.json"
WAIT = 120.0


def _step(text: str) -> None:
    print(f"\n== {text}")


def _chart_pods(plane: ControlPlane, chart: ChartStack) -> str:
    rows = [("namespace", "pod", "node", "ready", "restarts", "image")]
    for namespace, deployment in chart.deployments():
        for pod in chart.pods(namespace, deployment):
            statuses = pod["status"].get("containerStatuses") or [{}]
            rows.append(
                (
                    namespace,
                    pod["metadata"]["name"],
                    pod["spec"].get("nodeName", "-"),
                    pod_condition(pod, "Ready") or "-",
                    str(statuses[0].get("restartCount", 0)),
                    str(statuses[0].get("image", "-")),
                )
            )
    return table(rows)


def _engine_story(plane: ControlPlane, node: RealNode, chart: ChartStack, examples: Path) -> int:
    ns = chart.namespace
    installer = plane.kube("tmi-installer")
    request: dict[str, Any] = json.loads((examples / REQUEST).read_text())
    pod = engine_pod(ns, request, name=f"tmi-{uuid.uuid4().hex[:8]}", deployment_id="llama70b-vllm")
    created = installer.create(pod)
    name = created["metadata"]["name"]
    try:
        ready = installer.wait_for(
            "v1", "Pod", name, ns, lambda p: pod_condition(p, "Ready") == "True", timeout=WAIT
        )
    except TimeoutError as exc:
        print(f"UNEXPECTED: {exc}")
        return 1
    rows = [("pod", "node", "runtimeClass", "granted", "AllocationVerified")]
    rows.append(step7_row(ready))
    print(table(rows))
    seen = probe_report(installer, ns, name, "engine")["env"].get("NVIDIA_VISIBLE_DEVICES")
    allocated = node.allocations(created["metadata"]["uid"]).get(("engine", "nvidia.com/gpu"))
    print(f"the device plugin allocated (kubelet checkpoint): {','.join(allocated or ['-'])}")
    print(f"NVIDIA_VISIBLE_DEVICES inside the container:       {seen}")
    print("(the probe image itself sets NVIDIA_VISIBLE_DEVICES=all, as CUDA base images do)")
    if not allocated or sorted((seen or "").split(",")) != allocated:
        print("UNEXPECTED: the container does not see exactly its allocation")
        return 1
    return 0


def node_story(
    identity: dict[str, str], configmap: dict[str, Any], cluster: str, examples: Path
) -> int:
    """The demo's real-node part; 0 when the engine Pod runs with exactly its device."""
    _step("a real node: kubelet, containerd, runc, CNI bridge, kube-proxy; GPUs via device plugin")
    started = time.monotonic()
    with ControlPlane.start(pod_network=PodNetwork(), start_kwok=False) as plane:
        images_dir = plane.workdir / "images"
        images = [tmi_image(images_dir / "tmi"), scheduler_image(images_dir, versions().kubernetes)]
        node = RealNode.start(plane, fixture=GpuFixture.named(FIXTURE), images=images)
        try:
            print(f"images assembled, node {node.name} Ready: {time.monotonic() - started:.1f}s")
            print(node_table([plane.kube("admin").get("v1", "Node", node.name)]))
            _step("the chart as users install it: its Deployments run as Pods on the real node")
            begun = time.monotonic()
            settings = StackSettings(
                owner_public_keys=(identity["publicKey"],),
                cluster_binding_id=cluster,
                engine_image_map=engine_image_map(node.images[PROBE]),
            )
            with deploy_chart(
                plane, settings, configmap, tmi=images[0], scheduler=images[1]
            ) as chart:
                print(_chart_pods(plane, chart))
                print(f"every Deployment available in {time.monotonic() - begun:.1f}s")
                plane.grant_namespace_admin("tmi-installer", chart.namespace)
                _step("tmi-installer deploys one engine Pod; it runs on the real node")
                return _engine_story(plane, node, chart, examples)
        finally:
            node.stop()


__all__ = ["node_story"]
