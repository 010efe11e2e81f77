"""What tenant data may cost (`policy_io.caps`): a refused revision kept as its reason alone, the
size and count caps on the signed profile ConfigMaps a server follows, what an informer keeps of
each, and the settings that set the caps.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
from typing import Any

import pytest

from allocation_controller.config import settings_from_args as controller_settings
from extender.config import settings_from_args as extender_settings
from inference_policy.trust.signing import (
    BUNDLE_KEY,
    DIGEST_KEY,
    MAX_CHECK_CHARS,
    ProfileRefused,
    Reason,
    RefusalRecord,
    VerifiedProfile,
)
from kits.profilekit import NOW, Owner
from policy_io import caps
from policy_io.feed import PolicyFeed
from policy_io.snapshot import RefusedRevision
from policy_io.state import PolicyState, ProfileRevisions, verify_revision
from serving.settings import ConfigError
from webhook.config import settings_from_args

OWNER = Owner()
TLS = ["--cert", "c.pem", "--key", "k.pem", "--namespace", "kamiwaza"]


def junk(
    name: str, uid: str, size: int, *, version: str = "1", digest: bool = True
) -> dict[str, Any]:
    """A labelled ConfigMap as the tenant may write one: a bundle whose payloadType is `size`
    characters of junk, with its true sha256, so the refusal's check quotes the junk."""
    bundle = json.dumps(
        {"payloadType": "x" * size, "payload": "", "signatures": []}, separators=(",", ":")
    )
    data = {BUNDLE_KEY: bundle}
    if digest:
        data[DIGEST_KEY] = hashlib.sha256(bundle.encode()).hexdigest()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "kamiwaza",
            "uid": uid,
            "resourceVersion": version,
            "labels": {"kamiwaza.ai/inference-profile": "true"},
            "annotations": {"junk": "y" * 1000},
        },
        "immutable": True,
        "data": data,
    }


# -- a refused revision keeps its reason -------------------------------------------------------


def test_a_refused_revision_keeps_its_reason_not_the_exception_nor_the_data() -> None:
    result = verify_revision("junk", junk("junk", "u1", 200_000), OWNER.policy(), None)
    assert isinstance(result, RefusalRecord)
    assert not isinstance(result, BaseException)
    assert not hasattr(result, "__traceback__") and not hasattr(result, "__dict__")
    assert result.reason is Reason.ARRIVAL and result.check.startswith("payloadType 'xxx")
    assert len(result.check) == MAX_CHECK_CHARS
    assert result.authorization_message == ProfileRefused(Reason.ARRIVAL, "").authorization_message
    assert sys.getsizeof(result.check) < 2 * MAX_CHECK_CHARS + 128
    assert len(pickle.dumps(result)) < 1024


def test_every_place_that_keeps_a_refusal_keeps_a_record_or_an_exception_never_raised() -> None:
    feed = PolicyFeed(OWNER.settings(), follow=True)
    feed.revisions_listed({"junk": junk("junk", "u1", 100_000)})
    [(name, kept)] = feed.state.followed.refused()
    assert name == "junk" and isinstance(kept, RefusalRecord)
    [revision] = feed.snapshot.revisions.values()
    assert isinstance(revision, RefusedRevision) and isinstance(revision.refusal, RefusalRecord)
    told = feed.snapshot.profile_refusal
    assert told is not None and told.check == kept.check
    # What requests are told is an exception (the planner's type), made and never raised.
    assert told.__traceback__ is None and told.__context__ is None and told.__cause__ is None
    assert len(pickle.dumps(told)) < 2048
    # The pinned profile, read by name, the same.
    state = PolicyState(OWNER.settings(), feed.state.base_catalog)
    pinned = junk(OWNER.settings().bundle_configmap, "u2", 100_000)
    state.read_profile(pinned, NOW)
    refusal = state.profile_refusal
    assert refusal is not None and refusal.__traceback__ is None and refusal.__context__ is None
    assert len(refusal.check) <= MAX_CHECK_CHARS


