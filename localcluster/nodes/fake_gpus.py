"""The real node's simulated GPUs, as a fixture: what ``tmi-fakegpu`` advertises through the
kubelet's device-plugin API and what GPU Feature Discovery would label the Node with.

A fixture (``localcluster/data/fake-gpus/*.json``) names the product, its compute capability,
memory and driver, and each device by index and UUID (with its MIG instances, if any). The Go
plugin (tools/k8sbin/nodetools/fakegpu) reads the same file; here it becomes the ``FakeNode``
whose label and resource rules the KWOK nodes use too, so a real and a fake node of the same
GPUs look alike to the scheduler and to tmi.
"""

from __future__ import annotations

from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from localcluster.nodes.kwok import FakeNode

DEFAULT_FIXTURE = "h100-2x.json"


class MigDevice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    profile: str = Field(pattern=r"^\d+g\.\d+gb$")
    uuid: str = Field(pattern=r"^MIG-")


class GpuDevice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    index: int = Field(ge=0)
    uuid: str = Field(pattern=r"^GPU-")
    mig: tuple[MigDevice, ...] = ()


class GpuFixture(BaseModel):
    """The simulated GPUs: what ``tmi-fakegpu`` advertises and GFD would label."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    product: str
    computeCapability: str = Field(pattern=r"^\d+\.\d+$")
    memoryGB: int = Field(gt=0)
    driverVersion: str
    cudaDriverVersion: str = Field(pattern=r"^\d+\.\d+$")
    vramBudget: bool = False
    replicas: int = Field(default=1, ge=1)
    # nvidia-smi's total, when it is not memoryGB * 1024 (GFD's nvidia.com/gpu.memory).
    memoryMiB: int | None = Field(default=None, gt=0)
    devices: tuple[GpuDevice, ...]

    @classmethod
    def named(cls, name: str) -> GpuFixture:
        text = resources.files("localcluster").joinpath("data", "fake-gpus", name).read_text()
        return cls.model_validate_json(text)

    def uuids(self) -> list[str]:
        return [d.uuid for d in self.devices]

    def whole_gpu_count(self) -> int:
        return sum(1 for d in self.devices if not d.mig) * self.replicas

    def node_labels(self, name: str) -> dict[str, str]:
        """What GFD would label the node with, time-slicing included."""
        node = self.fake_node(name)
        return {**node.gfd_labels(), **node.labels}

    def fake_node(self, name: str) -> FakeNode:
        """The FakeNode these devices make: only its labels and GPU resources are used."""
        mig: dict[str, int] = {}
        for device in self.devices:
            for m in device.mig:
                mig[m.profile] = mig.get(m.profile, 0) + 1
        major, minor = self.cudaDriverVersion.split(".")
        labels = {}
        if self.replicas > 1:
            labels = {
                "nvidia.com/gpu.replicas": str(self.replicas),
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
            }
        return FakeNode(
            name,
            gpu_product=self.product,
            gpus=len(self.devices),
            mig=mig,
            whole_gpus=self.whole_gpu_count(),
            vram_gb=self.memoryGB,
            gpu_memory_mib=self.memoryMiB,
            vram_budget=self.vramBudget,
            compute_capability=self.computeCapability,
            cuda_driver_major=int(major),
            cuda_driver_minor=int(minor),
            driver_version=self.driverVersion,
            labels=labels,
            kwok=False,
        )


__all__ = ["DEFAULT_FIXTURE", "GpuDevice", "GpuFixture", "MigDevice"]
