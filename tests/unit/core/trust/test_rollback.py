"""The rollback floor: the owner's record of the highest verified version holds every profile,
pinned or followed, and the revisions the placement check reads, until the owner lowers it."""

from __future__ import annotations

from typing import Any

import pytest

from inference_policy.trust.rollback import Floor, FloorUnreadable, floor_of
from inference_policy.trust.signing import Reason
from kits.profilekit import Owner
from policy_io.feed import FLOOR, PolicyFeed
from policy_io.snapshot import RefusedRevision

OWNER = Owner()
RECORD = "kamiwaza"


def _admission(spec: dict[str, Any] | None = None, status: Any = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"metadata": {"name": RECORD, "resourceVersion": "7"}}
    if spec is not None:
        doc["spec"] = spec
    if status is not None:
        doc["status"] = status
    return doc


def test_the_floor_is_the_higher_of_the_configured_one_and_the_record() -> None:
    assert floor_of(_admission()).value == 1
    assert floor_of(_admission({"minimumBundleVersion": 3})).value == 3
    # The extender's own setting counts too.
    assert floor_of(_admission({"minimumBundleVersion": 2}), configured=4).value == 4
    recorded = _admission(
        {"minimumBundleVersion": 1}, {"highestVerifiedVersion": 5, "configuredFloor": 1}
    )
    assert floor_of(recorded) == Floor(configured=1, recorded=5)
    assert floor_of(recorded).value == 5


def test_changing_the_configured_floor_resets_the_record() -> None:
    """Lowering (or raising) minimumBundleVersion is how the owner allows a rollback."""
    made_under_three = {"highestVerifiedVersion": 5, "configuredFloor": 3}
    assert floor_of(_admission({"minimumBundleVersion": 3}, made_under_three)).value == 5
    assert floor_of(_admission({"minimumBundleVersion": 2}, made_under_three)).value == 2


@pytest.mark.parametrize(
    ("spec", "status", "where"),
    [
        ({"minimumBundleVersion": "2"}, None, "spec.minimumBundleVersion"),
        ({"minimumBundleVersion": True}, None, "spec.minimumBundleVersion"),
        (None, {"highestVerifiedVersion": -1}, "status.highestVerifiedVersion"),
        (None, [], "status is not an object"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(spec: Any, status: Any, where: str) -> None:
    with pytest.raises(FloorUnreadable, match=where):
        floor_of(_admission(spec, status))


def test_the_record_only_rises() -> None:
    floor = Floor(configured=1, recorded=3)
    assert floor.record(2) is None
    assert floor.record(3) is None
    assert floor.record(4) == {"highestVerifiedVersion": 4, "configuredFloor": 1}


def test_a_refusal_below_a_recorded_floor_says_it_is_a_rollback() -> None:
    refused = Floor(configured=1, recorded=2).refusal(1)
    assert refused is not None and refused.reason is Reason.TARGET
    assert "highest version verified for this tenant" in refused.check
    configured = Floor(configured=2).refusal(1)
    assert configured is not None and configured.check == "version 1 is below the floor 2"
    assert Floor(configured=1, recorded=2).refusal(2) is None


def test_no_profile_is_used_until_the_floor_is_read() -> None:
    feed = PolicyFeed(OWNER.settings(follow_revisions=True), rollback=RECORD)
    feed.revisions_listed({"r1": OWNER.revision(1, "r1", "u1")})
    assert not feed.ready and feed.pending == [FLOOR]
    snapshot = feed.snapshot
    assert snapshot.profile is None and snapshot.profile_refusal is not None
    assert "has not been read" in snapshot.profile_refusal.check
    assert all(isinstance(r, RefusedRevision) for r in snapshot.revisions.values())
    feed.floor_read(_admission({"minimumBundleVersion": 1}))
    assert feed.ready
    assert feed.snapshot.profile is not None and feed.snapshot.profile.version == 1


def test_an_absent_or_forbidden_record_refuses_every_profile() -> None:
    feed = PolicyFeed(OWNER.settings(), rollback=RECORD)
    feed.profile_read(OWNER.sign())
    feed.floor_read(None)
    refusal = feed.snapshot.profile_refusal
    assert refusal is not None and f"TenantAdmission {RECORD!r} was not found" in refusal.check
    feed.floor_read(None, "is forbidden to this server")
    refusal = feed.snapshot.profile_refusal
    assert refusal is not None and "is forbidden to this server" in refusal.check
    feed.floor_read(_admission({}, {"highestVerifiedVersion": "x"}))
    refusal = feed.snapshot.profile_refusal
    assert refusal is not None and "status.highestVerifiedVersion" in refusal.check


def test_a_replayed_older_revision_is_refused_once_the_newer_is_recorded() -> None:
    """The replay path: r2 is deleted and recreated with r1's data. The ConfigMap name is not
    signed, so only the record stops it."""
    feed = PolicyFeed(OWNER.settings(follow_revisions=True), rollback=RECORD)
    feed.floor_read(_admission({"minimumBundleVersion": 1}))
    feed.revisions_listed(
        {"r1": OWNER.revision(1, "r1", "u1"), "r2": OWNER.revision(2, "r2", "u2")}
    )
    assert feed.floor is not None
    profile = feed.snapshot.profile
    assert profile is not None and profile.version == 2
    status = feed.floor.record(profile.version)
    assert status == {"highestVerifiedVersion": 2, "configuredFloor": 1}
    change = feed.floor_read(_admission({"minimumBundleVersion": 1}, status))
    assert change.whole
    # The tenant deletes r2 and r1, and republishes r1's data under r2's name.
    feed.revision_changed("r1", None)
    feed.revision_changed("r2", None)
    feed.revision_changed("r2", OWNER.revision(1, "r2", "u3"))
    snapshot = feed.snapshot
    assert snapshot.profile is None and snapshot.profile_refusal is not None
    assert snapshot.profile_refusal.check.startswith("version 1 is below the floor 2")
    (revision,) = snapshot.revisions.values()
    assert isinstance(revision, RefusedRevision) and revision.configmap == "r2"
    # The owner lowers the floor: the record no longer counts.
    feed.floor_read(_admission({"minimumBundleVersion": 1}, {"highestVerifiedVersion": 2}))
    assert feed.snapshot.profile is not None and feed.snapshot.profile.version == 1


def test_a_pinned_profile_is_held_to_the_floor_too() -> None:
    feed = PolicyFeed(OWNER.settings(), rollback=RECORD)
    feed.floor_read(_admission({}, {"highestVerifiedVersion": 3, "configuredFloor": 1}))
    feed.profile_read(OWNER.sign())
    refusal = feed.snapshot.profile_refusal
    assert feed.snapshot.profile is None and refusal is not None
    assert refusal.reason is Reason.TARGET


def test_a_feed_without_a_record_is_held_to_nothing_more() -> None:
    feed = PolicyFeed(OWNER.settings())
    assert feed.floor is None and FLOOR not in feed.inputs
    assert not feed.floor_read(_admission({"minimumBundleVersion": 9}))
    feed.profile_read(OWNER.sign())
    assert feed.snapshot.profile is not None
