"""Fake GPU nodes that look like real NVIDIA nodes to the scheduler and to tmi.

A node here carries the labels NVIDIA GPU Feature Discovery would publish and the
extended resources the NVIDIA device plugin (``nvidia.com/gpu``, ``nvidia.com/mig-*``)
and the Kamiwaza VRAM plugin (``kamiwaza.ai/vram-gb-gpu-<i>``, GB per physical GPU)
would advertise, plus the annotation that hands it to KWOK. Nodes accept status on
create, so allocatable resources are set in the same request; KWOK's node-initialize
stage then adds the Ready condition and keeps those resources.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference_policy.base.wire import VRAM_RESOURCE_PREFIX as VRAM_BUCKET_PREFIX
from localcluster.plane.controlplane import KWOK_NODE_ANNOTATION, KWOK_NODE_ANNOTATION_VALUE
from localcluster.plane.kube import JSON, ApiError, Kube
from localcluster.plane.process import wait_until

GFD = "nvidia.com"
VRAM_RESOURCE_PREFIX = VRAM_BUCKET_PREFIX + "gpu-"
_MIG_SHAPE = re.compile(r"^(\d+)g\.(\d+)gb$")


def gpu_family(compute_capability: str) -> str:
    """GFD's ``nvidia.com/gpu.family`` for a compute capability (getArchFamily)."""
    major_s, _, minor_s = compute_capability.partition(".")
    major, minor = int(major_s), int(minor_s or 0)
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada-lovelace" if minor >= 9 else "ampere"
    return {
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }.get(major, "undefined")


@dataclass(frozen=True)
class FakeNode:
    """One fake node. ``gpus`` physical GPUs of ``gpu_product``.

    ``mig`` maps MIG shapes (``"3g.40gb"``) to device counts; with the default
    ``mig_strategy`` ("mixed" when ``mig`` is set) each shape is advertised as
    ``nvidia.com/mig-<shape>``, and ``whole_gpus`` (default: all ``gpus``) as
    ``nvidia.com/gpu``. ``vram_gb`` is per-GPU memory in GB; with ``vram_budget`` the
    node also advertises ``kamiwaza.ai/vram-gb-gpu-<i>: vram_gb`` per GPU.
    ``cuda_driver_major/minor`` are the CUDA driver API version (NVML
    ``SystemGetCudaDriverVersion``; GFD ``nvidia.com/cuda.runtime-version.*``), and
    ``driver_version`` the kernel driver (GFD ``nvidia.com/cuda.driver-version.*``).
    """

    name: str
    arch: str = "amd64"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpus: int = 1
    mig: Mapping[str, int] = field(default_factory=dict)
    mig_strategy: str | None = None
    whole_gpus: int | None = None
    vram_gb: int | None = 80
    gpu_memory_mib: int | None = None
    vram_budget: bool = False
    compute_capability: str = "9.0"
    cuda_driver_major: int = 13
    cuda_driver_minor: int = 0
    driver_version: str = "580.95.05"
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"
    ephemeral_storage: str = "500Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    extra_resources: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    kwok: bool = True

    @property
    def effective_mig_strategy(self) -> str:
        if self.mig_strategy is not None:
            return self.mig_strategy
        return "mixed" if self.mig else "none"

    def gfd_labels(self) -> dict[str, str]:
        """The labels GPU Feature Discovery would put on this node."""
        if self.gpus <= 0:
            return {}
        major, _, minor = self.compute_capability.partition(".")
        drv = self.driver_version.split(".")
        drv_major, drv_minor, drv_rev = [*drv, "", "", ""][:3]
        memory_mib = self.gpu_memory_mib
        if memory_mib is None and self.vram_gb is not None:
            memory_mib = self.vram_gb * 1024
        cuda = f"{self.cuda_driver_major}.{self.cuda_driver_minor}"
        labels = {
            f"{GFD}/gpu.present": "true",
            f"{GFD}/gpu.product": self.gpu_product,
            f"{GFD}/gpu.count": str(self.gpus),
            f"{GFD}/gpu.replicas": "1",
            f"{GFD}/gpu.sharing-strategy": "none",
            f"{GFD}/gpu.mode": "compute",
            f"{GFD}/gpu.compute.major": major,
            f"{GFD}/gpu.compute.minor": minor or "0",
            f"{GFD}/gpu.family": gpu_family(self.compute_capability),
            f"{GFD}/cuda.runtime-version.major": str(self.cuda_driver_major),
            f"{GFD}/cuda.runtime-version.minor": str(self.cuda_driver_minor),
            f"{GFD}/cuda.runtime-version.full": cuda,
            # Deprecated aliases GFD still publishes; older tooling reads these.
            f"{GFD}/cuda.runtime.major": str(self.cuda_driver_major),
            f"{GFD}/cuda.runtime.minor": str(self.cuda_driver_minor),
            f"{GFD}/cuda.driver-version.major": drv_major,
            f"{GFD}/cuda.driver-version.minor": drv_minor,
            f"{GFD}/cuda.driver-version.revision": drv_rev,
            f"{GFD}/cuda.driver-version.full": self.driver_version,
            f"{GFD}/cuda.driver.major": drv_major,
            f"{GFD}/cuda.driver.minor": drv_minor,
            f"{GFD}/cuda.driver.rev": drv_rev,
            f"{GFD}/mig.capable": "true" if self.mig else "false",
            f"{GFD}/mig.strategy": self.effective_mig_strategy,
            f"{GFD}/mps.capable": "false",
        }
        if memory_mib is not None:
            labels[f"{GFD}/gpu.memory"] = str(memory_mib)
        if self.effective_mig_strategy == "mixed":
            for shape, count in self.mig.items():
                prefix = f"{GFD}/mig-{shape}"
                labels[f"{prefix}.count"] = str(count)
                labels[f"{prefix}.product"] = f"{self.gpu_product}-MIG-{shape}"
                match = _MIG_SHAPE.match(shape)
                if match:
                    labels[f"{prefix}.memory"] = str(int(match.group(2)) * 1024)
                    labels[f"{prefix}.slices.gi"] = match.group(1)
                    labels[f"{prefix}.slices.ci"] = match.group(1)
        return labels

    def resources(self) -> dict[str, str]:
        """Capacity (= allocatable) the node advertises."""
        res = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            "ephemeral-storage": self.ephemeral_storage,
        }
        if self.gpus > 0:
            strategy = self.effective_mig_strategy
            if strategy == "single":
                # Every MIG device is a plain nvidia.com/gpu under the single strategy.
                res[f"{GFD}/gpu"] = str(sum(self.mig.values()) or self.gpus)
            else:
                whole = self.whole_gpus if self.whole_gpus is not None else self.gpus
                res[f"{GFD}/gpu"] = str(whole)
                if strategy == "mixed":
                    for shape, count in self.mig.items():
                        res[f"{GFD}/mig-{shape}"] = str(count)
            if self.vram_budget and self.vram_gb is not None:
                for index in range(self.gpus):
                    res[f"{VRAM_RESOURCE_PREFIX}{index}"] = str(self.vram_gb)
        res.update(self.extra_resources)
        return res

    def manifest(self) -> JSON:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": self.arch,
            "type": "kwok",
            **self.gfd_labels(),
            **self.labels,
        }
        annotations = dict(self.annotations)
        if self.kwok:
            annotations[KWOK_NODE_ANNOTATION] = KWOK_NODE_ANNOTATION_VALUE
        spec: dict[str, Any] = {}
        if self.taints:
            spec["taints"] = [dict(t) for t in self.taints]
        resources = self.resources()
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": annotations},
            "spec": spec,
            "status": {
                "capacity": resources,
                "allocatable": dict(resources),
                "nodeInfo": {
                    "architecture": self.arch,
                    "operatingSystem": "linux",
                    "kubeletVersion": "v1.36.3",
                    "bootID": "",
                    "machineID": "",
                    "systemUUID": "",
                    "kernelVersion": "",
                    "osImage": "",
                    "containerRuntimeVersion": "",
                    "kubeProxyVersion": "",
                },
            },
        }


