"""Ed25519 signing and verification of owner profiles, and the ConfigMap that carries them.

The profile travels as a DSSE envelope (payload type, base64 payload, signatures) inside the
`bundle.json` key of an immutable ConfigMap, next to `bundle.sha256`. The signature covers the
DSSE pre-authentication encoding of the exact payload bytes, so a verifier checks what it
received rather than a re-serialisation; the payload must also be the RFC 8785 canonical form of
the envelope, so there is exactly one byte string per signed meaning.

Verification is split in two on purpose. `verify_configmap` does everything that depends only on
the ConfigMap's content (hash, signature, schema, binding id, namespace, version floor) and is run
once per ConfigMap revision; `VerifiedProfile.check_window` is the only per-decision check, since
time moves while the revision does not.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from inference_policy.base import strictjson
from inference_policy.trust.profile import (
    Envelope,
    ProfileSchemaError,
    format_timestamp,
    parse_envelope,
)

PAYLOAD_TYPE = "application/vnd.kamiwaza.inference-profile.v1+json"
DEFAULT_CONFIGMAP_NAME = "kamiwaza-inference-profiles"
BUNDLE_KEY = "bundle.json"
DIGEST_KEY = "bundle.sha256"
# The seed's window is exact ("Kamiwaza refuses the profile outside that window"): no clock
# allowance unless a caller states one.
DEFAULT_SKEW = timedelta(0)
MAX_BUNDLE_BYTES = 900 * 1024
REFUSAL_PREFIX = "invalid inference profile authorization: "

# Small-order points and non-canonical encodings: with such a "public key" a forged signature
# verifies for every message, and `cryptography` accepts them, so they are refused by value.
_WEAK_KEYS = frozenset(
    bytes.fromhex(h)
    for h in (
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    )
)
_FIELD_PRIME = 2**255 - 19


class Reason(Enum):
    """The four reasons of the troubleshooting table, word for word."""

    ARRIVAL = "bundle did not arrive from the configured ConfigMap"
    TARGET = (
        "bundle targets another cluster binding, namespace, or a version below the configured floor"
    )
    KEY = "bundle is signed by a key this cluster does not trust"
    WINDOW = "bundle is expired or its window is empty"


class ProfileRefused(Exception):
    """The profile was found but refused. `reason` is what tenants see; `check` is for operators."""

    def __init__(self, reason: Reason, check: str, *, schema: bool = False) -> None:
        super().__init__(REFUSAL_PREFIX + reason.value)
        self.reason = reason
        self.check = check
        self.schema = schema

    @property
    def authorization_message(self) -> str:
        return REFUSAL_PREFIX + self.reason.value

    def record(self) -> RefusalRecord:
        """What is kept of this refusal: its reason and its check, clipped. Once raised, the
        exception holds its traceback, whose frames hold what was being verified (a refused
        bundle of a few hundred KiB kept some 23 MiB alive), and its context; none of that is
        needed to say why."""
        return RefusalRecord(self.reason, clip_check(self.check), self.schema)


# The longest operator check kept with a refusal: a check may quote what it refused (a
# payloadType, a claimed digest), which is the tenant's to make as long as a ConfigMap allows.
MAX_CHECK_CHARS = 512


def clip_check(check: str) -> str:
    return check if len(check) <= MAX_CHECK_CHARS else check[: MAX_CHECK_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class RefusalRecord:
    """A refused profile revision as it is kept: the reason tenants see and the check operators
    read, never the exception that carried them (`ProfileRefused.record`)."""

    reason: Reason
    check: str
    schema: bool = False

    @property
    def authorization_message(self) -> str:
        return REFUSAL_PREFIX + self.reason.value

    def refusal(self) -> ProfileRefused:
        """The refusal as the planner takes it: a new exception, never raised, so it holds no
        traceback."""
        return ProfileRefused(self.reason, self.check, schema=self.schema)


class KeyError_(ValueError):
    """A public or private key that cannot be used; the message says why."""


def decode_canonical_base64(text: str, length: int | None, what: str) -> bytes:
    """Strict base64: no whitespace, padding as encoded, unused bits zero, exact length."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError(f"{what} is not canonical base64")
    if length is not None and len(raw) != length:
        raise ValueError(f"{what} must decode to {length} bytes, not {len(raw)}")
    return raw