def test_an_unchanged_refusal_is_the_same_input_to_the_feed() -> None:
    feed = PolicyFeed(OWNER.settings(), follow=True)
    feed.revisions_listed({"junk": junk("junk", "u1", 10)})
    told = feed.snapshot.profile_refusal
    # Another ConfigMap refused for the same check: what requests are told is the very same.
    feed.revision_changed("zz-other", junk("zz-other", "u2", 10))
    assert feed.snapshot.profile_refusal is told
    feed.revision_changed("zz-other", junk("zz-other", "u2", 11, version="2"))
    now = feed.snapshot.profile_refusal
    assert now is not told and now is not None and "x" * 11 in now.check


# -- the size cap ----------------------------------------------------------------------------------


def test_a_configmap_over_the_size_cap_is_refused_unread() -> None:
    revisions = ProfileRevisions("kamiwaza", max_revisions=4, max_bytes=16 * 1024)
    big = junk("big", "u1", 20_000)
    assert revisions.apply("big", big, OWNER.policy())
    assert revisions.verifications == 0
    [(_, refusal)] = revisions.refused()
    assert refusal.check == (
        f"ConfigMap 'big' carries {caps.data_bytes(big)} bytes of data, over the cap of 16384 "
        "bytes on a profile revision (--max-profile-revision-bytes); it was not read"
    )
    assert refusal.authorization_message.endswith(
        "bundle did not arrive from the configured ConfigMap"
    )
    assert revisions.refused_total == {caps.TOO_LARGE: 1, caps.TOO_MANY: 0, caps.UNVERIFIED: 0}
    [notice] = revisions.take_notices()
    assert (notice.name, notice.uid, notice.resource_version, notice.reason) == (
        "big",
        "u1",
        "1",
        caps.TOO_LARGE,
    )
    assert notice.message == refusal.check and revisions.take_notices() == []
    # The same revision read again is not judged again; a new one is.
    assert not revisions.apply("big", big, OWNER.policy())
    assert revisions.apply("big", junk("big", "u1", 20_000, version="2"), OWNER.policy())
    assert revisions.refused_total[caps.TOO_LARGE] == 2


def test_the_size_counts_every_key_and_value_of_data_and_binary_data() -> None:
    configmap = {"data": {"a": "xy", "é": "é"}, "binaryData": {"b": "QUJD"}}
    assert caps.data_bytes(configmap) == 1 + 2 + 2 + 2 + 1 + 4
    assert caps.data_bytes({"data": "not a map"}) == 0
    assert caps.data_bytes({caps.SIZE_MARK: 5_000_000}) == 5_000_000


def test_a_pinned_profile_over_the_size_cap_is_refused_unread() -> None:
    state = PolicyState(
        OWNER.settings(max_revision_bytes=8192), PolicyFeed(OWNER.settings()).state.base_catalog
    )
    signed = OWNER.sign()
    signed["metadata"].update({"uid": "u1", "resourceVersion": "1"})
    signed["data"]["padding"] = "p" * 8192
    state.read_profile(signed, NOW)
    assert state.profile is None and state.profile_refusal is not None
    assert "over the cap of 8192 bytes" in state.profile_refusal.check
    assert state.followed.refused_total[caps.TOO_LARGE] == 1
    del signed["data"]["padding"]
    signed["metadata"]["resourceVersion"] = "2"
    state.read_profile(signed, NOW)
    assert state.profile is not None


# -- the count cap ---------------------------------------------------------------------------------


def test_junk_never_fills_the_count_cap_nor_displaces_a_verified_revision() -> None:
    feed = PolicyFeed(OWNER.settings(max_profile_revisions=2), follow=True)
    for index in range(20):
        feed.revision_changed(f"a-junk-{index}", junk(f"a-junk-{index}", f"j{index}", 100))
    # The owner's revision published after twenty refused ones is verified and followed.
    feed.revision_changed("r1", OWNER.revision(1, "r1", "u1"))
    assert feed.snapshot.profile is not None and feed.snapshot.profile.configmap_name == "r1"
    for index in range(20, 40):
        feed.revision_changed(f"z-junk-{index}", junk(f"z-junk-{index}", f"j{index}", 100))
    assert feed.snapshot.profile is not None and feed.snapshot.profile.configmap_name == "r1"
    assert feed.state.followed.refused_total[caps.UNVERIFIED] == 40
    assert feed.state.followed.refused_total[caps.TOO_MANY] == 0


