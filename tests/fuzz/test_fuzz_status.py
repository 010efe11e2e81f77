"""Fuzzing Pod status patches as the tenant's namespace admin could send them (`pods/status`
patch, which the seed's installer holds): fields of the status policy's list set, changed or
removed, and conditions of the system's, the owner's and tenants' domains added, changed,
removed and reordered (`tests.fuzz.statuskit`).

No CEL evaluator is installed in this environment, so the status policy's CEL cannot be run
here; what this target holds, for every patch, is the generator and the rule restated from its
text (`statuskit.judge`) to the policy's own tables:

* every field a patch touches is one the policy names (`STATUS_FIELDS`) or `conditions`, and
  every field of that list has values the API server would store (`statuskit.FIELD_VALUES`), so
  a field the policy learns is a field the generator learns;
* for every condition type in the old or the new status, the restated rule and the policy's
  Python twin (`status_cel.tenant_condition_type`) agree whether the tenant may write it;
* the restated rule refuses every patch that changes a field or a condition of the system or
  the owner, and lets through every patch that changes only the tenant's own conditions.

The real policy is held to the same rule by `tests/e2e/admission/test_generated_admission.py`, which
sends a sample of these patches through the API server as the namespace admin. A forgery here
is a patch the rule refuses (counted; nothing here can grant it).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from inference_policy.admission.status_cel import STATUS_FIELDS, tenant_condition_type
from tests.fuzz.fuzzkit import Stats, fuzz_settings, recorded
from tests.fuzz.statuskit import (
    CONDITION_TYPES,
    FIELD_VALUES,
    conditions_of,
    judge,
    merged,
    old_statuses,
    status_patches,
    tenant_type,
)

cases = old_statuses().flatmap(lambda old: st.tuples(st.just(old), status_patches(old)))


def test_the_generator_knows_every_field_the_policy_names() -> None:
    """A field added to the policy's list without values here fails, so that the fuzzer and
    the end-to-end sample learn it the day the policy does."""
    assert set(FIELD_VALUES) == set(STATUS_FIELDS)
    assert "conditions" not in STATUS_FIELDS
    kinds = {tenant_type(kind) for kind in CONDITION_TYPES}
    assert kinds == {True, False}


def test_fuzz_status_patches() -> None:
    with recorded(Stats("status-patches")) as stats:

        @fuzz_settings(300)
        @given(cases)
        def run(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
            old, patch = case
            new = merged(old, patch)
            assert set(patch) <= {*STATUS_FIELDS, "conditions"}, patch
            for condition in conditions_of(old) + conditions_of(new):
                kind = condition["type"]
                assert tenant_type(kind) == tenant_condition_type(kind), kind
            verdict = judge(old, new)
            changed = {
                name
                for name in set(old) | set(new)
                if name != "conditions" and old.get(name) != new.get(name)
            }
            assert {f"status.{name}" for name in changed} == set(verdict.fields)
            locked_before = [c for c in conditions_of(old) if not tenant_type(c["type"])]
            locked_after = [c for c in conditions_of(new) if not tenant_type(c["type"])]
            same = all(c in locked_after for c in locked_before) and all(
                c in locked_before for c in locked_after
            )
            assert same == (not verdict.conditions), (old, new, verdict)
            stats.forgeries_tried += not verdict.allowed
            stats.tried(*sorted({"field-" + name for name in changed}))
            stats.tried(
                *sorted(
                    {
                        "tenant-condition" if tenant_type(c["type"]) else "locked-condition"
                        for c in conditions_of(new)
                        if c not in conditions_of(old)
                    }
                )
            )
            stats.saw("allowed" if verdict.allowed else "refused")

        run()
    assert stats.inputs > 0
    assert stats.outcomes.get("allowed", 0) and stats.outcomes.get("refused", 0), stats.outcomes
