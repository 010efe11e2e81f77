"""Placement: may a planned engine Pod run on a node, and how well does it fit there.

The webhook fixes a Pod's binding at admission; the scheduler then chooses among nodes it finds
feasible for the Pod's native resources. This module is the extender's judgement on top of that:
that the node is really the hardware the signed binding vouches for (architecture, the resource,
and what GPU Feature Discovery says about the card and driver), and that the binding's resource
has room once the Pod is added. It is pure: plain dicts in, verdicts and scores out, so the
server, the benchmarks and the tests run the same decisions.

Verdicts say whether a change of load can help. A wrong architecture, an absent resource, a GFD
fact that contradicts the binding, or a request larger than the node's whole allocatable is
*unresolvable* (kube-scheduler then skips preemption for that node); too little free capacity is
*resolvable*. A GPU binding on a node with no GFD labels is refused as unresolvable: nothing
confirms the accelerator the owner attested, and placing there silently would widen the grant.

Scores implement best fit: the node the Pod leaves with the least free capacity of the binding's
resource scores highest (10 exactly fills it), linearly down to 0 for leaving as much as the
largest candidate has in all. Small requests therefore fill partly used nodes and large free
devices stay whole for the requests that need them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Literal

from inference_policy import strictjson
from inference_policy.profile import (
    ARCH_KEY,
    CpuBinding,
    ExtendedResourceBinding,
    VramPluginBinding,
)
from inference_policy.wire import ENGINE_LABEL, PLAN_ANNOTATION

DEPLOYMENT_LABEL: Final = ENGINE_LABEL
MAX_PLAN_BYTES: Final = 64 * 1024
MAX_SCORE: Final = 10
MAX_MEMO: Final = 256

# GPU Feature Discovery label names (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery).
GFD_CC_MAJOR: Final = "nvidia.com/gpu.compute.major"
GFD_CC_MINOR: Final = "nvidia.com/gpu.compute.minor"
# The CUDA version the driver supports (NVML's CUDA driver version: 13 on R580). The similarly
# named `cuda.driver.major` / `cuda.driver-version.major` carry the kernel driver's release
# (580), which is not what `cudaDriverMajor` attests.
GFD_CUDA_MAJOR: Final = "nvidia.com/cuda.runtime-version.major"
GFD_CUDA_MAJOR_OLD: Final = "nvidia.com/cuda.runtime.major"
GFD_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_MEMORY: Final = "nvidia.com/gpu.memory"
GFD_REPLICAS: Final = "nvidia.com/gpu.replicas"
GFD_SHARING: Final = "nvidia.com/gpu.sharing-strategy"
GFD_MIG_STRATEGY: Final = "nvidia.com/mig.strategy"
GFD_SLICES: Final = "nvidia.com/gpu.slices.gi"
GFD_PRESENCE: Final = (GFD_CC_MAJOR, GFD_CC_MINOR, GFD_PRODUCT, GFD_CUDA_MAJOR, GFD_MIG_STRATEGY)
NVIDIA_MIG_PREFIX: Final = "nvidia.com/mig-"
VRAM_PREFIX: Final = "kamiwaza.ai/vram-gb-"
MIB: Final = 1024 * 1024

GpuBinding = ExtendedResourceBinding | VramPluginBinding
AnyBinding = CpuBinding | ExtendedResourceBinding | VramPluginBinding

_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_SUFFIX = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
    "m": Decimal("0.001"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_TERMINATED = frozenset({"Succeeded", "Failed"})


class PlanError(ValueError):
    """A plan annotation (or the Pod carrying it) that cannot be placed; the message says why."""


# -- verdicts -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer. `code` is a short stable class of the reason, for metrics and tests."""

    fits: bool
    reason: str | None = None
    unresolvable: bool = False
    code: str = "fits"

    def as_tuple(self) -> tuple[bool, None] | tuple[bool, str, bool]:
        """`(True, None)` or `(False, reason, unresolvable)`."""
        if self.fits:
            return (True, None)
        return (False, self.reason or "", self.unresolvable)


