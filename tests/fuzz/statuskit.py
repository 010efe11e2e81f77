"""Pod status patches as the tenant's namespace admin could send them, and the status policy's
rule restated from its text for the oracles.

Why it exists: the namespace admin holds `pods/status` patch, and every owner part believes
some of what a Pod's status says (a phase of `Succeeded` frees a GPU in every accounting, a
nominated node reserves room, the AllocationVerified condition is the verdict). The owner's
status policy (`inference_policy.admission.status_cel`) is CEL inside the API server; no CEL
evaluator is installed here, so the fuzz target holds what it generates to the policy's own lists
(`STATUS_FIELDS`, `tenant_condition_type`) and the end-to-end sample
(`tests/e2e/admission/test_generated_admission.py`) sends generated patches through the real API
server.

The rule, as the policy's docstring and `docs/threat-model.md` state it: an identity that is
not the cluster's own (a kubelet, the schedulers, kube-controller-manager, the owner's listed
writers) may change only Pod conditions whose type is qualified by a domain (it has a `/`)
that is not the owner's (`kamiwaza.ai` or a subdomain of it). Every other field of the status,
and every condition of the system (unqualified) or the owner, stays exactly as it was.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from inference_policy.admission.status_cel import STATUS_FIELDS

# Written from the rule's text: the owner's condition-type domains.
OWNER_DOMAIN = "kamiwaza.ai"
SYSTEM_TYPES = (
    "PodScheduled",
    "Ready",
    "ContainersReady",
    "Initialized",
    "DisruptionTarget",
    "PodReadyToStartContainers",
    "PodResizePending",
    "PodResizeInProgress",
)
OWNER_TYPES = (
    "kamiwaza.ai/AllocationVerified",
    "kamiwaza.ai/Anything",
    "tmi.kamiwaza.ai/Anything",
    "kamiwaza.ai/a/b",
    # Subdomains of the owner's are the owner's, whatever it adds later.
    "sub.kamiwaza.ai/Ready",
    "a.b.kamiwaza.ai/Ready",
)
TENANT_TYPES = (
    "example.com/Ready",
    "example.com/Warm",
    "tenant.example/Loaded",
    # On the owner's edge, but another domain: the tenant's to write by the rule.
    "kamiwaza.ai.example.com/Ready",
    "xkamiwaza.ai/Ready",
    "kamiwaza.aix/Ready",
    "example.com/kamiwaza.ai",
)
CONDITION_TYPES = SYSTEM_TYPES + OWNER_TYPES + TENANT_TYPES

_CONTAINER_STATUS = {
    "name": "app",
    "image": "placeholder.invalid/app:1",
    "imageID": "",
    "ready": False,
    "restartCount": 7,
    "state": {"waiting": {"reason": "Forged"}},
}
# For each field of the policy's list, values the API server would store, so that a sample
# sent to it is judged by the policy rather than refused by validation first.
FIELD_VALUES: dict[str, list[Any]] = {
    "observedGeneration": [1, 2],
    "phase": ["Running", "Succeeded", "Failed", "Unknown", "Pending"],
    "message": ["all is well", "forged"],
    "reason": ["Evicted", "Forged"],
    "nominatedNodeName": ["node-a", "elsewhere"],
    "hostIP": ["10.0.0.1", "10.0.0.9"],
    # The first must be `hostIP` (`podIP`); a second, of the other family, makes it dual-stack.
    "hostIPs": [[{"ip": "10.0.0.1"}], [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]],
    "podIP": ["10.1.0.2"],
    "podIPs": [[{"ip": "10.1.0.2"}], [{"ip": "10.1.0.2"}, {"ip": "fd00::2"}]],
    "startTime": ["2026-01-01T00:00:00Z"],
    "initContainerStatuses": [[{**_CONTAINER_STATUS, "name": "init"}]],
    "containerStatuses": [[_CONTAINER_STATUS]],
    "qosClass": ["Guaranteed", "Burstable"],
    "ephemeralContainerStatuses": [[{**_CONTAINER_STATUS, "name": "debug"}]],
    "resize": ["Proposed", "InProgress"],
    "resourceClaimStatuses": [[{"name": "gpu", "resourceClaimName": "forged"}]],
    "extendedResourceClaimStatus": [
        {
            "resourceClaimName": "forged",
            "requestMappings": [
                {"containerName": "app", "resourceName": "nvidia.com/gpu", "requestName": "r"}
            ],
        }
    ],
    "allocatedResources": [{"cpu": "1"}],
    "resources": [{"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}],
    "nodeAllocatableResourceClaimStatuses": [
        [{"resourceClaimName": "forged", "containers": ["app"], "resources": {"cpu": "1"}}]
    ],
}


def tenant_type(kind: Any) -> bool:
    """A condition type the rule leaves to anyone: qualified, by a domain not the owner's."""
    if not isinstance(kind, str):
        return False
    domain, slash, _ = kind.partition("/")
    owned = domain == OWNER_DOMAIN or domain.endswith("." + OWNER_DOMAIN)
    return bool(slash) and not owned


