"""A profile ConfigMap read from the API is verified once per revision (uid + resourceVersion)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from policy_io.catalog import packaged_catalog
from policy_io.state import PolicyState, revision_of
from tests.profilekit import NOW, Owner

OWNER = Owner()


@pytest.mark.parametrize(
    ("metadata", "revision"),
    [
        ({"uid": "u-1", "resourceVersion": "7"}, "u-1/7"),
        ({"uid": "u-1"}, None),
        ({"uid": "", "resourceVersion": "7"}, None),
        ({"uid": "u-1", "resourceVersion": 7}, None),
        ("not an object", None),
        (None, None),
    ],
)
def test_revision_is_the_uid_and_resource_version(metadata: Any, revision: str | None) -> None:
    assert revision_of({"metadata": metadata}) == revision


def _read(uid: str | None, version: str) -> dict[str, Any]:
    configmap = OWNER.sign()
    if uid is not None:
        configmap["metadata"].update({"uid": uid, "resourceVersion": version})
    return configmap


def test_a_revision_is_verified_once_and_a_new_one_again() -> None:
    state = PolicyState(OWNER.settings(), packaged_catalog())
    assert state.read_profile(_read("u-1", "7"), NOW) is True
    assert state.profile is not None and state.profile_refusal is None
    assert state.read_profile(_read("u-1", "7"), NOW) is False
    assert state.verifications == 1
    assert state.read_profile(_read("u-1", "8"), NOW) is True
    assert state.read_profile(_read("u-2", "8"), NOW) is True
    assert state.verifications == 3


def test_a_configmap_without_a_revision_is_verified_every_time() -> None:
    state = PolicyState(OWNER.settings(), packaged_catalog())
    assert state.read_profile(_read(None, ""), NOW) is True
    assert state.read_profile(_read(None, ""), NOW) is True
    assert state.verifications == 2


# -- following the newest revision ---------------------------------------------------------------


def _revision(owner: Owner, version: int, name: str, uid: str) -> dict[str, Any]:
    envelope = owner.envelope()
    envelope["version"] = version
    configmap = owner.sign(envelope, name=name)
    configmap["metadata"].update({"uid": uid, "resourceVersion": "1"})
    return configmap


def test_following_picks_the_newest_verified_revision() -> None:
    state = PolicyState(OWNER.settings(follow_revisions=True), packaged_catalog())
    assert state.follow_list({"r1": _revision(OWNER, 1, "r1", "u1")}) is True
    assert state.profile is not None and state.profile.version == 1
    assert state.follow("r2", _revision(OWNER, 2, "r2", "u2")) is True
    assert state.profile is not None and state.profile.version == 2
    assert state.profile.configmap_name == "r2"
    # An older one published later changes nothing; re-reading a revision verifies nothing.
    verifications = state.verifications
    assert state.follow("r0", _revision(OWNER, 1, "r0", "u0")) is True
    assert state.profile.version == 2
    assert state.follow("r2", _revision(OWNER, 2, "r2", "u2")) is False
    assert state.verifications == verifications + 1
    # The newest goes: back to the newest left.
    state.follow("r2", None)
    assert state.profile is not None and state.profile.configmap_name in ("r1", "r0")


def test_a_higher_version_signed_by_a_stranger_is_not_followed() -> None:
    state = PolicyState(OWNER.settings(follow_revisions=True), packaged_catalog())
    state.follow("r1", _revision(OWNER, 1, "r1", "u1"))
    state.follow("r9", _revision(Owner(), 9, "r9", "u9"))
    assert state.profile is not None and state.profile.version == 1
    # With only the stranger's left, its refusal is what a request is told.
    state.follow("r1", None)
    assert state.profile is None
    assert state.profile_refusal is not None
    assert "does not trust" in state.profile_refusal.authorization_message


def test_following_nothing_is_a_profile_that_did_not_arrive() -> None:
    state = PolicyState(OWNER.settings(follow_revisions=True), packaged_catalog())
    state.follow_list({})
    assert state.profile is None and state.profile_refusal is not None
    assert "did not arrive" in state.profile_refusal.authorization_message
    assert "kamiwaza.ai/inference-profile=true" in state.profile_refusal.check


class _Unreadable(Mapping[str, Any]):
    """A ConfigMap whose every read fails: a follow step that raises, injected through its input
    rather than by patching a method, so the step really fails wherever it reads the ConfigMap."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        raise RuntimeError("boom")


def test_a_follow_step_that_fails_is_a_profile_that_did_not_arrive() -> None:
    # Every server calls these from a watch callback, so they must refuse rather than raise.
    state = PolicyState(OWNER.settings(follow_revisions=True), packaged_catalog())
    assert state.follow_list({"r1": _revision(OWNER, 1, "r1", "u1")}) is True
    assert state.follow("r2", _Unreadable()) is True
    assert state.profile is None and state.profile_refusal is not None
    assert state.profile_refusal.check == "the signed profile ConfigMaps could not be read"
    state.follow_list({})
    assert state.follow_list({"r2": _Unreadable()}) is True
    assert state.profile is None and state.profile_refusal is not None
    assert state.profile_refusal.check == "the signed profile ConfigMaps could not be read"
