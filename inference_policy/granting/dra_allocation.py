"""A DRA engine Pod's allocation, checked against its binding: the last part of its verdict.

The grant check (`grant`) holds the Pod to its plan; for a `dra` binding the devices are not in
the Pod but in its ResourceClaim's allocation, made by kube-scheduler from the owner's
DeviceClasses. The owner's allocation controller reads that claim and the ResourceSlices the
driver published (cluster-scoped: the tenant cannot read them, the owner's controller can) and
asks here whether each allocated device is one the binding its sub-request stands for vouches
for, fact by fact (`dra_facts.device_mismatch`, the same facts the DeviceClass selects by). A device
allocated any other way (a class edited, a slice republished with other attributes, admin
access) is named with the first fact it lacks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from inference_policy.allocation.dra_facts import device_facts, device_mismatch
from inference_policy.base.codes import CLAIM_UNALLOCATED, DEVICE_MISMATCH
from inference_policy.base.pod_view import ObjectView, PodView, mapping_at
from inference_policy.granting.grant import Verdict, clip
from inference_policy.planning.plan import Plan
from inference_policy.trust.dra_claims import binding_of_class, subrequest_name
from inference_policy.trust.profile import Envelope


def claim_name_of(pod: Mapping[str, Any], plan: Plan) -> str | None:
    """The name of the ResourceClaim made for the plan's claim (the Pod's status says it)."""
    if plan.claim is None:
        return None
    entries = PodView(pod).status.get("resourceClaimStatuses")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and entry.get("name") == plan.claim.name:
            name = entry.get("resourceClaimName")
            return name if isinstance(name, str) and name else None
    return None


def _published(
    slices: Iterable[Mapping[str, Any]], driver: str, pool: str, device: str
) -> Mapping[str, Any] | None:
    # The pool's newest generation is what the driver says now; older slices are stale.
    best: tuple[int, Mapping[str, Any]] | None = None
    for item in slices:
        spec = ObjectView(item).spec
        if spec.get("driver") != driver:
            continue
        pool_of = spec.get("pool")
        if not isinstance(pool_of, Mapping) or pool_of.get("name") != pool:
            continue
        generation = pool_of.get("generation")
        generation = generation if isinstance(generation, int) else 0
        for entry in spec.get("devices") or ():
            fresher = best is None or generation > best[0]
            if isinstance(entry, Mapping) and entry.get("name") == device and fresher:
                best = (generation, entry)
    return best[1] if best else None


def _false(reason: str, message: str) -> Verdict:
    return Verdict("False", reason, clip(message))


def allocation_verdict(
    plan: Plan,
    envelope: Envelope,
    claim: Mapping[str, Any] | None,
    slices: Iterable[Mapping[str, Any]],
) -> Verdict | None:
    """None when every device the claim was allocated is its binding's; else why not."""
    planned = plan.claim
    if planned is None:
        return None
    if claim is None:
        return _false(
            CLAIM_UNALLOCATED,
            f"the Pod's claim {planned.name} has no ResourceClaim; its devices cannot be checked",
        )
    view = ObjectView(claim)
    name = view.name or ""
    allocation = view.status.get("allocation")
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list) or not results:
        return _false(CLAIM_UNALLOCATED, f"ResourceClaim {name} has no allocation result")
    if len(results) != planned.count:
        return _false(
            DEVICE_MISMATCH,
            f"ResourceClaim {name} was allocated {len(results)} devices, the plan grants "
            f"{planned.count}",
        )
    slices = list(slices)
    for result in results:
        where = f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}"
        if result.get("adminAccess"):
            return _false(DEVICE_MISMATCH, f"device {where} was allocated with admin access")
        request = str(result.get("request", ""))
        index = next(
            (
                i
                for i in range(len(planned.deviceClasses))
                if request == f"{planned.name}/{subrequest_name(i)}"
            ),
            None,
        )
        if index is None:
            return _false(
                DEVICE_MISMATCH,
                f"device {where} was allocated for request {request!r}, which is not one of "
                f"the plan's claim {planned.name}",
            )
        class_name = planned.deviceClasses[index]
        binding = binding_of_class(envelope, class_name)
        if binding is None:
            return _false(
                DEVICE_MISMATCH,
                f"device {where} was allocated from DeviceClass {class_name}, which is no "
                "binding of the plan's profile revision",
            )
        device = _published(
            slices, str(result.get("driver")), str(result.get("pool")), str(result.get("device"))
        )
        if device is None:
            return _false(
                DEVICE_MISMATCH,
                f"device {where} is in no ResourceSlice; binding {binding.id}'s facts cannot be "
                "confirmed",
            )
        facts = device_facts(
            binding.device,
            binding.accelerator.computeCapability,
            binding.accelerator.cudaDriverMajor,
        )
        wrong = device_mismatch(binding.device.driver, facts, str(result.get("driver")), device)
        if wrong is not None:
            return _false(DEVICE_MISMATCH, f"device {where} is not binding {binding.id}'s: {wrong}")
    return None


def with_devices(verdict: Verdict, claim: Mapping[str, Any]) -> Verdict:
    """The verified verdict, naming the devices its claim was allocated."""
    allocation = mapping_at(ObjectView(claim).status, "allocation")
    results = mapping_at(allocation, "devices").get("results")
    names = [
        f"{r.get('pool')}/{r.get('device')}"
        for r in (results if isinstance(results, list) else ())
        if isinstance(r, Mapping)
    ]
    message = f"{verdict.message}; its claim holds {', '.join(names)}, as the binding attests"
    return Verdict(verdict.status, verdict.reason, clip(message))


__all__ = ["allocation_verdict", "claim_name_of", "with_devices"]
