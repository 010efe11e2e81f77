"""HAMi, the peer a cluster owner would pick instead of `tmi`, on the local control plane: built
from its source, configured from its own chart, fed what its device plugin would write.

`bench_peer.py` runs it beside `tmi` on one KWOK fleet. This module holds everything that is
HAMi's: the build (`tools/hami/build.sh`, on demand), the configuration its chart renders
(helm, from HAMi's source: the device config, the KubeSchedulerConfiguration with its extender,
the MutatingWebhookConfiguration), the node annotations its device plugin writes at
registration (`hami.io/node-nvidia-register`, a JSON list of `DeviceInfo` from
`pkg/device/devices.go`), the translation of an engine Pod's demand into HAMi's resource names,
and a stand-in for the one thing its device plugin does per Pod, which a KWOK node has none of.

The stand-in. HAMi's extender binds the Pod itself, after taking a lock on the node
(`hami.io/mutex.lock`); the lock is released by the device plugin's Allocate on that node,
which marks the Pod `hami.io/bind-phase: success` (`PodAllocationSuccess`). With no device
plugin the node stays locked for `--node-lock-timeout` (5 minutes) and HAMi binds one Pod per
node per five minutes. `DevicePluginStandIn` watches HAMi's Pods and, for each one HAMi has
bound with `bind-phase: allocating`, does what Allocate does: marks it `success` and removes
the lock it holds. On a real node that happens when the kubelet admits the Pod, after the bind
reaches it; here it happens as soon as the watch delivers the bind, so the stand-in favours
HAMi. Its calls are the benchmark's, not HAMi's process's, and are not in HAMi's CPU figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import ApiError, ControlPlane
from localcluster.plane.binaries import bin_dir
from localcluster.plane.process import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tools" / "hami" / "build.sh"
NAMESPACE = "bench-hami"
SYSTEM_NAMESPACE = "hami-system"
SCHEDULER_NAME = "hami-scheduler"
REGISTER = "hami.io/node-nvidia-register"
NODE_LOCK = "hami.io/mutex.lock"
BIND_PHASE = "hami.io/bind-phase"
ALLOCATED = "hami.io/vgpu-devices-allocated"
USE_TYPE = "nvidia.com/use-gputype"
GPU = "nvidia.com/gpu"
GPU_MEM = "nvidia.com/gpumem"
# HAMi's chart default; each physical GPU is offered to this many Pods at most.
SPLIT = 10


def build(source: str | None = None) -> Path:
    """The directory with `hami-scheduler` and HAMi's source (for its chart), built if missing."""
    argv = [str(BUILD)] + ([source] if source else [])
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def render(home: Path, template: str) -> dict[str, Any]:
    """One document of HAMi's chart as helm renders it with its default values."""
    argv = [
        str(bin_dir() / "helm"),
        "template",
        "hami",
        str(home / "src" / "charts" / "hami"),
        "--kube-version=1.36.3",
        f"--namespace={SYSTEM_NAMESPACE}",
        f"--show-only=templates/scheduler/{template}",
    ]
    text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    document = yaml.safe_load(text)
    if not isinstance(document, dict):
        raise RuntimeError(f"HAMi's chart rendered no {template}")
    return document


@dataclass(frozen=True)
class Card:
    """What HAMi's device plugin reports of one model: NVML's name and total memory (MiB)."""

    model: str
    memory_mib: int


def register_annotation(node: str, card: Card, gpus: int) -> str:
    """The `hami.io/node-nvidia-register` value HAMi's device plugin writes for `gpus` cards
    (`MarshalNodeDevices`: id, index, split count, memory, cores, model, NUMA, mode, health)."""
    devices = [
        {
            "id": f"GPU-{node}-{index:02d}",
            "index": index,
            "count": SPLIT,
            "devmem": card.memory_mib,
            "devcore": 100,
            "type": card.model,
            "numa": 0,
            "mode": "hami-core",
            "health": True,
        }
        for index in range(gpus)
    ]
    return json.dumps(devices, separators=(",", ":"))


def pod(name: str, gpus: int, memory_mib: int | None, model: str) -> dict[str, Any]:
    """An engine Pod in HAMi's terms: `gpus` devices of `model` (its `use-gputype`, as the
    signed binding pins `tmi`'s), each whole (no memory named: HAMi then takes all of each
    device's memory) or a share of `memory_mib`."""
    limits = {GPU: str(gpus)}
    if memory_mib is not None:
        limits[GPU_MEM] = str(memory_mib)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {USE_TYPE: model}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.invalid/engine:1",
                    "resources": {"limits": limits},
                }
            ]
        },
    }