def key_id(raw_public_key: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw_public_key).hexdigest()


def load_public_key(text: str) -> tuple[str, Ed25519PublicKey]:
    """Parse an ownerPublicKey value (canonical base64 of the raw 32 bytes)."""
    try:
        raw = decode_canonical_base64(text, 32, "owner public key")
    except ValueError as exc:
        raise KeyError_(str(exc)) from None
    if raw in _WEAK_KEYS or (int.from_bytes(raw, "little") & (2**255 - 1)) >= _FIELD_PRIME:
        raise KeyError_("owner public key is a small-order or non-canonical Ed25519 point")
    try:
        key = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise KeyError_(f"owner public key is not an Ed25519 key: {exc}") from None
    return key_id(raw), key


@dataclass(frozen=True)
class TrustedKeys:
    """The keys this cluster trusts, by keyId; more than one lets the owner rotate keys."""

    keys: Mapping[str, Ed25519PublicKey]

    @classmethod
    def from_base64(cls, values: Iterable[str]) -> TrustedKeys:
        keys: dict[str, Ed25519PublicKey] = {}
        for value in values:
            kid, key = load_public_key(value)
            keys[kid] = key
        if not keys:
            raise KeyError_("no owner public key is configured")
        return cls(keys)


def public_identity(private_key: Ed25519PrivateKey) -> dict[str, str]:
    raw = private_key.public_key().public_bytes_raw()
    return {"keyId": key_id(raw), "publicKey": base64.b64encode(raw).decode("ascii")}


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: binds the payload type into what is signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def canonical(document: Any) -> bytes:
    try:
        return rfc8785.dumps(document)
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(f"cannot be written as canonical JSON: {exc}") from None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class VerifiedProfile:
    """A profile whose content checks all passed; only the time window is left to check."""

    envelope: Envelope
    sha256: str
    key_id: str
    configmap_name: str

    @property
    def version(self) -> int:
        return self.envelope.version

    def check_window(self, now: datetime, skew: timedelta = DEFAULT_SKEW) -> None:
        issued, expires = self.envelope.issued_at, self.envelope.expires_at
        if expires <= issued:
            raise ProfileRefused(
                Reason.WINDOW, f"expiresAt {self.envelope.expiresAt} is not after issuedAt"
            )
        if now >= expires:
            raise ProfileRefused(
                Reason.WINDOW,
                f"expired at {self.envelope.expiresAt} (now {format_timestamp(now)})",
            )
        if issued > now + skew:
            raise ProfileRefused(
                Reason.WINDOW,
                f"issuedAt {self.envelope.issuedAt} is in the future (now {format_timestamp(now)})",
            )

    def usable_window(self, skew: timedelta = DEFAULT_SKEW) -> tuple[datetime, datetime]:
        """The instants `[start, end)` in which `check_window` passes: what a decision made under
        this profile may be remembered for."""
        return self.envelope.issued_at - skew, self.envelope.expires_at

    def seconds_until_expiry(self, now: datetime) -> float:
        return (self.envelope.expires_at - now).total_seconds()

    def summary(self, now: datetime) -> dict[str, Any]:
        env = self.envelope
        return {
            "verified": True,
            "configMap": self.configmap_name,
            "clusterBindingId": env.clusterBindingId,
            "namespace": env.namespace,
            "version": env.version,
            "keyId": self.key_id,
            "issuedAt": env.issuedAt,
            "expiresAt": env.expiresAt,
            "secondsUntilExpiry": int(self.seconds_until_expiry(now)),
            "evidenceId": env.evidenceId,
            "bundleSha256": self.sha256,
            "profiles": [
                {
                    "name": p.name,
                    "capability": p.capability,
                    "guarantees": list(p.guarantees),
                    "bindings": [b.id for b in p.bindings],
                }
                for p in env.profiles
            ],
        }


def newest(profiles: Iterable[VerifiedProfile]) -> VerifiedProfile | None:
    """Which of several verified revisions an install follows: the highest version, then the
    latest issued, then the ConfigMap name, so every server picks the same one. A revision
    below the install's version floor never gets this far (verification refuses it)."""
    return max(
        profiles,
        key=lambda p: (p.version, p.envelope.issued_at, p.configmap_name),
        default=None,
    )


