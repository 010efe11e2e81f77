"""A profile ConfigMap read from the API is verified once per revision (uid + resourceVersion)."""

from __future__ import annotations

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
