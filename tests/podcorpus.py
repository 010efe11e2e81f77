"""A shared corpus of non-engine Pods, each with whether it reaches for an accelerator.

The unit tests hold `inference_policy.base.access.reaches` to these expectations, and the end-to-end
tests send every Pod through the real API server, whose CEL (the owner's guard policy, and the
fallback guard webhook's matchConditions, both generated from the same predicate) must refuse,
or send to the webhook, exactly the reaching ones. Every way of reaching the predicate knows is
here, together with near misses that must not count.
"""

from __future__ import annotations

import copy
from typing import Any

from kits.webhookkit import plain_pod


def _with_container(kind: str, **container: Any) -> dict[str, Any]:
    pod = plain_pod()
    entry = {"name": f"extra-{kind.lower()}", "image": "registry.invalid/tool:1", **container}
    if kind == "containers":
        pod["spec"]["containers"].append(entry)
    else:
        pod["spec"].setdefault(kind, []).append(entry)
    return pod


def _resources(kind: str, part: str, key: str, value: str = "1") -> dict[str, Any]:
    resources: dict[str, Any] = {part: {key: value}}
    if part == "limits" or "/" in key:
        # Extended (domain-prefixed) resources must have requests equal to limits; set both
        # where the API server would refuse the Pod otherwise, so each case tests the webhook.
        resources = {"requests": {key: value}, "limits": {key: value}}
    return _with_container(kind, resources=resources)


def _env(kind: str, **entry: Any) -> dict[str, Any]:
    return _with_container(kind, env=[entry])


def _spec(**fields: Any) -> dict[str, Any]:
    pod = plain_pod()
    pod["spec"].update(copy.deepcopy(fields))
    return pod


def _annotated(key: str, value: str) -> dict[str, Any]:
    pod = plain_pod()
    pod["metadata"].setdefault("annotations", {})[key] = value
    return pod


