"""What "reaches for an accelerator" means, written once.

Three places need the answer and must never disagree: the admission webhook refuses a Pod that
reaches for an accelerator outside a plan, the allocation controller flags a running Pod that
does, and the API server decides from the MutatingWebhookConfiguration's CEL matchConditions
which Pods to shield and refuse itself (the owner's admission policies). If the CEL missed a field
the webhook checks, that is exactly where a hole would hide, so the CEL is generated from these
same tables (`inference_policy.admission.access_cel`) and tests pin the shipped manifests to it and
hold the policies to this predicate through a real API server.

A Pod reaches for an accelerator through any of:

* an extended resource, whatever the quantity, in the requests or limits of any container, init
  container, ephemeral container, or the Pod-level `spec.resources`. This is default-deny: every
  name but the standard ones (`STANDARD_RESOURCES`, `hugepages-*`) counts, so a device plugin
  or a DRA-backed extended resource (`deviceclass.resource.kubernetes.io/<class>`) nobody listed
  is as refused as `nvidia.com/gpu`;
* a dynamic resource claim: `spec.resourceClaims` or a container's `resources.claims` (an engine
  Pod's `spec.resourceClaims` and its engine container's claims belong to its plan, as its
  RuntimeClass does: the plan sets them, from the owner's claim templates, or removes them);
* a device variable: any variable in a namespace a vendor's container runtime reads to hand out
  devices or device features (`DEVICE_ENV_PREFIXES`, below, with the sources it rests on). This
  is an allow-list, not a list of known variables: the whole namespace is refused, on every
  container, and the one value allowed is the shield's (`NVIDIA_VISIBLE_DEVICES=void`, which
  hands out nothing). The plan writes no variable on the granted container: its devices come
  from the device plugin or its claim alone;
* on any container, an `envFrom` source that could set a device variable: one with no
  `prefix`, or a prefix that a device-variable namespace starts with (or that starts with one).
  The Pod's own variables come after the device plugin's, so `NVIDIA_VISIBLE_DEVICES=all` from
  a ConfigMap would widen the grant to every GPU on the node, and another vendor's runtime does
  not care that the NVIDIA variable says `void`;
* a Container Device Interface annotation (`CDI_ANNOTATION_PREFIXES`): container runtimes with
  CDI enabled (containerd 2, CRI-O, NVIDIA's runtime in CDI mode) inject the devices such a key
  names, whatever the device plugin granted;
* a RuntimeClass (which may be the NVIDIA runtime that honours such variables);
* a `kamiwaza.ai/plan` annotation it was not given by the webhook.

Each finding is a `Reach`: the field and the value it holds, so an UPDATE that changes a value
(a granted count raised from 1 to 7) is as visible as one that adds a field.

What a Pod asks for is not the whole story: every CUDA base image sets
`NVIDIA_VISIBLE_DEVICES=all` in its own environment, and on a node whose default runtime is
NVIDIA's such an image sees every GPU without asking. The webhook cannot read an image's
environment, so it *shields* every container that holds no grant: it sets
`NVIDIA_VISIBLE_DEVICES=void` explicitly (a container's `env` wins over the image and over
`envFrom`). `unshielded` says which containers still need it; the CEL sends the webhook every Pod
with such a container, so Pods that set the variable themselves (the webhook's own) never
depend on the webhook being up.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from inference_policy.base.pod_view import PodView, is_map, mapping_at, objects_in, positions_in
from inference_policy.base.wire import PLAN_ANNOTATION

# The resources that hand out no device: what the kubelet itself accounts. `pods` is a node's
# allocatable, never a container's ask, and is here so a node's plain capacity is not a device.
STANDARD_RESOURCES = frozenset(("cpu", "memory", "ephemeral-storage", "pods"))
STANDARD_PREFIXES = ("hugepages-",)
NVIDIA_DEVICE_ENV = "NVIDIA_VISIBLE_DEVICES"
# Every namespace of variables a container runtime reads to hand out devices or device
# features. A runtime reads these from the container's final environment (image, envFrom, env),
# so one set on any container counts, whatever the device plugin granted:
# - NVIDIA Container Toolkit (internal/config/image/cuda_image.go): NVIDIA_VISIBLE_DEVICES,
#   NVIDIA_DRIVER_CAPABILITIES, NVIDIA_REQUIRE_*, NVIDIA_DISABLE_REQUIRE,
#   NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES, NVIDIA_IMEX_CHANNELS, and the feature
#   switches NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_NVSWITCH, NVIDIA_GDRCOPY (RDMA, NVSwitch, GDS and
#   IMEX devices for a container that holds a GPU); gVisor's nvproxy reads the same names;
# - AMD Container Toolkit: AMD_VISIBLE_DEVICES;
# - Intel Gaudi (habana-container-runtime): HABANA_VISIBLE_DEVICES, HABANA_VISIBLE_MODULES;
# - AWS Neuron (oci-neuron-hook): AWS_NEURON_VISIBLE_DEVICES;
# - Huawei Ascend (ascend-docker-runtime): ASCEND_VISIBLE_DEVICES, ASCEND_RUNTIME_OPTIONS,
#   ASCEND_ALLOW_LINK;
# - Enflame (ENFLAME_VISIBLE_DEVICES) and Moore Threads (MTHREADS_VISIBLE_DEVICES) runtimes.
# The whole namespace is refused, not the names above, so a feature variable added in a later
# release is refused the day it ships. Variables a library reads inside the process
# (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES) only narrow what the container was given and are
# not in any of these namespaces.
DEVICE_ENV_PREFIXES = (
    "NVIDIA_",
    "AMD_",
    "HABANA_",
    "AWS_NEURON_",
    "ASCEND_",
    "ENFLAME_",
    "MTHREADS_",
)
# Kept for readers of the two variables this rule began with; the rule is the namespaces above.
DEVICE_ENV = (NVIDIA_DEVICE_ENV, "AMD_VISIBLE_DEVICES")
# NVIDIA's container toolkit treats `void` as "behave like runc": no device, no driver.
NO_DEVICE = "void"
# Pod annotation keys a CDI-enabled container runtime turns into devices (containerd's and
# CRI-O's `cdi.k8s.io/` prefix; NVIDIA's runtime in CDI mode reads its own as well).
CDI_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io/")
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
RESOURCE_PARTS = ("requests", "limits")


ReachKind = Literal[
    "resource", "claim", "env", "runtime-class", "plan-annotation", "node", "annotation"
]


@dataclass(frozen=True, order=True, slots=True)
class Reach:
    """One way a Pod reaches for an accelerator: the field people would point at, its value
    (the quantity, the variable's value, the class name; empty where presence is the point)
    and which kind of reach it is."""

    field: str
    value: str = ""
    kind: ReachKind = "resource"


def is_accelerator_resource(name: str) -> bool:
    """Any resource but the kubelet's own: default-deny, so a new device is refused unlisted."""
    return name not in STANDARD_RESOURCES and not name.startswith(STANDARD_PREFIXES)


def is_device_variable(name: object) -> bool:
    """A variable in a namespace some container runtime reads to hand out devices."""
    return isinstance(name, str) and name.startswith(DEVICE_ENV_PREFIXES)


def selects_devices(entry: Mapping[str, Any]) -> bool:
    """An env entry that makes a container runtime hand devices (or device features) to the
    container: any device variable but the shield's literal value."""
    name = entry.get("name")
    if not is_device_variable(name):
        return False
    shield = name == NVIDIA_DEVICE_ENV and entry.get("value") == NO_DEVICE
    return not (shield and "valueFrom" not in entry)


def can_set_device_env(source: Mapping[str, Any]) -> bool:
    """An `envFrom` entry whose keys could land on a device variable: one with no prefix, or a
    prefix that a device-variable namespace starts with (`NV` and a key `IDIA_GDS`) or that
    starts with one (`NVIDIA_` and a key `VISIBLE_DEVICES`)."""
    prefix = source.get("prefix")
    if not isinstance(prefix, str) or not prefix:
        return True
    return any(ns.startswith(prefix) or prefix.startswith(ns) for ns in DEVICE_ENV_PREFIXES)


def is_cdi_annotation(key: object) -> bool:
    """A Pod annotation a CDI-enabled container runtime turns into devices."""
    return isinstance(key, str) and key.startswith(CDI_ANNOTATION_PREFIXES)


def _resource_reaches(at: str, resources: Mapping[str, Any], found: list[Reach]) -> None:
    for part in RESOURCE_PARTS:
        asks = resources.get(part)
        if not asks or not is_map(asks):
            continue
        for key, value in asks.items():
            if isinstance(key, str) and is_accelerator_resource(key):
                found.append(Reach(f"{at}.resources.{part}[{key}]", str(value)))


def _container_reaches(
    kind: str, container: Mapping[str, Any], resources: bool, found: list[Reach]
) -> None:
    # Appends rather than yields, and names the field only once there is a reach to name:
    # every container of every reviewed Pod passes here, and almost none reaches.
    if resources:
        own = container.get("resources")
        if own and is_map(own):
            at = f"spec.{kind}[{container.get('name')}]"
            _resource_reaches(at, own, found)
            claims = own.get("claims")
            if isinstance(claims, list) and claims:
                found.append(Reach(f"{at}.resources.claims", str(len(claims)), "claim"))
    sources = container.get("envFrom")
    if sources:
        for source in sources if isinstance(sources, list) else ():
            if is_map(source) and can_set_device_env(source):
                at = f"spec.{kind}[{container.get('name')}]"
                found.append(Reach(f"{at}.envFrom", str(source.get("prefix", "")), "env"))
    env = container.get("env")
    if isinstance(env, list):
        for entry in env:
            if is_map(entry) and selects_devices(entry):
                value = entry.get("value") if "valueFrom" not in entry else "valueFrom"
                at = f"spec.{kind}[{container.get('name')}]"
                found.append(Reach(f"{at}.env[{entry.get('name')}]", str(value), "env"))


def container_reaches(
    kind: str, container: Mapping[str, Any], *, resources: bool = True
) -> Iterator[Reach]:
    """The reaches of one container; `resources` False skips its resource asks (the engine
    container, whose asks the plan replaces or grants)."""
    found: list[Reach] = []
    _container_reaches(kind, container, resources, found)
    return iter(found)


def reaches(
    pod: Mapping[str, Any],
    engine: str | None = None,
    *,
    plan_annotation: bool = True,
) -> list[Reach]:
    """Every way this Pod reaches for an accelerator on its own, in field order.

    `engine` names the container a plan governs: its own resource asks and claims, the Pod's
    RuntimeClass, resource claims and plan annotation belong to the plan, so they are not
    reaches. `plan_annotation`
    False leaves the annotation out (an UPDATE judges it separately, as frozen).
    """
    view = PodView(pod)
    # The spec once for the three lists: every reviewed Pod passes here.
    spec = view.spec
    found: list[Reach] = []
    for kind in CONTAINER_LISTS:
        for container in objects_in(spec.get(kind)):
            governed = kind == "containers" and container.get("name") == engine
            _container_reaches(kind, container, not governed, found)
    _resource_reaches("spec", mapping_at(spec, "resources"), found)
    runtime_class = spec.get("runtimeClassName")
    if engine is None and runtime_class:
        found.append(
            Reach(f"spec.runtimeClassName ({runtime_class})", str(runtime_class), "runtime-class")
        )
    claims = spec.get("resourceClaims")
    if engine is None and isinstance(claims, list) and claims:
        found.append(Reach("spec.resourceClaims", str(len(claims)), "claim"))
    annotations = view.annotations
    for key in annotations:
        if is_cdi_annotation(key):
            found.append(Reach(f"metadata.annotations[{key}]", str(annotations[key]), "annotation"))
    if plan_annotation and engine is None and PLAN_ANNOTATION in annotations:
        found.append(Reach(f"metadata.annotations[{PLAN_ANNOTATION}]", "", "plan-annotation"))
    return found


def shielded(container: Mapping[str, Any]) -> bool:
    """The container sets NVIDIA_VISIBLE_DEVICES itself, so the image's value cannot apply.

    Any explicit value counts here; one other than `void` is a reach and refused on its own."""
    env = container.get("env")
    return isinstance(env, list) and any(
        is_map(entry) and entry.get("name") == NVIDIA_DEVICE_ENV for entry in env
    )


def unshielded(
    pod: Mapping[str, Any], kinds: tuple[str, ...] = CONTAINER_LISTS
) -> list[tuple[str, int]]:
    """(kind, index) of each container of those kinds that does not set NVIDIA_VISIBLE_DEVICES."""
    spec = PodView(pod).spec
    out: list[tuple[str, int]] = []
    for kind in kinds:
        for index, container in positions_in(spec.get(kind)):
            if not shielded(container):
                out.append((kind, index))
    return out


def new_reaches(pod: Mapping[str, Any], old: Mapping[str, Any]) -> list[Reach]:
    """What an UPDATE adds or changes: reaches of the new Pod that the old one did not have
    with the same value (so 1 -> 7 GPUs is new, an unchanged grant is not)."""
    before = set(reaches(old, plan_annotation=False))
    return sorted(r for r in reaches(pod, plan_annotation=False) if r not in before)


__all__ = [
    "CDI_ANNOTATION_PREFIXES",
    "CONTAINER_LISTS",
    "DEVICE_ENV",
    "DEVICE_ENV_PREFIXES",
    "NO_DEVICE",
    "STANDARD_PREFIXES",
    "STANDARD_RESOURCES",
    "Reach",
    "can_set_device_env",
    "container_reaches",
    "is_accelerator_resource",
    "is_cdi_annotation",
    "is_device_variable",
    "new_reaches",
    "reaches",
    "selects_devices",
    "shielded",
    "unshielded",
]
