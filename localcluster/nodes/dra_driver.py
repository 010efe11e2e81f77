"""NVIDIA's DRA driver, played on the local control plane: devices as it publishes them.

KWOK nodes have no kubelet plugin, so an identity with the driver's rights writes each node's
ResourceSlice, as upstream's scheduler tests do; kube-scheduler then allocates claims from it.
The attribute names and value types are the driver's (`gpu.nvidia.com`): strings for `type`,
`productName`, `architecture`, `uuid` and a MIG device's `profile`; versions for
`cudaComputeCapability`, `driverVersion` and `cudaDriverVersion`; the `memory` capacity.
"""

from __future__ import annotations

import contextlib
from typing import Any

from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import ApiError

DRIVER = "gpu.nvidia.com"
DRIVER_IDENTITY = "gpu-dra-driver"
# The class NVIDIA's DRA driver chart installs: every device of the driver.
DRIVER_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
}


def published_device(
    name: str,
    *,
    uuid: str = "GPU-4f3a9b2c-1d2e-4f5a-8b9c-0d1e2f3a4b5c",
    device_type: str = "gpu",
    product: str = "NVIDIA H100 80GB HBM3",
    architecture: str = "Hopper",
    cc: str = "9.0.0",
    driver: str = "580.65.6",
    cuda: str = "13.0.0",
    memory: str = "80Gi",
    mig_profile: str | None = None,
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "type": {"string": device_type},
        "productName": {"string": product},
        "architecture": {"string": architecture},
        "cudaComputeCapability": {"version": cc},
        "driverVersion": {"version": driver},
        "cudaDriverVersion": {"version": cuda},
        "uuid": {"string": uuid},
    }
    if mig_profile is not None:
        attributes["profile"] = {"string": mig_profile}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": memory}}}


def resource_slice(node: str, devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
    """One node's ResourceSlice (the whole pool in one slice, as the driver writes it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class Driver:
    """The driver's side: an identity allowed ResourceSlices only, one slice per node,
    republished with a new pool generation."""

    def __init__(self, plane: ControlPlane) -> None:
        admin = plane.kube("admin")
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": DRIVER_IDENTITY},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceslices"],
                        "verbs": ["create", "update", "get", "delete", "list"],
                    }
                ],
            }
        )
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": DRIVER_IDENTITY},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": DRIVER_IDENTITY,
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": DRIVER_IDENTITY,
                    }
                ],
            }
        )
        admin.apply(DRIVER_CLASS)
        plane.add_identity(DRIVER_IDENTITY)
        self.kube = plane.kube(DRIVER_IDENTITY)
        self.generations: dict[str, int] = {}

    def publish(self, node: str, devices: list[dict[str, Any]]) -> None:
        generation = self.generations.get(node, 0) + 1
        self.generations[node] = generation
        body = resource_slice(node, devices, generation)
        name = body["metadata"]["name"]
        try:
            current = self.kube.get("resource.k8s.io/v1", "ResourceSlice", name)
        except ApiError:
            self.kube.create(body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self.kube.request("PUT", self.kube.path_for(body), body=body)

    def withdraw(self, node: str) -> None:
        with contextlib.suppress(ApiError):
            self.kube.delete("resource.k8s.io/v1", "ResourceSlice", f"{node}-{DRIVER}")
