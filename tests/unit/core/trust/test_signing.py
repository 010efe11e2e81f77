"""Signing and verification, including the attack list of the signing reference."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_policy.trust.signing import (
    BUNDLE_KEY,
    DIGEST_KEY,
    PAYLOAD_TYPE,
    REFUSAL_PREFIX,
    KeyError_,
    ProfileRefused,
    Reason,
    TrustedKeys,
    canonical,
    key_id,
    load_public_key,
    pae,
    usable_profile,
    verify_configmap,
)
from kits.profilekit import NOW, Owner, clone

OWNER = Owner()
L = 2**252 + 27742317777372353535851937790883648493


def refusal(configmap: Any, policy: Any = None, now: Any = NOW) -> ProfileRefused:
    with pytest.raises(ProfileRefused) as err:
        verify_configmap(configmap, policy or OWNER.policy(), now)
    return err.value


def rebundle(configmap: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
    """Edit the DSSE bundle and keep bundle.sha256 honest, to reach the checks behind it."""
    bundle = json.loads(configmap["data"][BUNDLE_KEY])
    change(bundle)
    text = canonical(bundle)
    configmap["data"][BUNDLE_KEY] = text.decode()
    configmap["data"][DIGEST_KEY] = hashlib.sha256(text).hexdigest()


def resign(configmap: dict[str, Any], payload: bytes, key: Ed25519PrivateKey) -> None:
    def change(bundle: dict[str, Any]) -> None:
        bundle["payload"] = base64.b64encode(payload).decode()
        bundle["signatures"][0]["sig"] = base64.b64encode(
            key.sign(pae(PAYLOAD_TYPE, payload))
        ).decode()

    rebundle(configmap, change)


def test_round_trip_summary() -> None:
    verified = verify_configmap(OWNER.sign(), OWNER.policy(), NOW)
    summary = verified.summary(NOW)
    assert summary["version"] == 1
    assert summary["keyId"] == OWNER.key_id
    assert summary["bundleSha256"] == OWNER.sign()["data"][DIGEST_KEY]


def test_configmap_shape() -> None:
    configmap = OWNER.sign()
    assert configmap["immutable"] is True
    assert configmap["metadata"]["name"] == "kamiwaza-inference-profiles"
    bundle = configmap["data"][BUNDLE_KEY].encode()
    assert configmap["data"][DIGEST_KEY] == hashlib.sha256(bundle).hexdigest()
    assert canonical(json.loads(bundle)) == bundle


def test_signing_is_deterministic() -> None:
    assert OWNER.sign() == OWNER.sign()


def test_key_id_is_sha256_of_raw_key() -> None:
    assert OWNER.key_id == "sha256:" + hashlib.sha256(OWNER.raw_public).hexdigest()
    assert key_id(OWNER.raw_public) == OWNER.key_id


# -- arrival --------------------------------------------------------------------------------


def test_not_immutable() -> None:
    configmap = OWNER.sign()
    configmap["immutable"] = False
    err = refusal(configmap)
    assert err.reason is Reason.ARRIVAL
    assert "not immutable" in err.check
    del configmap["immutable"]
    assert refusal(configmap).reason is Reason.ARRIVAL


def test_other_configmap_name() -> None:
    configmap = OWNER.sign(name="kamiwaza-inference-profiles-r1")
    err = refusal(configmap)
    assert err.reason is Reason.ARRIVAL
    assert str(err) == (
        "invalid inference profile authorization: bundle did not arrive from the configured "
        "ConfigMap"
    )


def test_configmap_in_other_namespace() -> None:
    configmap = OWNER.sign()
    configmap["metadata"]["namespace"] = "elsewhere"
    assert refusal(configmap).reason is Reason.ARRIVAL


def test_digest_mismatch() -> None:
    configmap = OWNER.sign()
    configmap["data"][DIGEST_KEY] = "0" * 64
    err = refusal(configmap)
    assert err.reason is Reason.ARRIVAL
    assert "does not match the bundle" in err.check


def test_missing_data_keys() -> None:
    configmap = OWNER.sign()
    del configmap["data"][DIGEST_KEY]
    assert refusal(configmap).reason is Reason.ARRIVAL


@pytest.mark.parametrize("bad", ["not json", '{"a":1,"a":2}', "[]", '{"payload":"x"}'])
def test_malformed_bundle(bad: str) -> None:
    configmap = OWNER.sign()
    configmap["data"][BUNDLE_KEY] = bad
    configmap["data"][DIGEST_KEY] = hashlib.sha256(bad.encode()).hexdigest()
    assert refusal(configmap).reason is Reason.ARRIVAL


def test_other_payload_type() -> None:
    configmap = OWNER.sign()
    rebundle(configmap, lambda b: b.update(payloadType="application/json"))
    assert refusal(configmap).reason is Reason.ARRIVAL


def test_non_canonical_base64_payload() -> None:
    configmap = OWNER.sign()

    def newline(bundle: dict[str, Any]) -> None:
        bundle["payload"] = bundle["payload"][:10] + "\n" + bundle["payload"][10:]

    rebundle(configmap, newline)
    assert "payload is not valid base64" in refusal(configmap).check


def test_non_canonical_payload_correctly_signed() -> None:
    configmap = OWNER.sign()
    pretty = json.dumps(OWNER.envelope(), indent=2).encode()
    resign(configmap, pretty, OWNER.key)
    err = refusal(configmap)
    assert err.reason is Reason.ARRIVAL
    assert "canonical" in err.check


def test_signed_payload_with_duplicate_keys() -> None:
    configmap = OWNER.sign()
    payload = canonical(OWNER.envelope())
    payload = payload.replace(b'{"clusterBindingId"', b'{"version":9,"clusterBindingId"', 1)
    resign(configmap, payload, OWNER.key)
    assert "duplicate key 'version'" in refusal(configmap).check


def test_signed_but_schema_invalid() -> None:
    configmap = OWNER.sign()
    envelope = OWNER.envelope()
    envelope["profiles"][1]["bindings"][0]["capacity"]["usableMemory"] = "79.5Gi"
    resign(configmap, canonical(envelope), OWNER.key)
    err = refusal(configmap)
    assert err.schema
    assert "profiles[1].bindings[0].capacity.usableMemory" in err.check


# -- key ------------------------------------------------------------------------------------


def test_signed_by_untrusted_key() -> None:
    other = Owner()
    configmap = other.sign(other.envelope())
    err = refusal(configmap)
    assert err.reason is Reason.KEY
    assert str(err).endswith("bundle is signed by a key this cluster does not trust")


def test_keyid_names_trusted_key_but_signature_from_another() -> None:
    configmap = OWNER.sign()
    resign(configmap, canonical(OWNER.envelope()), Ed25519PrivateKey.generate())
    err = refusal(configmap)
    assert err.reason is Reason.KEY
    assert "does not verify" in err.check


def test_payload_bit_flip() -> None:
    configmap = OWNER.sign()
    payload = bytearray(canonical(OWNER.envelope()))
    payload[-5] ^= 0x01

    def change(bundle: dict[str, Any]) -> None:
        bundle["payload"] = base64.b64encode(bytes(payload)).decode()

    rebundle(configmap, change)
    assert refusal(configmap).reason is Reason.KEY


@pytest.mark.parametrize("length", [63, 65])
def test_signature_length(length: int) -> None:
    configmap = OWNER.sign()

    def change(bundle: dict[str, Any]) -> None:
        bundle["signatures"][0]["sig"] = base64.b64encode(b"\x01" * length).decode()

    rebundle(configmap, change)
    assert refusal(configmap).reason is Reason.KEY


def test_signature_bit_flip() -> None:
    configmap = OWNER.sign()

    def change(bundle: dict[str, Any]) -> None:
        raw = bytearray(base64.b64decode(bundle["signatures"][0]["sig"]))
        raw[0] ^= 0x80
        bundle["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()

    rebundle(configmap, change)
    assert refusal(configmap).reason is Reason.KEY


def test_malleated_signature_s_plus_l() -> None:
    configmap = OWNER.sign()

    def change(bundle: dict[str, Any]) -> None:
        raw = base64.b64decode(bundle["signatures"][0]["sig"])
        s = int.from_bytes(raw[32:], "little") + L
        bundle["signatures"][0]["sig"] = base64.b64encode(
            raw[:32] + s.to_bytes(32, "little")
        ).decode()

    rebundle(configmap, change)
    assert refusal(configmap).reason is Reason.KEY


def test_unknown_keyid() -> None:
    configmap = OWNER.sign()
    rebundle(configmap, lambda b: b["signatures"][0].update(keyid="sha256:" + "0" * 64))
    assert refusal(configmap).reason is Reason.KEY


def test_no_signatures() -> None:
    configmap = OWNER.sign()
    rebundle(configmap, lambda b: b.update(signatures=[]))
    assert refusal(configmap).reason is Reason.KEY


def test_duplicate_signature_entries() -> None:
    configmap = OWNER.sign()
    rebundle(configmap, lambda b: b["signatures"].append(dict(b["signatures"][0])))
    assert "repeated" in refusal(configmap).check


def test_envelope_key_id_must_be_the_signer() -> None:
    other = Owner()
    envelope = OWNER.envelope(keyId=other.key_id)
    configmap = OWNER.sign(envelope)
    err = refusal(configmap)
    assert err.reason is Reason.KEY
    assert "is not the key that signed it" in err.check


def test_rotation_two_trusted_keys() -> None:
    new = Owner()
    both = TrustedKeys.from_base64([OWNER.public_key, new.public_key])
    policy = OWNER.policy(trusted=both)
    assert verify_configmap(OWNER.sign(), policy, NOW).key_id == OWNER.key_id
    assert verify_configmap(new.sign(new.envelope()), policy, NOW).key_id == new.key_id
    only_new = OWNER.policy(trusted=TrustedKeys.from_base64([new.public_key]))
    assert refusal(OWNER.sign(), only_new).reason is Reason.KEY


SMALL_ORDER = [
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
]


@pytest.mark.parametrize("hex_key", SMALL_ORDER)
def test_small_order_and_non_canonical_keys_refused(hex_key: str) -> None:
    with pytest.raises(KeyError_, match="small-order or non-canonical"):
        load_public_key(base64.b64encode(bytes.fromhex(hex_key)).decode())


def test_identity_key_forgery_is_refused_at_load() -> None:
    with pytest.raises(KeyError_):
        TrustedKeys.from_base64([base64.b64encode(bytes.fromhex(SMALL_ORDER[1])).decode()])


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("abc", "not valid base64"),
        (base64.b64encode(b"\x01" * 31).decode(), "32 bytes"),
        (" " + OWNER.public_key, "not valid base64"),
        ("", "32 bytes"),
    ],
)
def test_public_key_encoding(value: str, fragment: str) -> None:
    with pytest.raises(KeyError_, match=fragment):
        load_public_key(value)


def test_public_key_non_canonical_base64_tail() -> None:
    # The last character of a 32-byte key carries two unused bits: changing them decodes to the
    # same bytes, and such an alias must not be accepted.
    key = OWNER.public_key
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = key[-2]
    alias = key[:-2] + alphabet[alphabet.index(last) ^ 1] + key[-1]
    assert base64.b64decode(alias) == base64.b64decode(key)
    with pytest.raises(KeyError_, match="not canonical base64"):
        load_public_key(alias)


def test_no_keys_configured() -> None:
    with pytest.raises(KeyError_, match="no owner public key"):
        TrustedKeys.from_base64([])


# -- target ---------------------------------------------------------------------------------


def test_other_cluster_binding() -> None:
    err = refusal(OWNER.sign(), OWNER.policy(cluster_binding_id="other"))
    assert err.reason is Reason.TARGET
    assert str(err).endswith(
        "bundle targets another cluster binding, namespace, or a version below the configured floor"
    )


def test_envelope_for_another_namespace() -> None:
    configmap = OWNER.sign(OWNER.envelope(namespace="tenant-b"))
    configmap["metadata"]["namespace"] = "kamiwaza"
    assert refusal(configmap).reason is Reason.TARGET


def test_configmap_read_from_another_namespace() -> None:
    assert refusal(OWNER.sign(), OWNER.policy(namespace="tenant-b")).reason is Reason.ARRIVAL


def test_version_floor() -> None:
    configmap = OWNER.sign(OWNER.envelope(version=3))
    assert verify_configmap(configmap, OWNER.policy(minimum_version=3), NOW).version == 3
    assert refusal(configmap, OWNER.policy(minimum_version=4)).reason is Reason.TARGET


# -- window ---------------------------------------------------------------------------------


def test_expiry_boundary() -> None:
    configmap = OWNER.sign()
    expires = verify_configmap(configmap, OWNER.policy(), NOW).envelope.expires_at
    verify_configmap(configmap, OWNER.policy(), expires - timedelta(seconds=1))
    err = refusal(configmap, now=expires)
    assert err.reason is Reason.WINDOW
    assert str(err).endswith("bundle is expired or its window is empty")


def test_empty_window() -> None:
    envelope = OWNER.envelope(issuedAt="2026-11-01T00:00:00Z", expiresAt="2026-11-01T00:00:00Z")
    assert refusal(OWNER.sign(envelope)).reason is Reason.WINDOW


def test_inverted_window() -> None:
    envelope = OWNER.envelope(issuedAt="2027-01-01T00:00:00Z", expiresAt="2026-01-01T00:00:00Z")
    assert refusal(OWNER.sign(envelope)).reason is Reason.WINDOW


def test_the_window_is_exact_a_second_early_is_refused() -> None:
    """The seed: refused outside the window, with no unstated clock allowance."""
    early = NOW + timedelta(seconds=1)
    envelope = OWNER.envelope(issuedAt=early.strftime("%Y-%m-%dT%H:%M:%SZ"))
    err = refusal(OWNER.sign(envelope))
    assert err.reason is Reason.WINDOW
    assert "in the future" in err.check


def test_the_window_opens_at_issued_at_and_closes_at_expires_at() -> None:
    start = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    verify_configmap(OWNER.sign(OWNER.envelope(issuedAt=start)), OWNER.policy(), NOW)
    envelope = OWNER.envelope(expiresAt=start)
    assert refusal(OWNER.sign(envelope)).reason is Reason.WINDOW


def test_check_order_key_before_target() -> None:
    other = Owner()
    configmap = other.sign(other.envelope(clusterBindingId="elsewhere"))
    assert refusal(configmap).reason is Reason.KEY


def test_tampered_data_survives_no_mutation() -> None:
    configmap = OWNER.sign()
    before = clone(configmap)
    verify_configmap(configmap, OWNER.policy(), NOW)
    assert configmap == before


def test_one_usable_profile_now_for_the_planner_the_extender_and_the_memo() -> None:
    """`usable_profile`: a refusal wins, none read is "did not arrive", and a verified profile
    is usable exactly inside `usable_window`, which is what a memoised decision may last."""
    profile = verify_configmap(OWNER.sign(), OWNER.policy(), NOW)
    assert usable_profile(profile, None, NOW) is profile
    assert usable_profile(None, None, NOW) == REFUSAL_PREFIX + Reason.ARRIVAL.value
    refused = ProfileRefused(Reason.KEY, "untrusted")
    assert usable_profile(profile, refused, NOW) == REFUSAL_PREFIX + Reason.KEY.value
    start, end = profile.usable_window()
    assert usable_profile(profile, None, start) is profile
    assert usable_profile(profile, None, end - timedelta(microseconds=1)) is profile
    assert usable_profile(profile, None, end) == REFUSAL_PREFIX + Reason.WINDOW.value
    assert usable_profile(profile, None, start - timedelta(seconds=1)) == (
        REFUSAL_PREFIX + Reason.WINDOW.value
    )