def sign_envelope(
    envelope_document: Mapping[str, Any], private_key: Ed25519PrivateKey, name: str
) -> dict[str, Any]:
    """Sign an envelope and return the immutable ConfigMap that publishes it."""
    payload = canonical(dict(envelope_document))
    signature = private_key.sign(pae(PAYLOAD_TYPE, payload))
    identity = public_identity(private_key)
    bundle = canonical(
        {
            "payloadType": PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode("ascii"),
            "signatures": [
                {"keyid": identity["keyId"], "sig": base64.b64encode(signature).decode("ascii")}
            ],
        }
    )
    namespace = str(envelope_document.get("namespace", ""))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "kamiwaza-tenant-inference",
                "kamiwaza.ai/inference-profile": "true",
            },
            "annotations": {
                "kamiwaza.ai/profile-version": str(envelope_document.get("version")),
                "kamiwaza.ai/profile-key-id": identity["keyId"],
            },
        },
        "immutable": True,
        "data": {BUNDLE_KEY: bundle.decode("utf-8"), DIGEST_KEY: sha256_hex(bundle)},
    }


@dataclass(frozen=True)
class VerifyPolicy:
    """What this install expects of its profile (the Helm values, in the seed's words)."""

    trusted: TrustedKeys
    cluster_binding_id: str
    namespace: str
    minimum_version: int = 1
    configmap_name: str = DEFAULT_CONFIGMAP_NAME


def _arrival(check: str) -> ProfileRefused:
    return ProfileRefused(Reason.ARRIVAL, check)


def _configmap_bundle(configmap: Any, policy: VerifyPolicy) -> tuple[str, str, str]:
    if not isinstance(configmap, Mapping) or configmap.get("kind") != "ConfigMap":
        raise _arrival("the object is not a ConfigMap")
    metadata = configmap.get("metadata")
    if not isinstance(metadata, Mapping):
        raise _arrival("the ConfigMap has no metadata")
    name = metadata.get("name")
    if name != policy.configmap_name:
        raise _arrival(f"ConfigMap {name!r} is not the configured {policy.configmap_name!r}")
    namespace = metadata.get("namespace")
    if namespace not in (None, policy.namespace):
        raise _arrival(f"ConfigMap is in namespace {namespace!r}, not {policy.namespace!r}")
    if configmap.get("immutable") is not True:
        raise _arrival(f"ConfigMap {name!r} is not immutable")
    data = configmap.get("data")
    if not isinstance(data, Mapping):
        raise _arrival(f"ConfigMap {name!r} has no data")
    bundle, digest = data.get(BUNDLE_KEY), data.get(DIGEST_KEY)
    if not isinstance(bundle, str) or not isinstance(digest, str):
        raise _arrival(f"ConfigMap {name!r} lacks {BUNDLE_KEY} or {DIGEST_KEY}")
    return name, bundle, digest


def verify_configmap(configmap: Any, policy: VerifyPolicy, now: datetime) -> VerifiedProfile:
    """Verify a published profile ConfigMap (already decoded from strict JSON), window included."""
    verified = verify_configmap_content(configmap, policy)
    verified.check_window(now)
    return verified


def verify_configmap_content(configmap: Any, policy: VerifyPolicy) -> VerifiedProfile:
    """Every check that depends only on the ConfigMap: run once per revision."""
    name, bundle_text, digest = _configmap_bundle(configmap, policy)
    return verify_bundle(bundle_text.encode("utf-8"), digest, policy, name)


