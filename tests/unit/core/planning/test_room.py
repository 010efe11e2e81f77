"""Spill across device-plugin bindings: the owner's room figures, the rule that picks a binding
with them, and the replay that checks the recorded choice (`inference_policy.planning.room`)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import orjson
import pytest

from inference_policy.granting.grant import _rederive
from inference_policy.placing.nodes import node_facts
from inference_policy.placing.room_figures import figures_of, figures_with
from inference_policy.planning.plan import PlanChoice, parse_plan
from inference_policy.planning.planner import decide as core_decide
from inference_policy.planning.room import (
    SMALLEST,
    WITH_ROOM,
    RoomError,
    configmap,
    live,
    parse_figures,
    replaying,
)
from inference_policy.trust.profile import parse_envelope
from kits.fleetkit import h100
from kits.profilekit import (
    NOW,
    Owner,
    gpu_binding,
    gpu_profile,
    pinned_request,
    request,
    with_profiles,
)

OWNER = Owner()
SMALL = gpu_binding("small", cc="9.0", memory="39Gi")
LARGE = gpu_binding("large", cc="9.0", memory="79Gi")
ENVELOPE = with_profiles(OWNER, gpu_profile("gpu", "whole-device", [LARGE, SMALL]))


def state() -> Any:
    return OWNER.state(ENVELOPE)


def sha(st: Any) -> str:
    return str(st.profile.sha256)


def figures(st: Any, small: int, large: int, at: Any = NOW) -> Any:
    document = {
        "schemaVersion": 1,
        "bundle": sha(st),
        "observedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "bindings": {
            "small": {"free": small, "largestOnNode": small},
            "large": {"free": large, "largestOnNode": large},
        },
    }
    return parse_figures(json.dumps(document))


def _decide(st: Any, room: Any, document: Any) -> Any:
    return core_decide(document or request(), st.context(NOW)._replace(room=room))


def test_without_figures_in_view_the_plan_is_as_before_and_records_no_choice() -> None:
    st = state()
    body = _decide(st, None, None).body
    assert body["bindingId"] == "small"
    assert "choice" not in body


def test_a_full_smallest_binding_is_passed_over_for_the_next_with_room() -> None:
    st = state()
    body = _decide(st, live(figures(st, 0, 2), sha(st), NOW), None).body
    assert body["bindingId"] == "large"
    assert body["choice"] == {"rule": WITH_ROOM, "passed": ["small"]}
    assert parse_plan(body).choice == PlanChoice(rule=WITH_ROOM, passed=["small"])


def test_room_on_the_smallest_keeps_it() -> None:
    st = state()
    body = _decide(st, live(figures(st, 1, 2), sha(st), NOW), None).body
    assert (body["bindingId"], body["choice"]) == ("small", {"rule": WITH_ROOM, "passed": []})


@pytest.mark.parametrize(
    "room",
    [
        lambda st: live(None, sha(st), NOW),
        lambda st: live(figures(st, 0, 2), "0" * 64, NOW),
        lambda st: live(figures(st, 0, 2, NOW - timedelta(minutes=5)), sha(st), NOW),
        lambda st: live(figures(st, 0, 0), sha(st), NOW),
    ],
    ids=["missing", "another-revision", "stale", "none-with-room"],
)
def test_without_usable_figures_the_smallest_that_fits_is_planned(room: Any) -> None:
    st = state()
    body = _decide(st, room(st), None).body
    assert (body["bindingId"], body["choice"]) == ("small", {"rule": SMALLEST, "passed": []})


def test_a_request_pinning_its_isolation_takes_no_room_choice() -> None:
    st = state()
    document = pinned_request()
    body = _decide(st, live(figures(st, 0, 2), sha(st), NOW), document).body
    assert body["bindingId"] == "small" and "choice" not in body


def _pod(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "creationTimestamp": NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {"kamiwaza.ai/deployment-request": orjson.dumps(request()).decode()},
        }
    }


def test_the_check_replays_the_recorded_choice_and_refuses_a_forged_one() -> None:
    st = state()
    body = _decide(st, live(figures(st, 0, 2), sha(st), NOW), None).body
    plan = parse_plan(body)
    ctx = st.context(NOW)
    assert _rederive(_pod(body), plan, st.profile, ctx, NOW) is None
    forged_unknown = parse_plan({**body, "choice": {"rule": WITH_ROOM, "passed": ["nope"]}})
    verdict = _rederive(_pod(body), forged_unknown, st.profile, ctx, NOW)
    assert verdict is not None and verdict.reason == "PlanMismatch"
    forged_rule = parse_plan({**body, "choice": {"rule": SMALLEST, "passed": ["small"]}})
    verdict = _rederive(_pod(body), forged_rule, st.profile, ctx, NOW)
    assert verdict is not None and verdict.reason == "PlanMismatch"
    # A plan without a choice is checked as before: no replay.
    assert replaying(None) is None


def test_the_figures_count_free_capacity_on_the_hardware_each_binding_vouches_for() -> None:
    st = state()
    envelope = parse_envelope(ENVELOPE)
    nodes = [node_facts(h100("a", gpus=2).manifest()), node_facts(h100("b", gpus=4).manifest())]
    used = {"a": {"nvidia.com/gpu": 2}, "b": {"nvidia.com/gpu": 1}}
    found = figures_of(envelope, sha(st), nodes, lambda n: used.get(n, {}), NOW)
    assert found.bindings["small"].free == 3
    assert found.bindings["small"].largestOnNode == 3
    assert parse_figures(found.text()) == found
    assert configmap("t", found)["data"]["room.json"] == found.text()


def test_the_figures_from_remembered_frees_sum_the_nodes_with_room_and_name_the_largest() -> None:
    st = state()
    envelope = parse_envelope(ENVELOPE)
    asked: list[str] = []

    def frees(demand: Any) -> list[int | None]:
        asked.append(demand.binding.id)
        # A node the binding does not vouch for (None), a full one (0), two with room.
        return [None, 0, 3, 1] if demand.binding.id == "small" else [None, None]

    found = figures_with(envelope, sha(st), frees, NOW)
    assert sorted(asked) == ["large", "small"]
    assert (found.bindings["small"].free, found.bindings["small"].largestOnNode) == (4, 3)
    assert (found.bindings["large"].free, found.bindings["large"].largestOnNode) == (0, 0)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "cannot be read"),
        ('{"schemaVersion": 1}', "is not room figures"),
        (
            '{"schemaVersion":1,"bundle":"' + "0" * 64 + '","observedAt":"yesterday",'
            '"bindings":{}}',
            "observedAt",
        ),
    ],
)
def test_unreadable_figures_say_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(RoomError, match=said):
        parse_figures(text)