def test_past_the_count_cap_the_newest_are_kept_and_copies_are_refused_unverified() -> None:
    feed = PolicyFeed(OWNER.settings(max_profile_revisions=2), follow=True)
    feed.revisions_listed(
        {"r2": OWNER.revision(2, "r2", "u2"), "r3": OWNER.revision(3, "r3", "u3")}
    )
    # An older revision put back is verified, and not kept: the newest two are.
    feed.revision_changed("r1", OWNER.revision(1, "r1", "u1"))
    assert feed.snapshot.profile is not None and feed.snapshot.profile.version == 3
    [(name, refusal)] = feed.state.followed.refused()
    assert name == "r1"
    assert refusal.check == (
        "ConfigMap 'r1' was not kept: namespace 'kamiwaza' holds more than 2 signed profile "
        "revisions, the cap (--max-profile-revisions), and the newest are kept"
    )
    assert feed.state.followed.refused_total[caps.TOO_MANY] == 1
    [notice] = feed.state.followed.take_notices()
    assert (notice.name, notice.uid, notice.reason) == ("r1", "u1", caps.TOO_MANY)
    # Its digest is known, so a Pod planned with it is told why.
    digest = OWNER.revision(1, "r1", "u1")["data"][DIGEST_KEY]
    found = feed.snapshot.revisions[digest]
    assert isinstance(found, RefusedRevision) and found.refusal is refusal
    # A copy of a kept revision is refused without being verified.
    verifications = feed.verifications
    copy = OWNER.sign(OWNER.envelope(version=3), name="a-copy")
    copy["metadata"].update({"uid": "c1", "resourceVersion": "1"})
    feed.revision_changed("a-copy", copy)
    assert feed.verifications == verifications
    assert feed.state.followed.refused_total[caps.TOO_MANY] == 2
    # A newer revision displaces the oldest kept one.
    feed.revision_changed("r4", OWNER.revision(4, "r4", "u4"))
    assert feed.snapshot.profile is not None and feed.snapshot.profile.version == 4
    assert sorted(p.configmap_name for p in feed.state.followed.verified()) == ["r3", "r4"]
    # A kept revision written again (its labels, say) keeps its place.
    rewritten = OWNER.revision(3, "r3", "u3")
    rewritten["metadata"]["resourceVersion"] = "2"
    feed.revision_changed("r3", rewritten)
    assert isinstance(feed.state.followed.entries["r3"][1], VerifiedProfile)


def test_a_listed_namespace_keeps_the_same_revisions_whatever_the_order() -> None:
    listed = {f"r{v}": OWNER.revision(v, f"r{v}", f"u{v}") for v in (1, 2, 3)}
    listed.update({f"junk-{i}": junk(f"junk-{i}", f"j{i}", 10) for i in range(5)})
    kept = []
    for order in (sorted(listed), sorted(listed, reverse=True)):
        feed = PolicyFeed(OWNER.settings(max_profile_revisions=2), follow=True)
        feed.revisions_listed({name: listed[name] for name in order})
        kept.append(sorted(p.configmap_name for p in feed.state.followed.verified()))
    assert kept[0] == kept[1] == ["r2", "r3"]


# -- what an informer keeps ------------------------------------------------------------------------


def test_an_informer_keeps_the_identity_of_a_judged_revision_and_judges_it_once() -> None:
    revisions = ProfileRevisions("kamiwaza")
    configmap = junk("junk", "u1", 50_000)
    kept = revisions.take(configmap, OWNER.policy(), None)
    assert kept == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "junk", "namespace": "kamiwaza", "uid": "u1", "resourceVersion": "1"},
        "data": {DIGEST_KEY: configmap["data"][DIGEST_KEY]},
    }
    assert len(json.dumps(kept)) < 512
    assert revisions.verifications == 1
    # The same revision again (a relist, a duplicate event) is not judged again.
    revisions.take(junk("junk", "u1", 50_000), OWNER.policy(), None)
    assert not revisions.apply("junk", kept, OWNER.policy())
    assert revisions.verifications == 1
    # Rewritten in a loop: each write is judged once.
    for version in range(2, 12):
        revisions.take(junk("junk", "u1", 50_000, version=str(version)), OWNER.policy(), None)
    assert revisions.verifications == 11