def _absent(value: Any) -> bool:
    # What the API server stores of an empty value: nothing (the fields are omitempty).
    return value is None or value in ("", 0, [], {})


def _stored(value: Any) -> str | None:
    return None if _absent(value) else json.dumps(value, sort_keys=True)


def _canonical(condition: Any) -> str:
    if isinstance(condition, Mapping):
        condition = {k: v for k, v in condition.items() if not _absent(v)}
    return json.dumps(condition, sort_keys=True)


def conditions_of(status: Mapping[str, Any]) -> list[Any]:
    found = status.get("conditions")
    return list(found) if isinstance(found, list) else []


@dataclass(frozen=True)
class Judgement:
    """What the rule says of a change from one status to another, for an untrusted writer."""

    fields: tuple[str, ...]
    conditions: tuple[str, ...]

    @property
    def allowed(self) -> bool:
        return not self.fields and not self.conditions


def judge(old: Mapping[str, Any], new: Mapping[str, Any]) -> Judgement:
    """The rule: every field but `conditions` unchanged, and the conditions of the system and
    of the owner the same set before and after (a tenant's own may come, go or change)."""
    fields = tuple(
        f"status.{name}"
        for name in sorted(set(old) | set(new))
        if name != "conditions" and _stored(old.get(name)) != _stored(new.get(name))
    )

    def locked(status: Mapping[str, Any]) -> dict[str, str]:
        return {
            _canonical(c): str(c.get("type") if isinstance(c, Mapping) else c)
            for c in conditions_of(status)
            if not (isinstance(c, Mapping) and tenant_type(c.get("type")))
        }

    before, after = locked(old), locked(new)
    changed = {
        kind for key, kind in {**before, **after}.items() if (key in before) != (key in after)
    }
    return Judgement(fields, tuple(sorted(changed)))


def merged(status: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with a JSON merge patch of it applied (RFC 7386: a null removes the field, a
    list replaces the whole list)."""
    out = copy.deepcopy(dict(status))
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _condition(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": draw(st.sampled_from(["True", "False", "Unknown"])),
    }
    if draw(st.booleans()):
        condition["reason"] = draw(st.sampled_from(["Forged", "Loaded", "Verified"]))
    if draw(st.booleans()):
        condition["message"] = draw(st.sampled_from(["all is well", "forged"]))
    return condition


@st.composite
def old_statuses(draw: st.DrawFn) -> dict[str, Any]:
    """A status as a Pod might hold it before the patch."""
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "BestEffort"}
    for name in draw(st.lists(st.sampled_from(STATUS_FIELDS), max_size=3, unique=True)):
        status[name] = draw(st.sampled_from(FIELD_VALUES.get(name, ["x"])))
    kinds = draw(st.lists(st.sampled_from(CONDITION_TYPES), max_size=4, unique=True))
    if kinds:
        status["conditions"] = [_condition(draw, kind) for kind in kinds]
    return status


@st.composite
def status_patches(
    draw: st.DrawFn, old: Mapping[str, Any], fields: Sequence[str] = STATUS_FIELDS
) -> dict[str, Any]:
    """A merge patch of `old`: fields of the policy's list set, changed or removed, and the
    conditions added to, changed, removed or reordered, with system, owner and tenant types."""
    patch: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(list(fields)), max_size=2, unique=True)):
        if name in old and draw(st.integers(0, 3)) == 0:
            patch[name] = None
        else:
            patch[name] = copy.deepcopy(draw(st.sampled_from(FIELD_VALUES.get(name, ["x"]))))
    conditions = [copy.deepcopy(c) for c in conditions_of(old)]
    edits = draw(st.lists(st.sampled_from(["add", "change", "remove", "reorder"]), max_size=3))
    for edit in edits:
        if edit == "add" or not conditions:
            kind = draw(st.sampled_from(CONDITION_TYPES))
            conditions = [c for c in conditions if c.get("type") != kind]
            conditions.append(_condition(draw, kind))
        elif edit == "change":
            index = draw(st.integers(0, len(conditions) - 1))
            conditions[index] = _condition(draw, conditions[index]["type"])
        elif edit == "remove":
            del conditions[draw(st.integers(0, len(conditions) - 1))]
        else:
            conditions.reverse()
    if edits:
        patch["conditions"] = conditions
    return patch


__all__ = [
    "CONDITION_TYPES",
    "FIELD_VALUES",
    "Judgement",
    "conditions_of",
    "judge",
    "merged",
    "old_statuses",
    "status_patches",
    "tenant_type",
]
