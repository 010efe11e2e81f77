"""HAMi, the peer a cluster owner would pick instead of `tmi`, on the local control plane: built
from its source, configured from its own chart, fed what its device plugin would write.

`bench_peer.py` runs it beside `tmi` on one KWOK fleet. This module holds everything that is
HAMi's: the build (`tools/hami/build.sh`, on demand), the configuration its chart renders
(helm, from HAMi's source: the device config, the KubeSchedulerConfiguration with its extender,
the MutatingWebhookConfiguration), the node annotations its device plugin writes at
registration (`hami.io/node-nvidia-register`, a JSON list of `DeviceInfo` from
`pkg/device/devices.go`), the translation of an engine Pod's demand into HAMi's resource names,
and the three ways HAMi is run (`CONFIGS`): as its chart installs it, with its client limits
raised, and raised with the `spread` node policy. Each runs as its own process with its own
scheduler name, webhook configuration and namespace, so the three stay side by side in one run
and no Pod of one reaches another. What its device plugin does per Pod is `hami_standin.py`.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import ControlPlane
from localcluster.plane.binaries import bin_dir
from localcluster.plane.process import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tools" / "hami" / "build.sh"
SYSTEM_NAMESPACE = "hami-system"
REGISTER = "hami.io/node-nvidia-register"
NODE_LOCK = "hami.io/mutex.lock"
BIND_PHASE = "hami.io/bind-phase"
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
USE_TYPE = "nvidia.com/use-gputype"
GPU = "nvidia.com/gpu"
GPU_MEM = "nvidia.com/gpumem"
# HAMi's chart default; each physical GPU is offered to this many Pods at most.
SPLIT = 10
# The chart's verbosity for HAMi's process (`scheduler.extender.extraArgs`) and for the
# kube-scheduler beside it (`scheduler.kubeScheduler.extraNewArgs`).
CHART_ARGS = ("--debug", "-v=4")
CHART_SCHEDULER_VERBOSITY = 4
# Raised client limits: those the earlier benchmark gave HAMi and its kube-scheduler.
TUNED_CLIENT = (1000, 2000)


@dataclass(frozen=True)
class Config:
    """One way of running HAMi. `client` is its process's and its kube-scheduler's client
    limits (QPS, burst); None leaves each its default (client-go's 5 / 10 for HAMi, which its
    chart does not change; kube-scheduler's 50 / 100)."""

    name: str
    client: tuple[int, int] | None
    node_policy: str
    what: str

    @property
    def namespace(self) -> str:
        return f"bench-hami-{self.name}"

    @property
    def scheduler_name(self) -> str:
        return f"hami-{self.name}"

    @property
    def system(self) -> str:
        return f"hami-{self.name}"


CONFIGS = (
    Config(
        "installed",
        None,
        "binpack",
        "as its chart installs it: client-go's default limits (5 QPS, burst 10), binpack",
    ),
    Config(
        "tuned",
        TUNED_CLIENT,
        "binpack",
        "client limits raised to 1,000 QPS, burst 2,000 (HAMi's and its kube-scheduler's)",
    ),
    Config("spread", TUNED_CLIENT, "spread", "tuned, with --node-scheduler-policy=spread"),
)


def user_of(config: Config) -> str:
    """The user HAMi's process authenticates as when run as `config`."""
    return f"bench:hami-scheduler:{config.name}"


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


def pod(
    name: str, gpus: int, memory_mib: int | None, model: str, namespace: str = ""
) -> dict[str, Any]:
    """An engine Pod in HAMi's terms: `gpus` devices of `model` (its `use-gputype`, as the
    signed binding pins `tmi`'s), each whole (no memory named: HAMi then takes all of each
    device's memory) or a share of `memory_mib`."""
    limits = {GPU: str(gpus)}
    if memory_mib is not None:
        limits[GPU_MEM] = str(memory_mib)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace or CONFIGS[0].namespace,
            "annotations": {USE_TYPE: model},
        },
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
    """One HAMi scheduler process (webhook, extender and its node registration loop in one) as
    `config` runs it, the chart's webhook configuration pointed at it for its namespace, and
    the chart's scheduler configuration for the kube-scheduler beside it. It authenticates as
    a user of its own, so the API requests it makes are counted apart (`peer_audit.py`)."""

    def __init__(self, plane: ControlPlane, home: Path, config: Config) -> None:
        self.plane = plane
        self.home = home
        self.config = config
        self.port = free_port()
        self.identity = f"hami-{config.name}"
        self.user = user_of(config)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = plane.logs_dir / f"hami-{config.name}.log"

    def start(self) -> None:
        plane, config = self.plane, self.config
        plane.create_namespace(SYSTEM_NAMESPACE)
        plane.create_namespace(config.namespace)
        device_config = plane.workdir / "hami-device-config.yaml"
        device_config.write_text(
            render(self.home, "device-configmap.yaml")["data"]["device-config.yaml"]
        )
        # The chart binds HAMi's ServiceAccount to a ClusterRole that reads and writes Pods,
        # nodes and events everywhere; a user of its own in system:masters does the same here.
        kubeconfig = plane.add_identity(self.identity, self.user, ("system:masters",))
        pair = plane.issue_serving_cert(f"hami-{config.name}")
        log = self.log_path.open("wb")
        # The chart's arguments, with its in-cluster service replaced by loopback and leader
        # election off (as for every scheduler here).
        argv = [
            str(self.home / "hami-scheduler"),
            f"--http_bind=127.0.0.1:{self.port}",
            f"--cert_file={pair.cert_file}",
            f"--key_file={pair.key_file}",
            f"--scheduler-name={config.scheduler_name}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--node-scheduler-policy={config.node_policy}",
            "--gpu-scheduler-policy=spread",
            "--force-overwrite-default-scheduler=true",
            f"--device-config-file={device_config}",
            "--leader-elect=false",
            *CHART_ARGS,
        ]
        if config.client is not None:
            argv += [f"--kube-qps={config.client[0]}", f"--kube-burst={config.client[1]}"]
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "POD_NAMESPACE": SYSTEM_NAMESPACE,
            "POD_NAME": f"hami-scheduler-{config.name}",
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

        wait_until(ready, timeout=60, what=f"HAMi {config.name}'s /readyz")
        webhook = render(self.home, "webhook.yaml")
        webhook["metadata"]["name"] = f"hami-webhook-{config.name}"
        hook = webhook["webhooks"][0]
        hook["name"] = f"{config.name}.vgpu.hami.io"
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{self.port}/webhook",
            "caBundle": plane.ca_bundle,
        }
        # Its own namespace only, so `tmi`'s Pods (which the chart's selector would take too,
        # once planned with nvidia.com/gpu) and the other configurations' never reach it.
        hook["namespaceSelector"] = {
            "matchLabels": {"kubernetes.io/metadata.name": config.namespace}
        }
        plane.kube("admin").apply(webhook)

    def wait_registered(self, nodes: int, timeout: float = 120.0) -> None:
        """Until its registration loop has read every node's devices (its log says so once a
        node): a Pod filtered before that finds no node and waits in kube-scheduler's backoff."""

        def registered() -> bool:
            return self.log_path.read_bytes().count(b"Node device added") >= nodes

        wait_until(registered, timeout=timeout, what=f"HAMi {self.config.name} to register")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def scheduler_config(self) -> dict[str, Any]:
        rendered = render(self.home, "configmap.yaml")["data"]["config.yaml"]
        config: dict[str, Any] = yaml.safe_load(rendered)
        config["extenders"][0]["urlPrefix"] = f"https://127.0.0.1:{self.port}"
        config["profiles"][0]["schedulerName"] = self.config.scheduler_name
        config["leaderElection"] = {"leaderElect": False}
        if self.config.client is not None:
            qps, burst = self.config.client
            config["clientConnection"] = {"qps": qps, "burst": burst}
        return config

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


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
    "CONFIGS",
    "Card",
    "Config",
    "Hami",
    "build",
    "device_usage",
    "pod",
    "register_annotation",
    "user_of",
]