class Hami:
    """HAMi's scheduler process (webhook, extender and its node registration loop in one), the
    webhook configuration its chart ships pointed at it, and its scheduler configuration."""

    def __init__(self, plane: ControlPlane, home: Path) -> None:
        self.plane = plane
        self.home = home
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        plane = self.plane
        plane.create_namespace(SYSTEM_NAMESPACE)
        config = plane.workdir / "hami-device-config.yaml"
        config.write_text(render(self.home, "device-configmap.yaml")["data"]["device-config.yaml"])
        pair = plane.issue_serving_cert("hami-scheduler")
        log = (plane.logs_dir / "hami-scheduler.log").open("wb")
        # The chart's arguments (its defaults: binpack nodes, spread GPUs), with its in-cluster
        # service replaced by loopback; the client limits those kube-scheduler gets here (HAMi's
        # default, client-go's 5 QPS, would cap its bind at a few Pods a second).
        argv = [
            str(self.home / "hami-scheduler"),
            f"--http_bind=127.0.0.1:{self.port}",
            f"--cert_file={pair.cert_file}",
            f"--key_file={pair.key_file}",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            "--node-scheduler-policy=binpack",
            "--gpu-scheduler-policy=spread",
            "--force-overwrite-default-scheduler=true",
            f"--device-config-file={config}",
            "--leader-elect=false",
            "--kube-qps=1000",
            "--kube-burst=2000",
            "-v=1",
        ]
        env = {
            **os.environ,
            "KUBECONFIG": str(plane.kubeconfig("admin")),
            "POD_NAMESPACE": SYSTEM_NAMESPACE,
            "POD_NAME": "hami-scheduler-0",
        }
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        context = _insecure()

        def ready() -> bool:
            try:
                url = f"https://127.0.0.1:{self.port}/readyz"
                with urllib.request.urlopen(url, context=context, timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(ready, timeout=60, what="HAMi's /readyz")
        webhook = render(self.home, "webhook.yaml")
        hook = webhook["webhooks"][0]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{self.port}/webhook",
            "caBundle": plane.ca_bundle,
        }
        # Its own namespace only, so `tmi`'s Pods (which the chart's selector would take too,
        # once planned with nvidia.com/gpu) never reach it.
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
        plane.kube("admin").apply(webhook)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def scheduler_config(self) -> dict[str, Any]:
        rendered = render(self.home, "configmap.yaml")["data"]["config.yaml"]
        config: dict[str, Any] = yaml.safe_load(rendered)
        config["extenders"][0]["urlPrefix"] = f"https://127.0.0.1:{self.port}"
        return config

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def _insecure() -> Any:
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class DevicePluginStandIn:
    """What HAMi's device plugin does once per Pod on its node (the module docstring says why
    it is needed and how it favours HAMi): mark the Pod allocated and release the node lock."""

    def __init__(self, plane: ControlPlane) -> None:
        self.kube = plane.kube("admin")
        self.stopping = threading.Event()
        self.released = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        version = self.kube.request("GET", path, query={"limit": 1})["metadata"]["resourceVersion"]
        while not self.stopping.is_set():
            try:
                for event in self.kube.watch(path, {"resourceVersion": version}, timeout=5):
                    obj = event.get("object", {})
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._allocate(obj)
                    if self.stopping.is_set():
                        return
            except Exception as exc:  # a closed watch is resumed; anything else is recorded
                self.errors.append(repr(exc)[:300])
                if len(self.errors) > 50:
                    return

    def _allocate(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata", {})
        node = obj.get("spec", {}).get("nodeName")
        annotations = meta.get("annotations") or {}
        if not node or annotations.get(BIND_PHASE) != "allocating":
            return
        name = meta["name"]
        self.kube.request(
            "PATCH",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            body={"metadata": {"annotations": {BIND_PHASE: "success"}}},
            content_type="application/merge-patch+json",
        )
        held = (self.kube.get("v1", "Node", node)["metadata"].get("annotations") or {}).get(
            NODE_LOCK, ""
        )
        if not held.endswith(f",{NAMESPACE},{name}"):
            return
        try:
            self.kube.request(
                "PATCH",
                f"/api/v1/nodes/{node}",
                body=[
                    {
                        "op": "test",
                        "path": "/metadata/annotations/hami.io~1mutex.lock",
                        "value": held,
                    },
                    {"op": "remove", "path": "/metadata/annotations/hami.io~1mutex.lock"},
                ],
                content_type="application/json-patch+json",
            )
            self.released += 1
        except ApiError as exc:
            if exc.status not in (409, 422):
                raise


def device_usage(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per node, the MiB HAMi allocated on each device (`hami.io/vgpu-devices-allocated`:
    `uuid,type,usedmem,usedcores:` per device, `;` per container)."""
    out: dict[str, dict[str, int]] = {}
    for item in pods:
        node = item.get("spec", {}).get("nodeName")
        value = (item.get("metadata", {}).get("annotations") or {}).get(ALLOCATED, "")
        if not node or not value:
            continue
        for container in value.split(";"):
            for device in container.split(":"):
                fields = device.split(",")
                if len(fields) >= 3 and fields[0]:
                    used = out.setdefault(node, {})
                    used[fields[0]] = used.get(fields[0], 0) + int(fields[2])
    return out


__all__ = [
    "NAMESPACE",
    "SCHEDULER_NAME",
    "Card",
    "DevicePluginStandIn",
    "Hami",
    "build",
    "device_usage",
    "pod",
    "register_annotation",
]