# (Pod, reaches) by case name. Ephemeral containers cannot be set on CREATE, so they appear in
# the unit corpus only (`EPHEMERAL`); the CEL handles them through the same clause.
CORPUS: dict[str, tuple[dict[str, Any], bool]] = {
    "plain": (plain_pod(), False),
    "cpu-and-memory": (_resources("containers", "requests", "memory", "1Gi"), False),
    "ephemeral-storage": (_resources("containers", "limits", "ephemeral-storage", "1Gi"), False),
    "hugepages": (
        _with_container(
            "containers",
            resources={
                "requests": {"hugepages-2Mi": "2Mi", "memory": "64Mi"},
                "limits": {"hugepages-2Mi": "2Mi", "memory": "64Mi"},
            },
        ),
        False,
    ),
    # Default-deny: an extended resource nobody listed reaches as surely as a GPU.
    "unlisted-resource": (_resources("containers", "limits", "example.com/nvidia-gpu"), True),
    "neuron-core": (_resources("containers", "limits", "aws.amazon.com/neuroncore"), True),
    "tpu": (_resources("containers", "limits", "google.com/tpu"), True),
    "dra-extended-resource": (
        _resources("containers", "limits", "deviceclass.resource.kubernetes.io/gpu.nvidia.com"),
        True,
    ),
    "nvidia-gpu-limit": (_resources("containers", "limits", "nvidia.com/gpu"), True),
    "nvidia-mig-request": (_resources("containers", "requests", "nvidia.com/mig-3g.40gb"), True),
    "amd-gpu": (_resources("containers", "limits", "amd.com/gpu"), True),
    "intel-gpu": (_resources("containers", "limits", "gpu.intel.com/i915"), True),
    "vram-gb": (_resources("containers", "limits", "kamiwaza.ai/vram-gb-gpu-0", "20"), True),
    "vram-mib": (_resources("containers", "limits", "kamiwaza.ai/vram-mib-gpu-0", "2048"), True),
    "init-container-gpu": (_resources("initContainers", "limits", "nvidia.com/gpu"), True),
    "nvidia-env-all": (_env("containers", name="NVIDIA_VISIBLE_DEVICES", value="all"), True),
    "nvidia-env-index": (_env("initContainers", name="NVIDIA_VISIBLE_DEVICES", value="0"), True),
    "nvidia-env-void": (_env("containers", name="NVIDIA_VISIBLE_DEVICES", value="void"), False),
    "nvidia-env-from-configmap": (
        _env(
            "containers",
            name="NVIDIA_VISIBLE_DEVICES",
            valueFrom={"configMapKeyRef": {"name": "gpus", "key": "devices"}},
        ),
        True,
    ),
    "amd-env": (_env("containers", name="AMD_VISIBLE_DEVICES", value="0"), True),
    "cuda-env-only": (_env("containers", name="CUDA_VISIBLE_DEVICES", value="0"), False),
    "runtime-class": (_spec(runtimeClassName="nvidia"), True),
    "resource-claims": (
        _spec(resourceClaims=[{"name": "gpu", "resourceClaimName": "shared-gpu"}]),
        True,
    ),
    "plan-annotation": (_annotated("kamiwaza.ai/plan", '{"status":200}'), True),
    "container-claim": (
        _with_container("containers", resources={"claims": [{"name": "gpu"}]}),
        True,
    ),
    "other-annotation": (_annotated("kamiwaza.ai/note", "hello"), False),
    # Device variables by namespace: every variable a vendor's runtime reads, not a list.
    "nvidia-driver-capabilities": (
        _env("containers", name="NVIDIA_DRIVER_CAPABILITIES", value="all"),
        True,
    ),
    "nvidia-imex-channels": (_env("containers", name="NVIDIA_IMEX_CHANNELS", value="all"), True),
    "nvidia-gds": (_env("initContainers", name="NVIDIA_GDS", value="enabled"), True),
    "nvidia-mofed": (_env("containers", name="NVIDIA_MOFED", value="enabled"), True),
    "nvidia-nvswitch": (_env("containers", name="NVIDIA_NVSWITCH", value="enabled"), True),
    "nvidia-unreleased-feature": (_env("containers", name="NVIDIA_SOMETHING_NEW", value="1"), True),
    "habana-env": (_env("containers", name="HABANA_VISIBLE_DEVICES", value="all"), True),
    "habana-modules": (_env("containers", name="HABANA_VISIBLE_MODULES", value="0,1"), True),
    "neuron-env": (_env("containers", name="AWS_NEURON_VISIBLE_DEVICES", value="ALL"), True),
    "ascend-env": (_env("containers", name="ASCEND_VISIBLE_DEVICES", value="0"), True),
    "hip-env-only": (_env("containers", name="HIP_VISIBLE_DEVICES", value="0"), False),
    "nvidia-lowercase-lookalike": (
        _env("containers", name="nvidia_visible_devices", value="all"),
        False,
    ),
    "env-from-no-prefix": (
        _with_container("containers", envFrom=[{"configMapRef": {"name": "settings"}}]),
        True,
    ),
    "env-from-vendor-prefix": (
        _with_container(
            "initContainers", envFrom=[{"prefix": "HABANA_", "secretRef": {"name": "s"}}]
        ),
        True,
    ),
    "env-from-partial-prefix": (
        _with_container("containers", envFrom=[{"prefix": "NV", "configMapRef": {"name": "s"}}]),
        True,
    ),
    "env-from-app-prefix": (
        _with_container("containers", envFrom=[{"prefix": "APP_", "configMapRef": {"name": "s"}}]),
        False,
    ),
    "cdi-annotation": (_annotated("cdi.k8s.io/gpu", "nvidia.com/gpu=all"), True),
    "nvidia-cdi-annotation": (_annotated("nvidia.cdi.k8s.io/gpu", "nvidia.com/gpu=0"), True),
    "cdi-lookalike-annotation": (_annotated("example.com/cdi.k8s.io", "x"), False),
}

EPHEMERAL: dict[str, tuple[dict[str, Any], bool]] = {
    "ephemeral-gpu": (
        _resources("ephemeralContainers", "limits", "nvidia.com/gpu"),
        True,
    ),
    "ephemeral-env": (
        _env("ephemeralContainers", name="NVIDIA_VISIBLE_DEVICES", value="all"),
        True,
    ),
    "pod-level-resources": (_spec(resources={"limits": {"nvidia.com/gpu": "1"}}), True),
}


def shielded(pod: dict[str, Any]) -> dict[str, Any]:
    """The Pod with NVIDIA_VISIBLE_DEVICES=void on every container that sets no value itself."""
    from inference_policy.base.access import shielded as sets_it

    pod = copy.deepcopy(pod)
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for container in pod["spec"].get(kind, []):
            if not sets_it(container):
                container.setdefault("env", []).append(
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
                )
    return pod
