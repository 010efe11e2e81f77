"""What a DRA binding becomes in the cluster: its DeviceClass, the claim templates the owner
publishes in the tenant namespace, and the claim a plan gives the engine container.

Decided here once, for the planner (which template a plan names), the owner's render (which
DeviceClasses and templates exist, `tmi render dra`), the admission policy's parameters (which
templates a claim may have come from) and the allocation controller (which binding an allocated
sub-request stands for).

Names carry a digest of what they stand for, so a revision that changes a binding's facts makes
new objects rather than reusing a name for different hardware (a template's spec is immutable).

Spill: a template lists, after its binding, the bindings a claim may fall back to when the
first is full, as `firstAvailable` sub-requests, so kube-scheduler takes the next when no device
of the first is free. The list is fixed by the profile, not the request, so the owner can
publish it ahead: the DRA bindings where every engine runs the same image (the same
architecture, runtime, RuntimeClass, vendor, compute capability, CUDA driver and accepted
variants) with at least as much usable memory, in the planner's order (smallest usable memory,
stronger isolation, envelope order); for several devices, only those that may span several. A
request that pins a profile or an isolation gets no spill (a fallback could leave either).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from inference_policy.allocation.dra_facts import device_facts, selector_cel
from inference_policy.trust.profile import DraBinding, Envelope, Profile, as_claimed

CLAIM_NAME = "tmi-devices"
DRA_API_VERSION = "resource.k8s.io/v1"
MAX_TEMPLATE_DEVICES = 8
_MAX_ID = 180
Spill = Literal["none", "firstAvailable"]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:10]


def _short(binding_id: str) -> str:
    return binding_id[:_MAX_ID].rstrip(".-")


def device_class_name(binding: DraBinding) -> str:
    """The owner's DeviceClass for this binding: its id and a digest of its selector."""
    return f"tmi-{_short(binding.id)}-{_digest(binding_selector(binding))}"


def binding_selector(binding: DraBinding) -> str:
    """The CEL the binding's DeviceClass selects devices with: every signed fact."""
    facts = device_facts(
        binding.device, binding.accelerator.computeCapability, binding.accelerator.cudaDriverMajor
    )
    return selector_cel(binding.device.driver, facts)


def subrequest_name(index: int) -> str:
    """The `firstAvailable` entry of the template's `index`-th DeviceClass."""
    return f"b{index}"


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """One ResourceClaimTemplate the owner publishes: its name, the classes in order, the count."""

    name: str
    bindings: tuple[DraBinding, ...]
    count: int
    spill: Spill

    @property
    def device_classes(self) -> tuple[str, ...]:
        return tuple(device_class_name(b) for b in self.bindings)

    def claim_spec(self) -> dict[str, Any]:
        """The claim's spec (a template's `spec.spec`, and every claim made from it)."""
        return {
            "devices": {
                "requests": [
                    {
                        "name": CLAIM_NAME,
                        "firstAvailable": [
                            {
                                "name": subrequest_name(i),
                                "deviceClassName": name,
                                "allocationMode": "ExactCount",
                                "count": self.count,
                            }
                            for i, name in enumerate(self.device_classes)
                        ],
                    }
                ]
            }
        }

    def plan_claim(self) -> dict[str, Any]:
        """The plan's `claim` for a Pod given this template."""
        return {
            "name": CLAIM_NAME,
            "template": self.name,
            "deviceClasses": list(self.device_classes),
            "count": self.count,
            "spill": self.spill,
        }


def _preference(binding: DraBinding, order: int) -> tuple[int, int, int]:
    return (binding.usable_memory_bytes, binding.allocation.rank, order)


def _interchangeable(a_profile: Profile, a: DraBinding, b_profile: Profile, b: DraBinding) -> bool:
    # Every engine gets the same image and variant on both: the catalog selects by vendor,
    # architecture, compute capability and CUDA driver, and the profiles accept the same variants.
    return (
        a.architecture == b.architecture
        and a.runtime == b.runtime
        and a.runtimeClassName == b.runtimeClassName
        and a.accelerator.vendor == b.accelerator.vendor
        and a.accelerator.computeCapability == b.accelerator.computeCapability
        and a.accelerator.cudaDriverMajor == b.accelerator.cudaDriverMajor
        and set(a_profile.compatibleVariantIds) == set(b_profile.compatibleVariantIds)
    )


