"""`tmi keygen`, `pubkey`, `sign` and `verify`: the owner's key and the signed profile.

Signing refuses what the servers' verifier would refuse and what the seed tells an owner not to
write (`inference_policy.trust.seed_rules`), so a ConfigMap `tmi sign` prints is one every server
accepts. Verifying checks the ConfigMap's name too, as the servers do (a profile arrives only
from the ConfigMap they are configured with): against the name given, else against the name it
carries, and says which.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_policy.trust.profile import ProfileSchemaError, parse_envelope
from inference_policy.trust.seed_rules import signing_violations
from inference_policy.trust.signing import (
    DEFAULT_CONFIGMAP_NAME,
    REFUSAL_PREFIX,
    ProfileRefused,
    Reason,
    TrustedKeys,
    VerifyPolicy,
    public_identity,
    verify_configmap,
)
from inference_policy.trust.signing import sign_envelope as sign_document
from policy_io.files import read_bytes, read_json
from tmi_cli.output import add_output_arguments, emit
from tmi_cli.policy_args import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    add_trust_arguments,
    now_from,
    verify_policy,
)

Subparsers = Any


def load_private_key(path: str) -> Ed25519PrivateKey:
    data = read_bytes(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"cannot load private key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CommandError(f"private key {path} is not an Ed25519 key")
    return key


def cmd_keygen(args: argparse.Namespace) -> int:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # O_EXCL refuses an existing path, a symlink included (even a dangling one), so the key can
    # never be written through a link an attacker planted; the mode is set before any byte lands.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(args.private_key_out, flags, 0o600)
    except FileExistsError:
        raise CommandError(
            f"{args.private_key_out} already exists; refusing to replace it"
        ) from None
    except OSError as exc:
        raise CommandError(f"cannot create {args.private_key_out}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, pem)
    finally:
        os.close(fd)
    emit(public_identity(key), args)
    return EXIT_OK


def cmd_pubkey(args: argparse.Namespace) -> int:
    emit(public_identity(load_private_key(args.private_key)), args)
    return EXIT_OK


def cmd_sign(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    document = read_json(args.envelope, "envelope")
    key = load_private_key(args.private_key)
    if isinstance(document, dict) and "keyId" not in document:
        # The key is in hand: an envelope that leaves keyId out takes the key's own.
        document["keyId"] = public_identity(key)["keyId"]
    refused = "signed bundle would be refused: " + REFUSAL_PREFIX
    try:
        envelope = parse_envelope(document)
    except ProfileSchemaError as exc:
        raise CommandError(refused + str(exc)) from None
    violations = signing_violations(envelope)
    if violations:
        raise CommandError("not signed: " + "; ".join(violations))
    identity = public_identity(key)
    if envelope.keyId != identity["keyId"]:
        raise CommandError(
            refused + Reason.KEY.value + f" (envelope keyId {envelope.keyId} is not the signing "
            f"key {identity['keyId']})"
        )
    configmap = sign_document(document, key, args.name)
    policy = VerifyPolicy(
        trusted=TrustedKeys.from_base64([identity["publicKey"]]),
        cluster_binding_id=envelope.clusterBindingId,
        namespace=envelope.namespace,
        minimum_version=1,
        configmap_name=args.name,
    )
    try:
        verify_configmap(configmap, policy, now)
    except ProfileRefused as refusal:
        sys.stderr.write(f"error: {refused}{refusal.reason.value}\n")
        sys.stderr.write(f"check: {refusal.check}\n")
        return EXIT_FAILED
    emit(configmap, args, "signed ConfigMap")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    configmap = read_json(args.bundle, "bundle ConfigMap")
    policy = verify_policy(args, configmap)
    try:
        verified = verify_configmap(configmap, policy, now)
    except ProfileRefused as refusal:
        emit(
            {"status": 503, "detail": "owner profile bundle: " + refusal.authorization_message},
            args,
        )
        sys.stderr.write(f"error: {refusal.authorization_message}\ncheck: {refusal.check}\n")
        return EXIT_FAILED
    emit(verified.summary(now), args)
    if not args.bundle_configmap:
        sys.stderr.write(
            f"note: checked as ConfigMap {policy.configmap_name!r}, the name it carries; the "
            "servers check the name they are configured with (the chart's "
            f"core.inferenceResources.bundleConfigMap, default {DEFAULT_CONFIGMAP_NAME}): pass "
            "--bundle-configmap NAME to check against that one\n"
        )
    return EXIT_OK


def add_profile_parsers(sub: Subparsers) -> None:
    p = sub.add_parser("keygen", help="create a new Ed25519 owner key (PEM, mode 0600)")
    p.add_argument(
        "--private-key-out", required=True, metavar="FILE", help="where the new key is written"
    )
    add_output_arguments(p)
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("pubkey", help="print the keyId and public key of a private key")
    p.add_argument("--private-key", required=True, metavar="FILE", help="the owner's key (PEM)")
    add_output_arguments(p)
    p.set_defaults(func=cmd_pubkey)

    p = sub.add_parser("sign", help="sign an envelope into an immutable ConfigMap")
    p.add_argument(
        "--envelope", required=True, metavar="FILE", help="the profile envelope (JSON or YAML)"
    )
    p.add_argument("--private-key", required=True, metavar="FILE", help="the owner's key (PEM)")
    p.add_argument(
        "--name",
        default=DEFAULT_CONFIGMAP_NAME,
        help=f"the ConfigMap's name (default {DEFAULT_CONFIGMAP_NAME}; a revision gets its own, "
        "such as kamiwaza-inference-profiles-r2, since the ConfigMap is immutable)",
    )
    p.add_argument("--now", metavar="T", help="check the time window at T (RFC 3339)")
    add_output_arguments(p)
    p.set_defaults(func=cmd_sign)

    p = sub.add_parser("verify", help="verify a signed profile ConfigMap")
    p.add_argument(
        "--bundle", required=True, metavar="CONFIGMAP_FILE", help="the ConfigMap (JSON or YAML)"
    )
    add_trust_arguments(p, required=True)
    p.add_argument("--now", metavar="T", help="check the time window at T (RFC 3339)")
    add_output_arguments(p)
    p.set_defaults(func=cmd_verify)


__all__ = ["add_profile_parsers"]
