"""Shared pieces of the admission-policy e2e modules: names, the guard's denial prefix, and
whether the webhook plans (a probe the guard may refuse)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from kits.profilekit import NAMESPACE
from localcluster import ApiError
from localcluster.servers.admission_policies import guard_name
from localcluster.servers.webhook import LocalWebhook, is_planned

VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
SCHEDULER = "kamiwaza-inference-scheduler"


def named(pod: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The Pod with a fresh name in the tenant namespace."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"] = f"{prefix}-{uuid.uuid4().hex[:8]}"
    pod["metadata"]["namespace"] = NAMESPACE
    return pod


def guard_prefix(hook: LocalWebhook) -> str:
    """How the API server prefixes the guard policy's denial."""
    name = guard_name(hook.policies)
    return f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: "


def plans(hook: LocalWebhook) -> bool:
    """Does the API server plan an engine Pod through the webhook now?"""
    try:
        return is_planned(hook.probe())
    except ApiError:
        # The guard refuses the probe unplanned (it asks for nothing, but is not shielded).
        return False