def verify_bundle(
    bundle_bytes: bytes, expected_sha256: str, policy: VerifyPolicy, configmap_name: str
) -> VerifiedProfile:
    """Every content check, in an order that authenticates before it interprets."""
    if len(bundle_bytes) > MAX_BUNDLE_BYTES:
        raise _arrival(f"{BUNDLE_KEY} is larger than {MAX_BUNDLE_BYTES} bytes")
    actual = sha256_hex(bundle_bytes)
    if actual != expected_sha256:
        raise _arrival(f"{DIGEST_KEY} {expected_sha256!r} does not match the bundle ({actual})")
    try:
        bundle = strictjson.loads(bundle_bytes, what=BUNDLE_KEY)
    except strictjson.StrictJSONError as exc:
        raise _arrival(str(exc)) from None
    if not isinstance(bundle, dict) or set(bundle) != {"payloadType", "payload", "signatures"}:
        raise _arrival(f"{BUNDLE_KEY} must hold exactly payloadType, payload and signatures")
    if bundle["payloadType"] != PAYLOAD_TYPE:
        raise _arrival(f"payloadType {bundle['payloadType']!r} is not {PAYLOAD_TYPE}")
    try:
        payload = decode_canonical_base64(bundle["payload"], None, "payload")
    except ValueError as exc:
        raise _arrival(str(exc)) from None
    signing_key = _verify_signatures(bundle["signatures"], payload, policy.trusted)
    try:
        document = strictjson.loads(payload, what="payload")
        if canonical(document) != payload:
            raise _arrival("payload is not in RFC 8785 canonical form")
    except (strictjson.StrictJSONError, ValueError) as exc:
        if isinstance(exc, ProfileRefused):
            raise
        raise _arrival(str(exc)) from None
    try:
        envelope = parse_envelope(document)
    except ProfileSchemaError as exc:
        raise ProfileRefused(Reason.ARRIVAL, str(exc), schema=True) from None
    if envelope.keyId != signing_key:
        raise ProfileRefused(
            Reason.KEY, f"envelope keyId {envelope.keyId} is not the key that signed it"
        )
    check_target(envelope, policy)
    return VerifiedProfile(envelope, expected_sha256, signing_key, configmap_name)


def check_target(envelope: Envelope, policy: VerifyPolicy) -> None:
    if envelope.clusterBindingId != policy.cluster_binding_id:
        raise ProfileRefused(
            Reason.TARGET,
            f"clusterBindingId {envelope.clusterBindingId!r} is not {policy.cluster_binding_id!r}",
        )
    if envelope.namespace != policy.namespace:
        raise ProfileRefused(
            Reason.TARGET, f"namespace {envelope.namespace!r} is not {policy.namespace!r}"
        )
    if envelope.version < policy.minimum_version:
        raise ProfileRefused(
            Reason.TARGET,
            f"version {envelope.version} is below the floor {policy.minimum_version}",
        )


def _verify_signatures(signatures: Any, payload: bytes, trusted: TrustedKeys) -> str:
    if not isinstance(signatures, list) or not signatures:
        raise ProfileRefused(Reason.KEY, "the bundle carries no signature")
    entries: list[tuple[str, Any]] = []
    for entry in signatures:
        if not isinstance(entry, dict) or set(entry) != {"keyid", "sig"}:
            raise _arrival("each signature must hold exactly keyid and sig")
        kid = entry["keyid"]
        if not isinstance(kid, str) or any(kid == seen for seen, _ in entries):
            raise _arrival(f"signature keyid {kid!r} is repeated or not a string")
        entries.append((kid, entry["sig"]))
    message = pae(PAYLOAD_TYPE, payload)
    for kid, sig in entries:
        key = trusted.keys.get(kid)
        if key is None:
            continue
        try:
            key.verify(decode_canonical_base64(sig, 64, "signature"), message)
        except (ValueError, InvalidSignature):
            raise ProfileRefused(Reason.KEY, f"the signature by {kid} does not verify") from None
        return kid
    seen = [kid for kid, _ in entries]
    raise ProfileRefused(
        Reason.KEY, f"signed by {', '.join(sorted(seen))}; trusted: {', '.join(trusted.keys)}"
    )


def usable_profile(
    profile: VerifiedProfile | None, refusal: ProfileRefused | RefusalRecord | None, now: datetime
) -> VerifiedProfile | str:
    """The profile plans are made and placed under now, or the authorization message saying
    why there is none: the one "is the profile usable now" the planner, the extender's demand
    and the webhook's memo ask. A refusal of the current revision wins; no profile read is the
    troubleshooting table's "did not arrive"; a verified one outside its window is refused."""
    if refusal is not None:
        return refusal.authorization_message
    if profile is None:
        return REFUSAL_PREFIX + Reason.ARRIVAL.value
    try:
        profile.check_window(now)
    except ProfileRefused as exc:
        return exc.authorization_message
    return profile