def is_node_ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions", [])
    )


def create_fake_nodes(
    kube: Kube, nodes: Iterable[FakeNode], *, wait_ready: bool = True, timeout: float = 60.0
) -> list[JSON]:
    """Create (replacing any of the same name) the nodes; wait for KWOK to mark them Ready."""
    created: list[JSON] = []
    specs = list(nodes)
    for spec in specs:
        kube.delete("v1", "Node", spec.name)
        body = spec.manifest()
        wait_until(
            lambda b=body: _create_node(kube, b),  # type: ignore[misc]
            timeout=timeout,
            what=f"creating node {spec.name}",
        )
        created.append(body)
    if wait_ready:
        for spec in specs:
            if spec.kwok:
                wait_until(
                    lambda n=spec.name: is_node_ready(kube.get("v1", "Node", n)),  # type: ignore[misc]
                    timeout=timeout,
                    what=f"KWOK to mark node {spec.name} Ready",
                )
    return [kube.get("v1", "Node", spec.name) for spec in specs]


def _create_node(kube: Kube, body: JSON) -> bool:
    try:
        kube.create(body)
    except ApiError as exc:
        # A just-deleted node can still be present for a moment.
        if exc.status == 409:
            return False
        raise
    return True


def delete_fake_nodes(kube: Kube, names: Iterable[str]) -> None:
    for name in names:
        kube.delete("v1", "Node", name)


def node_table(nodes: Iterable[Mapping[str, Any]]) -> str:
    """A plain-text table of nodes with their GPU labels and GPU-ish allocatable."""
    rows = [["NAME", "READY", "ARCH", "PRODUCT", "GPUS", "CC", "MIG", "GPU RESOURCES"]]
    for node in nodes:
        labels = node.get("metadata", {}).get("labels", {})
        alloc = node.get("status", {}).get("allocatable", {})
        gpu_res = ", ".join(
            f"{k}={v}"
            for k, v in sorted(alloc.items())
            if k.startswith((f"{GFD}/", "kamiwaza.ai/"))
        )
        rows.append(
            [
                node.get("metadata", {}).get("name", ""),
                "True" if is_node_ready(node) else "False",
                labels.get("kubernetes.io/arch", ""),
                labels.get(f"{GFD}/gpu.product", "-"),
                labels.get(f"{GFD}/gpu.count", "0"),
                (
                    f"{labels[f'{GFD}/gpu.compute.major']}.{labels[f'{GFD}/gpu.compute.minor']}"
                    if f"{GFD}/gpu.compute.major" in labels
                    else "-"
                ),
                labels.get(f"{GFD}/mig.strategy", "-"),
                gpu_res or "-",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