def claimed_bindings(envelope: Envelope) -> list[tuple[Profile, DraBinding]]:
    """The envelope's bindings whose class hands devices out through a claim
    (`AllocationClass.claimed`), with their profiles, in envelope order."""
    return [(p, c) for p, b in envelope.gpu_bindings() if (c := as_claimed(b)) is not None]


def spill_targets(envelope: Envelope, binding: DraBinding, count: int) -> tuple[DraBinding, ...]:
    """The bindings a claim on `binding` for `count` devices may fall back to, in order."""
    ordered = claimed_bindings(envelope)
    rank = {b.id: _preference(b, i) for i, (_, b) in enumerate(ordered)}
    profile = next(p for p, b in ordered if b.id == binding.id)
    targets = [
        b
        for p, b in ordered
        if b.id != binding.id
        and _interchangeable(profile, binding, p, b)
        and rank[b.id] > rank[binding.id]
        and b.usable_memory_bytes >= binding.usable_memory_bytes
        and (count == 1 or (b.allocation.multi_device and "p2p" in b.accelerator.features))
    ]
    return tuple(sorted(targets, key=lambda b: rank[b.id]))


def template_for(envelope: Envelope, binding: DraBinding, count: int, spill: bool) -> ClaimTemplate:
    """The template a plan for `count` devices of `binding` names; `spill` when the request
    lets the claim fall back to the binding's spill targets."""
    targets = spill_targets(envelope, binding, count) if spill else ()
    bindings = (binding, *targets)
    rule: Spill = "firstAvailable" if targets else "none"
    classes = [device_class_name(b) for b in bindings]
    name = f"tmi-{_short(binding.id)}-{count}x-{_digest(rule, str(count), *classes)}"
    return ClaimTemplate(name, bindings, count, rule)


def max_devices(binding: DraBinding) -> int:
    """How many devices one plan on this binding may span."""
    multi = binding.allocation.multi_device and "p2p" in binding.accelerator.features
    return MAX_TEMPLATE_DEVICES if multi else 1


def published_templates(envelope: Envelope) -> list[ClaimTemplate]:
    """Every template a plan under this revision may name, each once."""
    out: dict[str, ClaimTemplate] = {}
    for _, binding in claimed_bindings(envelope):
        for count in range(1, max_devices(binding) + 1):
            for spill in (False, True):
                template = template_for(envelope, binding, count, spill)
                out.setdefault(template.name, template)
    return list(out.values())


def device_class_object(binding: DraBinding) -> dict[str, Any]:
    """The owner's DeviceClass for a DRA binding."""
    return {
        "apiVersion": DRA_API_VERSION,
        "kind": "DeviceClass",
        "metadata": {
            "name": device_class_name(binding),
            "labels": {"app.kubernetes.io/name": "tmi-dra"},
            "annotations": {"tmi.kamiwaza.ai/binding": binding.id},
        },
        "spec": {"selectors": [{"cel": {"expression": binding_selector(binding)}}]},
    }


def template_object(template: ClaimTemplate, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": DRA_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template.name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "tmi-dra"},
        },
        "spec": {"spec": template.claim_spec()},
    }


def template_parameter(template: ClaimTemplate) -> dict[str, Any]:
    """The template as the claims policy's parameter lists it (TenantAdmission)."""
    return {
        "name": template.name,
        "deviceClasses": list(template.device_classes),
        "count": template.count,
    }


def owner_objects(envelope: Envelope) -> dict[str, Any]:
    """What the owner publishes for a tenant under this revision, as the chart's
    `owner.dra.<namespace>` takes it: each DeviceClass (name, binding, selector) and each claim
    template (name, classes, count, the claim's spec), in a stable order."""
    classes = []
    for _, binding in claimed_bindings(envelope):
        classes.append(
            {
                "name": device_class_name(binding),
                "binding": binding.id,
                "selector": binding_selector(binding),
            }
        )
    templates = [
        {**template_parameter(t), "spec": t.claim_spec()} for t in published_templates(envelope)
    ]
    return {"deviceClasses": classes, "claimTemplates": templates}


def binding_of_class(envelope: Envelope, class_name: str) -> DraBinding | None:
    for _, binding in claimed_bindings(envelope):
        if device_class_name(binding) == class_name:
            return binding
    return None


__all__ = [
    "CLAIM_NAME",
    "DRA_API_VERSION",
    "ClaimTemplate",
    "binding_of_class",
    "binding_selector",
    "claimed_bindings",
    "device_class_name",
    "device_class_object",
    "max_devices",
    "owner_objects",
    "published_templates",
    "spill_targets",
    "subrequest_name",
    "template_for",
    "template_object",
    "template_parameter",
]
