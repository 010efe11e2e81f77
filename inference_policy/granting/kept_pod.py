"""What the allocation controller keeps of an engine Pod: all of it, up to a size.

The controller follows every Pod of its tenant namespace that carries the engine label, and the
tenant's namespace admin chooses how many such Pods there are and how large each one is: an
engine-labelled Pod that holds no grant passes admission without a plan, and its annotations,
environment and containers may fill what the API server stores of an object. Kept whole, a
few thousand of them would take the controller past its memory limit. A genuine engine Pod
is a few KiB (4.75 KB each at 150,000), so one larger than `MAX_KEPT_POD_BYTES` is kept as a
skeleton: its identity, the engine label, its node and the conditions the controller writes.
The controller cannot check a Pod it did not keep, so the verdict for a skeleton is False,
naming the size (`grant.evaluate`). Memory per tenant is then at most the number of its
engine Pods times this cap; the number is the owner's to bound with a ResourceQuota on Pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ALLOCATION_VERIFIED, ENGINE_LABEL
from inference_policy.placing.ledger import accounted_pod

MAX_KEPT_POD_BYTES = 128 * 1024
_CONDITIONS = (ALLOCATION_VERIFIED, "PodScheduled")


class Skeleton(dict[str, Any]):
    """What is kept of a Pod past the cap; `size` is what the Pod was, encoded. A type of its
    own rather than a key in it, so nothing the tenant writes can read as one."""

    size: int = 0
    # What the Pod held on its node when it was cut (`ledger.accounted_pod`: node and requests,
    # None for none), since the skeleton keeps no containers to read it from: a Pod's size does
    # not hide its share from whoever keeps tenants' shares apart from the kept Pods.
    held: tuple[str, dict[str, int]] | None = None


def kept_pod(pod: dict[str, Any], size: int) -> dict[str, Any]:
    """`pod` itself when its encoded `size` is within the cap, else its skeleton."""
    if size <= MAX_KEPT_POD_BYTES:
        return pod
    view = PodView(pod)
    metadata, labels, spec, status = view.metadata, view.labels, view.spec, view.status
    kept_metadata: dict[str, Any] = {
        key: metadata[key]
        for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        if key in metadata
    }
    if "deletionTimestamp" in metadata:
        kept_metadata["deletionTimestamp"] = metadata["deletionTimestamp"]
    if ENGINE_LABEL in labels:
        kept_metadata["labels"] = {ENGINE_LABEL: labels[ENGINE_LABEL]}
    skeleton = Skeleton(
        {
            "metadata": kept_metadata,
            "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
            "status": {
                "conditions": [c for c in view.conditions if c.get("type") in _CONDITIONS],
                **({"phase": status["phase"]} if "phase" in status else {}),
            },
        }
    )
    skeleton.size = size
    skeleton.held = accounted_pod(pod)
    return skeleton


def too_large(pod: Mapping[str, Any]) -> int | None:
    """The size of the Pod this skeleton stands for, or None for a Pod kept whole."""
    return pod.size if isinstance(pod, Skeleton) else None


__all__ = ["MAX_KEPT_POD_BYTES", "Skeleton", "kept_pod", "too_large"]
