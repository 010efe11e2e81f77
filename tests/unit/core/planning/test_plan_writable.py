"""A plan the one plan parser accepts can always be written back as text.

Found by the plan-annotation fuzz target (`tests/fuzz`): `parse_plan` accepted an annotation
whose `bundle.version` was 2**64, and the Plan it returned then raised `StrictJSONError` from
`text()`, outside the `PlanError` every reader handles. The bundle version is now bounded as
the profile bounds its version, and any number no encoder can write makes the text no plan.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from inference_policy.planning.plan import PlanError, parse_plan
from tests.fuzz import corpus


def _gpu_plan() -> dict[str, Any]:
    wire = next(p for p in corpus.plans() if p.path == "gpu").wire()
    return cast(dict[str, Any], json.loads(json.dumps(wire)))


@pytest.mark.parametrize("version", [2**64, 2**53])
def test_a_bundle_version_past_the_profiles_bound_is_no_plan(version: int) -> None:
    plan = _gpu_plan()
    plan["bundle"]["version"] = version
    with pytest.raises(PlanError, match="bundle"):
        parse_plan(json.dumps(plan))


def test_a_number_no_encoder_can_write_is_no_plan() -> None:
    plan = _gpu_plan()
    plan["engineArgs"] = {"ctx_size": 2**64}
    with pytest.raises(PlanError, match="cannot be written back"):
        parse_plan(json.dumps(plan))
    with pytest.raises(PlanError, match="cannot be written back"):
        parse_plan(plan)


def test_every_plan_read_is_written_back_to_the_same_text() -> None:
    for made in corpus.plans():
        assert parse_plan(made.text()).text() == made.text()
