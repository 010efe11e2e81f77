"""A node's verdict for a Pod, and the stable code of every verdict the extender can give.

A verdict's `reason` names bindings, labels and sizes, so nothing may branch on it. Placement
(`nodes`, `placement`) and the extender (`extender.view`) give each refused node one of these
codes; the extender's `tmi_extender_node_verdicts_total{code}` metric and its logs label by it,
the dashboard groups by it, and the runbook (docs/operations.md, "Node verdicts") has a section
for each, as it has for the planner's `RefusalCode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class NodeVerdictCode(StrEnum):
    """Why a node was passed or refused for a Pod, as a short label."""

    FITS = "fits"
    # -- the node is not the hardware the binding vouches for (unresolvable) --------------------
    ARCH = "arch"
    RESOURCE_ABSENT = "resource-absent"
    GFD_MISSING = "gfd-missing"
    COMPUTE_CAPABILITY = "compute-capability"
    CUDA_DRIVER = "cuda-driver"
    MIG_STRATEGY = "mig-strategy"
    MIG_PRODUCT = "mig-product"
    SHARED_DEVICE = "shared-device"
    MEMORY = "memory"
    CAPACITY = "capacity"
    # -- the node is right but full now (resolvable) --------------------------------------------
    VRAM_BUCKET = "vram-bucket"
    INSUFFICIENT = "insufficient"
    OTHER_TENANT = "other-tenant"
    # -- every candidate at once: the Pod or the extender's view, not the node -----------------
    UNKNOWN_NODE = "unknown-node"
    PLAN_INVALID = "plan-invalid"
    PROFILE_REFUSED = "profile-refused"
    GRANT_MISMATCH = "grant-mismatch"
    UNPLANNED_DEVICE = "unplanned-device"
    OWNER_RIGHTS = "owner-rights"
    QUOTA = "quota"


DESCRIPTIONS: dict[NodeVerdictCode, str] = {
    NodeVerdictCode.FITS: "the node can hold the Pod's signed binding now",
    NodeVerdictCode.ARCH: "the node's architecture is not the binding's",
    NodeVerdictCode.RESOURCE_ABSENT: "the node advertises none of the binding's resource",
    NodeVerdictCode.GFD_MISSING: "no GPU Feature Discovery labels confirm the card",
    NodeVerdictCode.COMPUTE_CAPABILITY: "the card's compute capability is below the attested one",
    NodeVerdictCode.CUDA_DRIVER: "the driver's CUDA major is below the attested one",
    NodeVerdictCode.MIG_STRATEGY: "the MIG strategy does not advertise the binding's devices",
    NodeVerdictCode.MIG_PRODUCT: "the node's MIG slices are not the binding's profile",
    NodeVerdictCode.SHARED_DEVICE: "the node time-slices devices the binding guarantees whole",
    NodeVerdictCode.MEMORY: "the card has less memory than the binding attests usable",
    NodeVerdictCode.CAPACITY: "the Pod asks more than the node's whole allocatable",
    NodeVerdictCode.VRAM_BUCKET: "the accounted VRAM bucket has too little free now",
    NodeVerdictCode.INSUFFICIENT: "too little of the binding's resource is free now",
    NodeVerdictCode.OTHER_TENANT: "another tenant holds an accounted share on the GPU now",
    NodeVerdictCode.UNKNOWN_NODE: "the scheduler named a node the extender has not listed",
    NodeVerdictCode.PLAN_INVALID: "the Pod's plan cannot be read or disagrees with the Pod",
    NodeVerdictCode.PROFILE_REFUSED: "the extender holds no verified profile for the plan",
    NodeVerdictCode.GRANT_MISMATCH: "the Pod is not what its verified revision plans for it",
    NodeVerdictCode.UNPLANNED_DEVICE: "the Pod asks for an accelerator without a plan",
    NodeVerdictCode.OWNER_RIGHTS: "the allocation controller's rights in the namespace are "
    "missing or unconfirmed",
    NodeVerdictCode.QUOTA: "the Pod would take its namespace past the owner's quota",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer; `code` is its stable class (`NodeVerdictCode`), for metrics and logs.
    An unresolvable verdict is one no change of load can help (the scheduler skips preemption
    for that node); a resolvable one is too little free capacity now."""

    fits: bool
    reason: str | None = None
    unresolvable: bool = False
    code: NodeVerdictCode = NodeVerdictCode.FITS


FITS = Verdict(True)


def refuse(code: NodeVerdictCode, reason: str) -> Verdict:
    return Verdict(False, reason, True, code)


def busy(code: NodeVerdictCode, reason: str) -> Verdict:
    return Verdict(False, reason, False, code)


__all__ = ["DESCRIPTIONS", "FITS", "NodeVerdictCode", "Verdict", "busy", "refuse"]