FITS: Final = Verdict(True)


def _refuse(code: str, reason: str) -> Verdict:
    return Verdict(False, reason, True, code)


def _busy(code: str, reason: str) -> Verdict:
    return Verdict(False, reason, False, code)


# -- quantities and requests --------------------------------------------------------------------


def parse_quantity(name: str, text: Any) -> int:
    """A Kubernetes quantity in base units (millicores for `cpu`), rounded up; ValueError else."""
    if not isinstance(text, str | int) or isinstance(text, bool):
        raise ValueError(f"{name}: {text!r} is not a quantity")
    match = _QUANTITY.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"{name}: {text!r} is not a quantity")
    try:
        number = Decimal(match["num"])
        suffix = match["suffix"] or ""
        if suffix[:1] in ("e", "E"):
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                raise ValueError(f"{name}: {text!r} is out of range")
            scale = Decimal(10) ** exponent
        else:
            scale = _SUFFIX[suffix]
    except InvalidOperation:
        raise ValueError(f"{name}: {text!r} is not a quantity") from None
    value = number * scale * (1000 if name == "cpu" else 1)
    if value < 0:
        raise ValueError(f"{name}: {text!r} is negative")
    return math.ceil(value)


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


def _container_requests(container: Any) -> dict[str, int]:
    if not isinstance(container, Mapping):
        raise ValueError("a container is not an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ValueError(f"container {container.get('name')!r}: resources is not an object")
    out: dict[str, int] = {}
    # The API server defaults a missing request to its limit; apply the same rule so a Pod seen
    # before defaulting (or from a test) counts what the kubelet will grant.
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if not isinstance(values, Mapping):
            raise ValueError(f"container {container.get('name')!r}: {section} is not an object")
        for name, quantity in values.items():
            out[str(name)] = parse_quantity(str(name), quantity)
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The Pod's effective requests as kube-scheduler computes them.

    Containers and restartable init containers (sidecars) add up; an ordinary init container
    runs alone beside the sidecars declared before it, so the larger of the two totals counts;
    the RuntimeClass overhead is added on top. Raises ValueError for an unreadable spec.
    """
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ValueError("spec is not an object")
    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        _add(total, _container_requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            _add(total, requests)
            continue
        running = dict(sidecars)
        _add(running, requests)
        for key, value in running.items():
            init_peak[key] = max(init_peak.get(key, 0), value)
    for key, value in init_peak.items():
        total[key] = max(total.get(key, 0), value)
    overhead = spec.get("overhead") or {}
    if isinstance(overhead, Mapping):
        _add(total, {str(k): parse_quantity(str(k), v) for k, v in overhead.items()})
    return total


def accounted_pod(pod: Mapping[str, Any]) -> tuple[str, dict[str, int]] | None:
    """`(node, requests)` for a Pod that holds resources on a node now, else None.

    A Pod holds its requests from the moment it is bound (`spec.nodeName`) until it has
    terminated; a Pod being deleted still holds them until it is gone, as the scheduler counts.
    A Pod whose requests cannot be read counts as holding nothing rather than stopping the
    informer: the scheduler's own fit check still counts it.
    """
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if not isinstance(spec, Mapping):
        return None
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    if isinstance(status, Mapping) and status.get("phase") in _TERMINATED:
        return None
    try:
        return node, pod_requests(pod)
    except ValueError:
        return None


def pod_key(pod: Mapping[str, Any]) -> str:
    """`namespace/name`: unique among live Pods, and lets one namespace's Pods be re-listed."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return "/"
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class UsageLedger:
    """Requests of the Pods bound to each node, kept as per-node totals.

    Updates are incremental (a Pod's previous contribution is taken back before its new one is
    added), so an informer event costs a few dictionary operations however many Pods there are.
    """

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, dict[str, int]]] = {}
        self._nodes: dict[str, dict[str, int]] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def upsert(self, key: str, node: str, requests: Mapping[str, int]) -> None:
        self.remove(key)
        stored = dict(requests)
        self._pods[key] = (node, stored)
        _add(self._nodes.setdefault(node, {}), stored)

    def remove(self, key: str) -> None:
        previous = self._pods.pop(key, None)
        if previous is None:
            return
        node, requests = previous
        totals = self._nodes.get(node)
        if totals is None:  # pragma: no cover - the two maps change together
            return
        for name, value in requests.items():
            left = totals.get(name, 0) - value
            if left > 0:
                totals[name] = left
            else:
                totals.pop(name, None)
        if not totals:
            del self._nodes[node]

    def apply(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """A Pod as an informer sees it now (None: deleted)."""
        accounted = accounted_pod(pod) if pod is not None else None
        if accounted is None:
            self.remove(key)
        else:
            self.upsert(key, *accounted)

    def used(self, node: str) -> Mapping[str, int]:
        return self._nodes.get(node) or _EMPTY

    def pod_keys(self) -> set[str]:
        return set(self._pods)

    def node_of(self, key: str) -> str | None:
        entry = self._pods.get(key)
        return entry[0] if entry else None


_EMPTY: Mapping[str, int] = {}


# -- nodes --------------------------------------------------------------------------------------


@dataclass(slots=True)
class NodeFacts:
    """What placement reads from a Node, parsed once per Node revision.

    `static` memoises the load-independent part of each verdict per demand, so a node that did
    not change is judged against a binding once, not once per scheduling cycle.
    """

    name: str
    arch: str | None
    labels: Mapping[str, str]
    allocatable: dict[str, int]
    version: str = ""
    static: dict[str, Verdict] = field(default_factory=dict)


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """Parse a v1.Node as the API returns it; unreadable quantities count as not advertised."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    labels_raw = meta.get("labels") if isinstance(meta, Mapping) else None
    labels = (
        {str(k): str(v) for k, v in labels_raw.items()} if isinstance(labels_raw, Mapping) else {}
    )
    allocatable: dict[str, int] = {}
    raw = status.get("allocatable") if isinstance(status, Mapping) else None
    if isinstance(raw, Mapping):
        for name, quantity in raw.items():
            try:
                allocatable[str(name)] = parse_quantity(str(name), quantity)
            except ValueError:
                continue
    name = meta.get("name") if isinstance(meta, Mapping) else None
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return NodeFacts(
        name=str(name or ""),
        arch=labels.get(ARCH_KEY),
        labels=labels,
        allocatable=allocatable,
        version=str(version or ""),
    )


# -- plans and demands --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """The parts of a `kamiwaza.ai/plan` annotation placement reads."""

    path: Literal["gpu", "cpu", "external"]
    binding_id: str | None
    arch: str | None
    requests: Mapping[str, int]
    bundle_sha256: str | None


def parse_plan(annotation: str | bytes | Mapping[str, Any]) -> Plan:
    """Parse the plan annotation strictly; PlanError names what is wrong."""
    if isinstance(annotation, Mapping):
        document: Any = annotation
    else:
        try:
            document = strictjson.loads(annotation, max_bytes=MAX_PLAN_BYTES, what="plan")
        except strictjson.StrictJSONError as exc:
            raise PlanError(f"the {PLAN_ANNOTATION} annotation is unreadable: {exc}") from None
    where = f"the {PLAN_ANNOTATION} annotation"
    if not isinstance(document, Mapping):
        raise PlanError(f"{where} is not a JSON object")
    path = document.get("path")
    if path not in ("gpu", "cpu", "external"):
        raise PlanError(f"{where}: path {path!r} is not gpu, cpu or external")
    if path == "external":
        return Plan("external", None, None, {}, None)
    binding_id = document.get("bindingId")
    if path == "gpu" and (not isinstance(binding_id, str) or not binding_id):
        raise PlanError(f"{where}: a gpu plan must name its bindingId")
    if binding_id is not None and not isinstance(binding_id, str):
        raise PlanError(f"{where}: bindingId is not a string")
    selector = document.get("nodeSelector")
    arch = selector.get(ARCH_KEY) if isinstance(selector, Mapping) else None
    if not isinstance(arch, str) or not arch:
        raise PlanError(f"{where}: nodeSelector must name {ARCH_KEY}")
    resources = document.get("resources")
    requests_raw = resources.get("requests") if isinstance(resources, Mapping) else None
    if not isinstance(requests_raw, Mapping) or not requests_raw:
        raise PlanError(f"{where}: resources.requests is missing")
    requests: dict[str, int] = {}
    for name, quantity in requests_raw.items():
        try:
            requests[str(name)] = parse_quantity(str(name), quantity)
        except ValueError as exc:
            raise PlanError(f"{where}: resources.requests: {exc}") from None
    bundle = document.get("bundle")
    sha = bundle.get("sha256") if isinstance(bundle, Mapping) else None
    return Plan(
        path=path,
        binding_id=binding_id,
        arch=arch,
        requests=requests,
        bundle_sha256=sha if isinstance(sha, str) else None,
    )


@dataclass(frozen=True, slots=True)
class Demand:
    """A planned Pod ready to be judged against nodes: its binding and its effective requests.

    `kind` names the resources best fit packs by; `key` identifies everything the node's
    identity verdict (architecture, resource, GFD facts) depends on, for `NodeFacts.static`;
    quantities are left out of it, so shares of every size reuse one verdict per node.
    """

    path: Literal["gpu", "cpu"]
    arch: str
    binding: GpuBinding | None
    requests: Mapping[str, int]
    checked: tuple[str, ...]
    kind: tuple[str, ...]
    key: str


def demand_for(
    plan: Plan,
    binding: AnyBinding | None,
    pod: Mapping[str, Any] | None = None,
    profile_sha256: str = "",
) -> Demand:
    """Join a plan with the binding it names (from the verified profile) and the Pod's requests.

    `pod` None takes the plan's requests as the Pod's. Raises PlanError when the plan, the
    binding and the Pod disagree: such a Pod cannot be placed anywhere.
    """
    if plan.path == "external":
        raise PlanError("an external plan allocates no local resources and is not placed")
    assert plan.arch is not None
    if pod is not None:
        try:
            requests = pod_requests(pod)
        except ValueError as exc:
            raise PlanError(f"the Pod's resource requests are unreadable: {exc}") from None
    else:
        requests = dict(plan.requests)
    if plan.path == "cpu":
        checked = tuple(name for name in ("cpu", "memory") if requests.get(name))
        return Demand(
            path="cpu",
            arch=plan.arch,
            binding=None,
            requests=requests,
            checked=checked,
            kind=checked,
            key="cpu/" + plan.arch + "/" + ",".join(checked),
        )
    if binding is None:
        raise PlanError(
            f"binding {plan.binding_id} is not in the verified profile; the Pod was planned "
            "under a profile revision that no longer grants it"
        )
    if isinstance(binding, CpuBinding):
        raise PlanError(f"the gpu plan names binding {binding.id}, which is a cpu binding")
    resource = binding.resource.name
    if binding.architecture != plan.arch:
        raise PlanError(
            f"the plan places binding {binding.id} on {plan.arch}, but the binding runs on "
            f"{binding.architecture}"
        )
    granted = plan.requests.get(resource)
    if not granted:
        raise PlanError(
            f"the plan does not request {resource}, the resource of binding {binding.id}; the "
            "profile revision changed since the Pod was planned"
        )
    asked = requests.get(resource, 0)
    if asked != granted:
        raise PlanError(
            f"the Pod requests {asked} {resource} but its plan grants {granted}; the Pod was "
            "changed after admission"
        )
    return Demand(
        path="gpu",
        arch=plan.arch,
        binding=binding,
        requests=requests,
        checked=(resource,),
        kind=(resource,),
        key=f"gpu/{profile_sha256}/{binding.id}",
    )


# -- the filter ---------------------------------------------------------------------------------


def _static(demand: Demand, node: NodeFacts) -> Verdict:
    verdict = node.static.get(demand.key)
    if verdict is None:
        verdict = identity_verdict(demand, node)
        if len(node.static) >= MAX_MEMO:
            # Every profile revision brings new keys; start afresh rather than grow for ever.
            node.static.clear()
        node.static[demand.key] = verdict
    return verdict


def _over_capacity(demand: Demand, name: str, want: int, have: int) -> Verdict:
    code = "vram-bucket" if name.startswith(VRAM_PREFIX) else "capacity"
    return _refuse(
        code,
        f"the Pod requests {_show(name, want)} {name} but the node's whole allocatable "
        f"is {_show(name, have)}",
    )


def check(demand: Demand, node: NodeFacts, used: Mapping[str, int]) -> Verdict:
    """Does the Pod fit on this node now? The node's identity verdict is memoised on it."""
    verdict = node.static.get(demand.key) or _static(demand, node)
    if not verdict.fits:
        return verdict
    allocatable = node.allocatable
    for name in demand.checked:
        want = demand.requests[name]
        have = allocatable[name]
        if want > have:
            return _over_capacity(demand, name, want, have)
        taken = used.get(name, 0)
        if taken + want > have:
            return _busy(
                "vram-bucket" if name.startswith(VRAM_PREFIX) else "insufficient",
                _busy_reason(demand, name, want, have - taken, have),
            )
    return FITS


def check_nodes(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
) -> list[Verdict | None]:
    """`check` for every candidate (None stays None: a node the caller does not know)."""
    if len(demand.checked) != 1:
        return [None if n is None else check(demand, n, used_of(n.name)) for n in nodes]
    name = demand.checked[0]
    want = demand.requests[name]
    key = demand.key
    out: list[Verdict | None] = []
    append = out.append
    for node in nodes:
        if node is None:
            append(None)
            continue
        verdict = node.static.get(key) or _static(demand, node)
        if verdict.fits and used_of(node.name).get(name, 0) + want > node.allocatable[name]:
            verdict = check(demand, node, used_of(node.name))
        append(verdict)
    return out


def _busy_reason(demand: Demand, name: str, want: int, free: int, have: int) -> str:
    free = max(free, 0)
    if name.startswith(VRAM_PREFIX):
        binding = demand.binding.id if demand.binding else "the binding"
        return (
            f"accounted VRAM bucket {name} is full: the share of binding {binding} needs {want} "
            f"GB and {free} of {have} GB are free"
        )
    return (
        f"not enough free {name}: the Pod requests {_show(name, want)}, and "
        f"{_show(name, free)} of {_show(name, have)} is free"
    )


def _show(name: str, value: int) -> str:
    if name == "cpu":
        return f"{value}m" if value % 1000 else str(value // 1000)
    if name in {"memory", "ephemeral-storage"}:
        for unit, scale in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
            if value >= scale and value % scale == 0:
                return f"{value // scale}{unit}"
    return str(value)


def static_verdict(demand: Demand, node: NodeFacts) -> Verdict:
    """Everything about the node that no change of load alters: its identity, then whether the
    request exceeds the node's whole allocatable."""
    verdict = identity_verdict(demand, node)
    if not verdict.fits:
        return verdict
    for name in demand.checked:
        want, have = demand.requests[name], node.allocatable[name]
        if want > have:
            return _over_capacity(demand, name, want, have)
    return FITS


def identity_verdict(demand: Demand, node: NodeFacts) -> Verdict:
    """Is this node hardware the binding vouches for: architecture, resource, GFD facts."""
    binding = demand.binding
    owner = f"binding {binding.id}" if binding is not None else "the plan"
    if node.arch != demand.arch:
        if node.arch is None:
            return _refuse(
                "arch", f"node has no {ARCH_KEY} label; {owner} runs on {demand.arch} nodes only"
            )
        return _refuse(
            "arch", f"node architecture is {node.arch}; {owner} runs on {demand.arch} nodes only"
        )
    for name in demand.checked:
        have = node.allocatable.get(name)
        if not have:
            advertised = "advertises no" if have is None else "advertises 0"
            return _refuse(
                "resource-absent", f"node {advertised} {name} in its allocatable resources"
            )
    if binding is not None and binding.accelerator.vendor == "nvidia":
        verdict = _gfd_verdict(binding, node.labels)
        if verdict is not None:
            return verdict
    return FITS


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    try:
        return int(value.strip(), 10)
    except ValueError:
        return None


def _gfd_verdict(binding: GpuBinding, labels: Mapping[str, str]) -> Verdict | None:
    """Contradictions between GPU Feature Discovery's node labels and the binding's attestation.

    A binding attests what holds on every node of its architecture that advertises its resource
    (the lowest compute capability and CUDA driver major among them), so any such node reporting
    less contradicts the signed profile.
    """
    who = f"binding {binding.id}"
    if not any(key in labels for key in GFD_PRESENCE):
        return _refuse(
            "gfd-missing",
            f"node has no GPU Feature Discovery labels; cannot confirm the accelerator {who} "
            "attests",
        )
    major, minor = _int_label(labels, GFD_CC_MAJOR), _int_label(labels, GFD_CC_MINOR)
    if major is None or minor is None:
        return _refuse(
            "gfd-missing",
            f"node has no readable {GFD_CC_MAJOR} and {GFD_CC_MINOR} labels; cannot confirm "
            f"the compute capability {who} attests",
        )
    attested = binding.accelerator.capability_tuple
    if (major, minor) < attested:
        return _refuse(
            "compute-capability",
            f"GPU Feature Discovery reports compute capability {major}.{minor} "
            f"({GFD_CC_MAJOR}/{GFD_CC_MINOR}); {who} attests "
            f"{binding.accelerator.computeCapability}, the lowest on its nodes",
        )
    cuda = binding.accelerator.cudaDriverMajor
    if cuda is not None:
        reported = _int_label(labels, GFD_CUDA_MAJOR)
        source = GFD_CUDA_MAJOR
        if reported is None:
            reported, source = _int_label(labels, GFD_CUDA_MAJOR_OLD), GFD_CUDA_MAJOR_OLD
        if reported is None:
            return _refuse(
                "gfd-missing",
                f"node has no readable {GFD_CUDA_MAJOR} label; cannot confirm the "
                f"cudaDriverMajor {cuda} {who} attests",
            )
        if reported < cuda:
            return _refuse(
                "cuda-driver",
                f"GPU Feature Discovery reports a driver for CUDA {reported} ({source}); {who} "
                f"attests cudaDriverMajor {cuda}",
            )
    if isinstance(binding, ExtendedResourceBinding) and binding.is_mig:
        return _mig_verdict(binding, labels)
    product = labels.get(GFD_PRODUCT, "")
    if isinstance(binding, ExtendedResourceBinding):
        # Under the single strategy a MIG slice is advertised as nvidia.com/gpu; GFD then names
        # the product after the slice and adds the slice's own labels.
        if "-MIG-" in product or GFD_SLICES in labels:
            strategy = labels.get(GFD_MIG_STRATEGY, "unknown")
            return _refuse(
                "mig-strategy",
                f"node's nvidia.com/gpu devices are MIG slices ({GFD_PRODUCT}={product}, "
                f"{GFD_MIG_STRATEGY}={strategy}), not the whole GPUs {who} guarantees",
            )
        shared = _sharing(labels, GFD_SHARING, GFD_REPLICAS, product)
        if shared:
            return _refuse(
                "shared-device",
                f"node shares its GPUs ({shared}): an nvidia.com/gpu there is not the whole "
                f"device {who} guarantees",
            )
    return _memory_verdict(binding, labels, GFD_MEMORY)


def _sharing(labels: Mapping[str, str], strategy_key: str, replicas_key: str, product: str) -> str:
    strategy = labels.get(strategy_key, "none")
    replicas = _int_label(labels, replicas_key) or 0
    if strategy not in ("", "none") or replicas > 1 or product.endswith("-SHARED"):
        return f"{strategy_key}={strategy}, {replicas_key}={labels.get(replicas_key, '-')}"
    return ""


def _memory_verdict(binding: GpuBinding, labels: Mapping[str, str], key: str) -> Verdict | None:
    mib = _int_label(labels, key)
    if mib is None or mib <= 0:
        # GFD omits the label when NVML reports no memory (unified-memory parts).
        return None
    usable = binding.usable_memory_bytes
    if mib * MIB < usable:
        return _refuse(
            "memory",
            f"GPU Feature Discovery reports {mib} MiB per device ({key}); {binding.id} "
            f"attests {binding.capacity_memory} usable",
        )
    return None


def _mig_verdict(binding: ExtendedResourceBinding, labels: Mapping[str, str]) -> Verdict | None:
    resource = binding.resource.name
    shape = resource.removeprefix(NVIDIA_MIG_PREFIX)
    who = f"binding {binding.id}"
    strategy = labels.get(GFD_MIG_STRATEGY)
    if strategy is None:
        return _refuse(
            "gfd-missing",
            f"node has no {GFD_MIG_STRATEGY} label; cannot confirm it advertises MIG slices as "
            f"{resource}",
        )
    if strategy != "mixed":
        return _refuse(
            "mig-strategy",
            f"node's MIG strategy is {strategy} ({GFD_MIG_STRATEGY}); {who} requests {resource}, "
            "a name only the mixed strategy advertises (single advertises slices as "
            "nvidia.com/gpu)",
        )
    product_key = f"{resource}.product"
    product = labels.get(product_key)
    # GFD names a slice product <parent product>-MIG-<profile>, dropping characters that are not
    # allowed in a label value (the '+' of a media-extension profile).
    expected = "-MIG-" + re.sub(r"[^A-Za-z0-9._-]", "", shape)
    if product is None:
        return _refuse(
            "gfd-missing",
            f"node has no {product_key} label; cannot confirm its {shape} MIG slices",
        )
    core = product.removesuffix("-SHARED")
    if not core.endswith(expected):
        return _refuse(
            "mig-product",
            f"{product_key} is {product}, not a {shape} MIG slice as {who} requests",
        )
    shared = _sharing(labels, f"{resource}.sharing-strategy", f"{resource}.replicas", product)
    if shared:
        return _refuse(
            "shared-device",
            f"node shares its {shape} MIG slices ({shared}); {who} guarantees an exclusive "
            "partition",
        )
    return _memory_verdict(binding, labels, f"{resource}.memory")


def fits(
    plan: Plan | Mapping[str, Any] | str,
    binding: AnyBinding | None,
    node: Mapping[str, Any] | NodeFacts,
    usage: Mapping[str, int],
    pod: Mapping[str, Any] | None = None,
) -> tuple[bool, None] | tuple[bool, str, bool]:
    """One-shot form over raw dicts: `(True, None)` or `(False, reason, unresolvable)`."""
    try:
        parsed = plan if isinstance(plan, Plan) else parse_plan(plan)
        if parsed.path == "external":
            return (True, None)
        demand = demand_for(parsed, binding, pod)
    except PlanError as exc:
        return (False, str(exc), True)
    facts = node if isinstance(node, NodeFacts) else node_facts(node)
    return check(demand, facts, usage).as_tuple()


# -- best fit -----------------------------------------------------------------------------------


def best_fit_scales(demand: Demand, nodes: Iterable[NodeFacts]) -> dict[str, int]:
    """The score's unit: the largest allocatable of each packed resource among the candidates
    the Pod can use at all (nodes it is statically refused from do not stretch the scale)."""
    scales: dict[str, int] = dict.fromkeys(demand.kind, 0)
    for node in nodes:
        if not (node.static.get(demand.key) or _static(demand, node)).fits:
            continue
        for name in demand.kind:
            scales[name] = max(scales[name], node.allocatable.get(name, 0))
    return scales


def score(
    demand: Demand, node: NodeFacts, used: Mapping[str, int], scales: Mapping[str, int]
) -> int:
    """0..10: 10 when the Pod exactly fills the node's free capacity of its kind, falling linearly
    with what it leaves free, in units of the largest candidate's capacity. A node the Pod does
    not fit on scores 0."""
    if not check(demand, node, used).fits:
        return 0
    total = 0.0
    counted = 0
    for name in demand.kind:
        scale = scales.get(name, 0)
        if scale <= 0:
            continue
        left = node.allocatable.get(name, 0) - used.get(name, 0) - demand.requests.get(name, 0)
        if len(demand.kind) == 1:
            # Integer arithmetic: exactly full is 10, anything left over is at most 9.
            if left <= 0:
                return MAX_SCORE
            return max(0, min(MAX_SCORE - 1, (MAX_SCORE * (scale - left)) // scale))
        total += max(left, 0) / scale
        counted += 1
    if counted == 0:
        return 0
    mean = total / counted
    if mean <= 0:
        return MAX_SCORE
    return max(0, min(MAX_SCORE - 1, math.floor(MAX_SCORE * (1 - mean))))


def score_nodes(
    demand: Demand,
    nodes: Sequence[NodeFacts | None],
    used_of: Callable[[str], Mapping[str, int]],
) -> list[int]:
    """`score` for every candidate (None: unknown, scores 0), scaled over the known ones.

    The same arithmetic as `score`, unrolled for the usual one-resource demand: prioritize runs
    it over every candidate of a large cluster inside the scheduler's time budget.
    """
    if len(demand.kind) != 1 or demand.checked != demand.kind:
        known = [node for node in nodes if node is not None]
        scales = best_fit_scales(demand, known)
        return [0 if n is None else score(demand, n, used_of(n.name), scales) for n in nodes]
    name = demand.kind[0]
    want = demand.requests.get(name, 0)
    key = demand.key
    scale = 0
    lefts: list[int | None] = []
    append = lefts.append
    for node in nodes:
        if node is None or not (node.static.get(key) or _static(demand, node)).fits:
            append(None)
            continue
        have = node.allocatable[name]
        scale = max(scale, have)
        append(have - used_of(node.name).get(name, 0) - want)
    top = MAX_SCORE - 1
    return [
        0
        if left is None or left < 0
        else MAX_SCORE
        if left == 0
        else max(0, min(top, (MAX_SCORE * (scale - left)) // scale))
        for left in lefts
    ]


__all__ = [
    "DEPLOYMENT_LABEL",
    "FITS",
    "PLAN_ANNOTATION",
    "Demand",
    "NodeFacts",
    "Plan",
    "PlanError",
    "UsageLedger",
    "Verdict",
    "accounted_pod",
    "best_fit_scales",
    "check",
    "check_nodes",
    "demand_for",
    "fits",
    "identity_verdict",
    "node_facts",
    "parse_plan",
    "parse_quantity",
    "pod_key",
    "pod_requests",
    "score",
    "score_nodes",
    "static_verdict",
]
