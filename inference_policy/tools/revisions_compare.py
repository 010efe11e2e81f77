"""What a new profile revision changes, and whether a suite of requests is planned as expected.

Two questions an owner asks before publishing a revision, answered offline from the signed
profiles and the core's own planner (the servers' answer, not a second opinion):

* `diff`: which bindings the revision adds, removes or changes (and which of their fields),
  and, for a list of deployment requests, whose plan changes (binding, device count, image or
  resources) or becomes a refusal.
* `run_suite`: a suite of requests, each with what it must get: fields of the plan
  (`bindingId: ...`, `path: cpu`, ...) or of the refusal (`status: 422`, `code: no-fit`),
  each checked as a subset of the decision's body, as `kyverno test` checks policies.

Pure: decisions are made through the `PlanContext` the caller hands in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inference_policy.planning.planner import GpuOptions, PlanContext, decide
from inference_policy.trust.profile import Envelope

Change = Literal["added", "removed", "changed"]
# What tells two plans apart for a person: where it runs and what it gets.
_PLAN_FIELDS = ("status", "path", "bindingId", "deviceCount", "image", "resources", "code")


@dataclass(frozen=True, slots=True)
class BindingChange:
    profile: str
    binding: str
    change: Change
    # For "changed": the dotted paths whose values differ.
    fields: tuple[str, ...] = ()

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "profile": self.profile,
            "binding": self.binding,
            "change": self.change,
        }
        if self.fields:
            body["fields"] = list(self.fields)
        return body


def _bindings(envelope: Envelope) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        binding.id: (profile.name, binding.model_dump(mode="json", exclude_none=True))
        for profile in envelope.profiles
        for binding in profile.bindings
    }


def _differing(old: Any, new: Any, where: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for key in sorted(set(old) | set(new)):
            found += _differing(old.get(key), new.get(key), f"{where}.{key}" if where else key)
        return found
    return [] if old == new else [where or "(whole)"]


def binding_changes(old: Envelope, new: Envelope) -> list[BindingChange]:
    """Each binding added, removed or changed (with its differing fields), by binding id, in
    the order of the new revision, then the removed ones in the old one's."""
    before, after = _bindings(old), _bindings(new)
    changes: list[BindingChange] = []
    for binding_id, (profile, body) in after.items():
        if binding_id not in before:
            changes.append(BindingChange(profile, binding_id, "added"))
            continue
        old_profile, old_body = before[binding_id]
        fields = _differing(old_body, body)
        if old_profile != profile:
            fields.insert(0, "profile")
        if fields:
            changes.append(BindingChange(profile, binding_id, "changed", tuple(fields)))
    for binding_id, (profile, _) in before.items():
        if binding_id not in after:
            changes.append(BindingChange(profile, binding_id, "removed"))
    return changes


def outcome(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a decision's body a person compares: where, what, or why not."""
    return {key: body[key] for key in _PLAN_FIELDS if key in body}


def plan_changes(
    requests: Sequence[tuple[str, Any]],
    old: PlanContext,
    new: PlanContext,
    old_options: GpuOptions | None = None,
    new_options: GpuOptions | None = None,
) -> list[dict[str, Any]]:
    """Each named request whose decision differs between the two revisions (each decided with
    its own GPU options table, if any: `planner.decide`)."""
    changed: list[dict[str, Any]] = []
    for name, request in requests:
        before = outcome(decide(request, old, old_options).body)
        after = outcome(decide(request, new, new_options).body)
        if before != after:
            changed.append({"name": name, "before": before, "after": after})
    return changed


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    passed: bool
    # Each expected field that the decision does not match: (field, expected, got).
    mismatches: tuple[tuple[str, Any, Any], ...]
    got: Mapping[str, Any]

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "passed": self.passed, "got": dict(self.got)}
        if self.mismatches:
            body["mismatches"] = [
                {"field": f, "expected": e, "got": g} for f, e, g in self.mismatches
            ]
        return body


def _missing(expected: Any, got: Any, where: str) -> list[tuple[str, Any, Any]]:
    """Where `expected` is not a subset of `got` (mappings by key, everything else equal)."""
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            return [(where, dict(expected), got)]
        found: list[tuple[str, Any, Any]] = []
        for key, value in expected.items():
            at = f"{where}.{key}" if where else str(key)
            if key not in got:
                found.append((at, value, None))
            else:
                found += _missing(value, got[key], at)
        return found
    return [] if expected == got else [(where, expected, got)]


def run_case(
    name: str,
    request: Any,
    expect: Mapping[str, Any],
    ctx: PlanContext,
    options: GpuOptions | None = None,
) -> CaseResult:
    body = decide(request, ctx, options).body
    mismatches = tuple(_missing(expect, body, ""))
    return CaseResult(name, not mismatches, mismatches, outcome(body))


__all__ = [
    "BindingChange",
    "CaseResult",
    "binding_changes",
    "outcome",
    "plan_changes",
    "run_case",
]