def test_a_claimed_digest_that_is_not_a_sha256_is_not_kept() -> None:
    configmap = junk("junk", "u1", 10)
    configmap["data"][DIGEST_KEY] = "d" * 100_000
    revisions = ProfileRevisions("kamiwaza")
    assert "data" not in revisions.take(configmap, OWNER.policy(), None)
    assert revisions.digests == {}


def test_a_transform_that_cannot_judge_keeps_the_object_and_raises_nothing() -> None:
    revisions = ProfileRevisions("kamiwaza")
    odd: dict[str, Any] = {"metadata": {"name": "x"}}
    assert revisions.take(odd, OWNER.policy(), None) is odd
    assert revisions.take({"metadata": "no"}, OWNER.policy(), None) == {"metadata": "no"}


def test_the_pinned_profile_is_kept_as_what_the_verifier_reads() -> None:
    signed = OWNER.sign()
    signed["data"]["other"] = "o" * 1000
    kept = caps.readable(signed, caps.MAX_REVISION_BYTES)
    assert set(kept["data"]) == {BUNDLE_KEY, DIGEST_KEY} and kept["immutable"] is True
    assert "labels" not in kept["metadata"]
    over = caps.readable(signed, 1024)
    assert set(over["data"]) == {DIGEST_KEY} and over[caps.SIZE_MARK] == caps.data_bytes(signed)


# -- the settings ----------------------------------------------------------------------------------


def test_the_caps_are_settings_with_defaults_flags_and_variables() -> None:
    policy = settings_from_args(TLS, {}).policy
    assert (policy.max_profile_revisions, policy.max_revision_bytes) == (32, 256 * 1024)
    flags = ["--max-profile-revisions", "8", "--max-profile-revision-bytes", "65536"]
    policy = settings_from_args([*TLS, *flags], {}).policy
    assert (policy.max_profile_revisions, policy.max_revision_bytes) == (8, 65536)
    environ = {"TMI_MAX_PROFILE_REVISIONS": "4", "TMI_MAX_PROFILE_REVISION_BYTES": "8192"}
    policy = settings_from_args(TLS, environ).policy
    assert (policy.max_profile_revisions, policy.max_revision_bytes) == (4, 8192)
    with pytest.raises(ConfigError, match="--max-profile-revision-bytes"):
        settings_from_args([*TLS, "--max-profile-revision-bytes", str(2 * 1024 * 1024)], {})
    with pytest.raises(ConfigError, match="--max-profile-revisions"):
        settings_from_args([*TLS, "--max-profile-revisions", "0"], {})


def test_the_extender_and_the_controller_take_the_caps_for_every_tenant() -> None:
    environ = {
        "TMI_NAMESPACE": "kamiwaza",
        "TMI_OWNER_PUBLIC_KEY": OWNER.public_key,
        "TMI_CLUSTER_BINDING_ID": "demo-cluster",
        "TMI_TLS_CERT": "c.pem",
        "TMI_TLS_KEY": "k.pem",
        "TMI_MAX_PROFILE_REVISIONS": "3",
        "TMI_MAX_PROFILE_REVISION_BYTES": "32768",
        "TMI_TENANTS": json.dumps([{"namespace": "other"}]),
    }
    extender = extender_settings([], environ)
    assert {
        (t.policy.max_profile_revisions, t.policy.max_revision_bytes)
        for t in extender.every_tenant()
    } == {(3, 32768)}
    # The controller's TMI_TENANTS lists every tenant, the first too, each whole.
    tenant = {"ownerPublicKey": OWNER.public_key, "clusterBindingId": "demo-cluster"}
    controller = controller_settings(
        [],
        {
            "TMI_MAX_PROFILE_REVISIONS": "3",
            "TMI_MAX_PROFILE_REVISION_BYTES": "32768",
            "TMI_TENANTS": json.dumps(
                [{"namespace": "kamiwaza", **tenant}, {"namespace": "other", **tenant}]
            ),
        },
    )
    assert [
        (t.namespace, t.max_profile_revisions, t.max_revision_bytes)
        for t in controller.every_tenant()
    ] == [("kamiwaza", 3, 32768), ("other", 3, 32768)]
