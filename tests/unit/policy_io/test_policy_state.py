"""A profile ConfigMap read from the API is verified once per revision (uid + resourceVersion).

Then the policy feed every server reads through (`policy_io.feed`): following the newest signed
revision, a refused list, recipe catalogs missing or refused, each step's change, and a step
that fails, which must become a refusal rather than an exception in a watch callback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from inference_policy.planning.recipe_inputs import CatalogUnavailable, Cause
from inference_policy.planning.recipes import RecipeCatalog, render_catalog
from kits.profilekit import NOW, Owner
from policy_io.catalog import packaged_catalog
from policy_io.feed import PolicyFeed
from policy_io.state import PolicyState, revision_of

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


def test_following_picks_the_newest_verified_revision() -> None:
    feed = PolicyFeed(OWNER.settings(follow_revisions=True))
    state = feed.state
    assert feed.revisions_listed({"r1": OWNER.revision(1, "r1", "u1")})
    assert state.profile is not None and state.profile.version == 1
    assert feed.revision_changed("r2", OWNER.revision(2, "r2", "u2"))
    assert state.profile is not None and state.profile.version == 2
    assert state.profile.configmap_name == "r2"
    # An older one published later changes nothing; re-reading a revision verifies nothing.
    verifications = state.verifications
    assert feed.revision_changed("r0", OWNER.revision(1, "r0", "u0"))
    assert state.profile.version == 2
    assert not feed.revision_changed("r2", OWNER.revision(2, "r2", "u2"))
    assert state.verifications == verifications + 1
    # The newest goes: back to the newest left.
    feed.revision_changed("r2", None)
    assert state.profile is not None and state.profile.configmap_name in ("r1", "r0")


def test_a_higher_version_signed_by_a_stranger_is_not_followed() -> None:
    feed = PolicyFeed(OWNER.settings(follow_revisions=True))
    state = feed.state
    feed.revision_changed("r1", OWNER.revision(1, "r1", "u1"))
    feed.revision_changed("r9", Owner().revision(9, "r9", "u9"))
    assert state.profile is not None and state.profile.version == 1
    # With only the stranger's left, its refusal is what a request is told.
    feed.revision_changed("r1", None)
    assert state.profile is None
    assert state.profile_refusal is not None
    assert "does not trust" in state.profile_refusal.authorization_message


def test_following_nothing_is_a_profile_that_did_not_arrive() -> None:
    feed = PolicyFeed(OWNER.settings(follow_revisions=True))
    state = feed.state
    feed.revisions_listed({})
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
    feed = PolicyFeed(OWNER.settings(follow_revisions=True))
    state = feed.state
    assert feed.revisions_listed({"r1": OWNER.revision(1, "r1", "u1")})
    assert feed.revision_changed("r2", _Unreadable())
    assert state.profile is None and state.profile_refusal is not None
    assert state.profile_refusal.check == "the signed profile ConfigMaps could not be read"
    feed.revisions_listed({})
    assert feed.revisions_listed({"r2": _Unreadable()})
    assert state.profile is None and state.profile_refusal is not None
    assert state.profile_refusal.check == "the signed profile ConfigMaps could not be read"


# -- a refused list, and the recipe catalogs -----------------------------------------------------


def test_a_refused_list_forgets_the_revisions_and_says_why_until_a_list_succeeds() -> None:
    feed = PolicyFeed(OWNER.settings(), follow=True)
    assert not feed.ready
    listed = feed.revisions_listed({"r1": OWNER.revision(1, "r1", "u1")})
    [digest] = listed.digests
    assert feed.ready and set(feed.snapshot.revisions) == {digest}
    refused = feed.revisions_refused("may not be read (HTTP 403; check the Role)")
    assert refused.whole and refused.digests == {digest}
    snapshot = feed.snapshot
    assert snapshot.revisions == {} and snapshot.profile is None
    assert snapshot.profiles_unreadable is not None
    assert snapshot.profiles_unreadable.endswith("may not be read (HTTP 403; check the Role)")
    assert snapshot.profile_refusal is not None
    assert snapshot.profile_refusal.check == snapshot.profiles_unreadable
    # The same refusal again is no news; a list that succeeds brings everything back.
    assert not feed.revisions_refused("may not be read (HTTP 403; check the Role)")
    back = feed.revisions_listed({"r1": OWNER.revision(1, "r1", "u1")})
    assert back.whole and back.digests == {digest}
    assert feed.snapshot.profiles_unreadable is None and feed.snapshot.profile is not None


def _catalog(capability: str = "gpu") -> dict[str, Any]:
    document = {"schemaVersion": 1, "capability": capability, "recipes": []}
    configmap = render_catalog(document, OWNER.settings().namespace, capability).configmap
    configmap["metadata"].update({"uid": "c-1", "resourceVersion": "3"})
    return configmap


def test_a_configured_catalog_is_unread_then_absent_refused_or_loaded_once() -> None:
    name = _catalog()["metadata"]["name"]
    feed = PolicyFeed(OWNER.settings(gpu_recipe_catalog_configmap=name))
    assert feed.names == [OWNER.settings().bundle_configmap, name]
    unread = feed.snapshot.gpu_recipes
    assert isinstance(unread, CatalogUnavailable) and unread.cause is Cause.UNREAD
    assert unread.refusal == (
        "recipe catalog: gpu recipe catalog did not arrive from the configured ConfigMap: "
        "it has not been read yet"
    )
    assert feed.read(name, None).whole
    absent = feed.snapshot.gpu_recipes
    assert isinstance(absent, CatalogUnavailable) and absent.cause is Cause.ABSENT
    assert absent.problem == f"the gpu recipe catalog ConfigMap {name} does not exist"
    # Read again as absent: the same input, so no new generation.
    generation = feed.generation
    assert not feed.read(name, None) and feed.generation == generation
    feed.catalog_read("gpu", None, "may not be read (HTTP 403; check the Role)")
    refused = feed.snapshot.gpu_recipes
    assert isinstance(refused, CatalogUnavailable) and refused.refusal.endswith(
        f"ConfigMap {name!r} may not be read (HTTP 403; check the Role) in namespace "
        f"{OWNER.settings().namespace!r}"
    )
    assert feed.catalog_read("gpu", _catalog()).whole
    assert isinstance(feed.snapshot.gpu_recipes, RecipeCatalog) and feed.catalog_loads == 1
    assert not feed.catalog_read("gpu", _catalog()) and feed.catalog_loads == 1


def test_the_planner_refuses_while_a_configured_catalog_is_unusable() -> None:
    from kits.profilekit import request

    name = _catalog()["metadata"]["name"]
    feed = PolicyFeed(OWNER.settings(gpu_recipe_catalog_configmap=name))
    feed.profile_read(OWNER.sign())
    feed.catalog_read("gpu", {"metadata": {"name": name}, "data": {}})
    decision = feed.snapshot.decide(request(), NOW)
    assert (decision.status, decision.code) == (503, "catalog-unavailable")
    assert decision.detail.startswith("recipe catalog: gpu recipe catalog did not arrive from ")
    feed.catalog_read("gpu", _catalog())
    assert feed.snapshot.decide(request(), NOW).allowed
