"""The seed's rules for writing a profile that verification does not hold a signed profile to.

A verified profile is what the servers plan with, and refusing one that an owner signed last
month would stop a running cluster; these rules are the seed's instructions to the owner
writing the next one, so `tmi sign` refuses to sign a profile that breaks them, naming the
binding and the rule. The seed: "Drop p2p and nvlink from a MIG or VRAM-share binding: a slice
has neither." A binding whose class keeps a plan to one device (`AllocationClass.single_device`:
MIG slices, accounted VRAM shares) has no peer path to attest; the planner never spans it
anyway, so the feature can only mislead whoever reads the profile.

Pure: a function of the parsed envelope.
"""

from __future__ import annotations

from inference_policy.trust.profile import Envelope

SLICE_FREE_FEATURES = ("p2p", "nvlink")


def signing_violations(envelope: Envelope) -> list[str]:
    """Each place `envelope` breaks a seed rule for writing profiles, as a message naming the
    binding, what it attests and what to change; empty when it breaks none."""
    found: list[str] = []
    for profile, binding in envelope.gpu_bindings():
        allocation = binding.allocation
        if allocation.multi_device:
            continue
        attested = [f for f in SLICE_FREE_FEATURES if f in binding.accelerator.features]
        if attested:
            found.append(
                f"profile {profile.name} binding {binding.id} ({allocation.guarantee}) attests "
                f"{' and '.join(attested)}, which a slice does not have; drop "
                f"{'them' if len(attested) > 1 else 'it'} from accelerator.features (the seed: "
                "drop p2p and nvlink from a MIG or VRAM-share binding)"
            )
    return found


__all__ = ["SLICE_FREE_FEATURES", "signing_violations"]
