"""What the extender knows about a Node, and its verdict on one: is it the hardware a signed
binding vouches for?

A Node is parsed once per revision into `NodeFacts` (its architecture, labels and allocatable
resources in the scheduler's units). The identity part of a verdict (architecture, the resource,
and what NVIDIA's GPU Feature Discovery labels say about the card and driver) does not depend on
load, so it is memoised on the facts per demand. Verdicts say whether a change of load can help:
a fact that contradicts the binding is *unresolvable* (kube-scheduler then skips preemption for
that node); too little free capacity is *resolvable*. A GPU binding on a node with no GFD labels
is refused as unresolvable: nothing confirms the accelerator the owner attested, and placing
there silently would widen the grant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inference_policy.allocation.gfd import (
    GFD_CC_MAJOR,
    GFD_CC_MINOR,
    GFD_CUDA_MAJOR,
    GFD_CUDA_MAJOR_OLD,
    GFD_PRESENCE,
    int_label,
)
from inference_policy.base.codes import FITS, NodeVerdictCode, Verdict, busy, refuse
from inference_policy.base.pod_view import ObjectView
from inference_policy.base.quantity import QuantityError, resource_units
from inference_policy.trust.profile import ARCH_KEY, GpuBinding

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
    view = ObjectView(node)
    labels = {str(k): str(v) for k, v in view.labels.items()}
    allocatable: dict[str, int] = {}
    raw = view.status.get("allocatable")
    if isinstance(raw, Mapping):
        for name, quantity in raw.items():
            try:
                allocatable[str(name)] = resource_units(str(name), quantity)
            except QuantityError:
                continue
    return NodeFacts(
        name=view.name or "",
        arch=labels.get(ARCH_KEY),
        labels=labels,
        allocatable=allocatable,
        version=view.resource_version or "",
    )


# -- GPU Feature Discovery ---------------------------------------------------------------------


def gfd_verdict(binding: GpuBinding, labels: Mapping[str, str]) -> Verdict | None:
    """Contradictions between GPU Feature Discovery's node labels and the binding's attestation.

    A binding attests what holds on every node of its architecture that advertises its resource
    (the lowest compute capability and CUDA driver major among them), so any such node reporting
    less contradicts the signed profile.
    """
    if binding.allocation.claimed:
        # The DeviceClass's selector attests a claimed device, not the node's labels.
        return None
    who = f"binding {binding.id}"
    if not any(key in labels for key in GFD_PRESENCE):
        return refuse(
            NodeVerdictCode.GFD_MISSING,
            f"node has no GPU Feature Discovery labels; cannot confirm the accelerator {who} "
            "attests",
        )
    major, minor = int_label(labels, GFD_CC_MAJOR), int_label(labels, GFD_CC_MINOR)
    if major is None or minor is None:
        return refuse(
            NodeVerdictCode.GFD_MISSING,
            f"node has no readable {GFD_CC_MAJOR} and {GFD_CC_MINOR} labels; cannot confirm "
            f"the compute capability {who} attests",
        )
    attested = binding.accelerator.capability_tuple
    if (major, minor) < attested:
        return refuse(
            NodeVerdictCode.COMPUTE_CAPABILITY,
            f"GPU Feature Discovery reports compute capability {major}.{minor} "
            f"({GFD_CC_MAJOR}/{GFD_CC_MINOR}); {who} attests "
            f"{binding.accelerator.computeCapability}, the lowest on its nodes",
        )
    cuda = binding.accelerator.cudaDriverMajor
    if cuda is not None:
        reported = int_label(labels, GFD_CUDA_MAJOR)
        source = GFD_CUDA_MAJOR
        if reported is None:
            reported, source = int_label(labels, GFD_CUDA_MAJOR_OLD), GFD_CUDA_MAJOR_OLD
        if reported is None:
            return refuse(
                NodeVerdictCode.GFD_MISSING,
                f"node has no readable {GFD_CUDA_MAJOR} label; cannot confirm the "
                f"cudaDriverMajor {cuda} {who} attests",
            )
        if reported < cuda:
            return refuse(
                NodeVerdictCode.CUDA_DRIVER,
                f"GPU Feature Discovery reports a driver for CUDA {reported} ({source}); {who} "
                f"attests cudaDriverMajor {cuda}",
            )
    return binding.allocation.node_verdict(binding, labels)


__all__ = [
    "FITS",
    "GFD_CUDA_MAJOR",
    "GpuBinding",
    "NodeFacts",
    "Verdict",
    "busy",
    "gfd_verdict",
    "node_facts",
    "refuse",
]
