"""Seeds the fuzz targets grow their inputs from: one signed profile, the requests that plan
onto each of its bindings, and the plans the core makes of them.

Why it exists: random bytes rarely get past a strict JSON decoder, so most inputs start from
something valid (a real request, a real plan, a real planned Pod) and are then bent. Every seed
is made by the real planner from a profile signed by the real signing code.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from inference_policy.planning.plan import Plan
from kits.extenderkit import block, fleet_envelope
from kits.profilekit import EXAMPLES, NOW, Owner, request
from kits.webhookkit import CPU_SECRET, GPU_SECRET, SCHEDULER
from policy_io.snapshot import PolicySnapshot

OWNER = Owner()
# The settings the fuzzed webhook runs with; the oracle plans with the very same.
WEBHOOK_SETTINGS: dict[str, Any] = {
    "gpu_registry_credentials_secret": GPU_SECRET,
    "cpu_registry_credentials_secret": CPU_SECRET,
    "scheduler_name": SCHEDULER,
}
ENVELOPE = fleet_envelope(OWNER)


@cache
def state() -> PolicySnapshot:
    """The core's planning state for the published profile: the `tmi plan` decision."""
    return OWNER.state(ENVELOPE, **WEBHOOK_SETTINGS)


def requests() -> list[dict[str, Any]]:
    found = [
        request(),
        request("vllm"),
        request("diffusion"),
        request("whispercpp"),
        request(config__force_cpu=True),
        request(model__weightsBytes=70_000_000_000),
        *(
            request(inferenceResources=block(profile))
            for profile in ("nvidia-whole", "nvidia-mig-3g40gb", "nvidia-vram-share")
        ),
    ]
    for path in sorted(EXAMPLES.glob("request-*.json")):
        found.append(json.loads(path.read_text()))
    return found


@cache
def plans() -> tuple[Plan, ...]:
    """Every plan the seeds get, one per distinct plan."""
    found: dict[str, Plan] = {}
    for document in requests():
        decision = state().decide(document, NOW)
        if decision.plan is not None:
            found.setdefault(decision.plan.text(), decision.plan)
    return tuple(found.values())


def plan_texts() -> list[str]:
    return [plan.text() for plan in plans()]
