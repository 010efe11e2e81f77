"""`tmi`, the cluster owner's tool: keys, GPU detection, signing, verification, catalogs and plans.

Every command prints JSON (the catalog prints TSV) on stdout and errors on stderr as
`error: ...`. `tmi plan` decides through the same planner and the same state object the servers
use, so its answer is the servers' answer. Exit status: 0 success, 1 a refusal or failure (4xx
for plans), 2 a usage error, 3 a plan refused with a 5xx.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import orjson
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_policy.catalog import CatalogError
from inference_policy.profile import ProfileSchemaError, parse_envelope
from inference_policy.recipes import RecipeCatalogError, render_catalog
from inference_policy.schedconfig import (
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_SCHEDULER_NAMESPACE,
    SchedulerConfigError,
    render_scheduler_config,
)
from inference_policy.signing import (
    DEFAULT_CONFIGMAP_NAME,
    REFUSAL_PREFIX,
    KeyError_,
    ProfileRefused,
    Reason,
    TrustedKeys,
    VerifyPolicy,
    public_identity,
    verify_configmap,
)
from inference_policy.signing import (
    sign_envelope as sign_document,
)
from policy_io.catalog import packaged_catalog
from policy_io.files import InputError, read_bytes, read_json
from tmi_cli.capacity_command import add_capacity_parser
from tmi_cli.cleanup_command import add_cleanup_parser
from tmi_cli.detect import TOOLKIT_CONFIG, DetectionError, detect_accelerator, detect_toolkit
from tmi_cli.evidence_command import add_evidence_parser
from tmi_cli.policy_args import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    add_policy_arguments,
    configmap_name,
    keys,
    now_from,
    policy_state,
    positive_int,
)
from tmi_cli.render_dra_command import add_render_dra_parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _emit(document: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def _load_private_key(path: str) -> Ed25519PrivateKey:
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
    _emit(public_identity(key))
    return EXIT_OK


def cmd_pubkey(args: argparse.Namespace) -> int:
    _emit(public_identity(_load_private_key(args.private_key)))
    return EXIT_OK


def cmd_detect(args: argparse.Namespace) -> int:
    try:
        block = detect_accelerator()
        if args.container_toolkit:
            # The accelerator block stays as the seed prints it; the report sits beside it.
            _emit({**block, "containerToolkit": detect_toolkit(args.toolkit_config)})
            return EXIT_OK
    except DetectionError as exc:
        raise CommandError(str(exc)) from None
    _emit(block)
    return EXIT_OK


def cmd_sign(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    document = read_json(args.envelope, "envelope")
    key = _load_private_key(args.private_key)
    refused = "signed bundle would be refused: " + REFUSAL_PREFIX
    try:
        envelope = parse_envelope(document)
    except ProfileSchemaError as exc:
        raise CommandError(refused + str(exc)) from None
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
    _emit(configmap)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    configmap = read_json(args.bundle, "bundle ConfigMap")
    try:
        trusted = TrustedKeys.from_base64(keys(args.owner_public_key))
    except KeyError_ as exc:
        raise CommandError(f"--owner-public-key: {exc}", EXIT_USAGE) from None
    policy = VerifyPolicy(
        trusted=trusted,
        cluster_binding_id=args.cluster_binding_id,
        namespace=args.namespace,
        minimum_version=args.minimum_bundle_version,
        configmap_name=configmap_name(args, configmap),
    )
    try:
        verified = verify_configmap(configmap, policy, now)
    except ProfileRefused as refusal:
        _emit({"status": 503, "detail": "owner profile bundle: " + refusal.authorization_message})
        sys.stderr.write(f"error: {refusal.authorization_message}\ncheck: {refusal.check}\n")
        return EXIT_FAILED
    _emit(verified.summary(now))
    return EXIT_OK


def cmd_render_scheduler_config(args: argparse.Namespace) -> int:
    """The owner's scheduler configuration, with the extender managing the verified profile's
    GPU resources; refuses a profile the servers would refuse."""
    now = now_from(args.now)
    configmap = read_json(args.bundle, "bundle ConfigMap")
    try:
        trusted = TrustedKeys.from_base64(keys(args.owner_public_key))
    except KeyError_ as exc:
        raise CommandError(f"--owner-public-key: {exc}", EXIT_USAGE) from None
    policy = VerifyPolicy(
        trusted=trusted,
        cluster_binding_id=args.cluster_binding_id,
        namespace=args.namespace,
        minimum_version=args.minimum_bundle_version,
        configmap_name=configmap_name(args, configmap),
    )
    try:
        verified = verify_configmap(configmap, policy, now)
    except ProfileRefused as refusal:
        raise CommandError(
            f"{refusal.authorization_message} ({refusal.check})", EXIT_FAILED
        ) from None
    ca_pem = read_bytes(args.ca_file, "CA file") if args.ca_file else None
    try:
        rendered = render_scheduler_config(
            verified.envelope,
            extender_url=args.extender_url,
            ca_pem=ca_pem,
            scheduler_name=args.scheduler_name,
            scheduler_namespace=args.scheduler_namespace,
            weight=args.weight,
            http_timeout=args.http_timeout,
            server_name=args.extender_server_name,
        )
    except SchedulerConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    if args.format == "yaml":
        sys.stdout.write(yaml.safe_dump(rendered, sort_keys=False))
    else:
        _emit(rendered)
    return EXIT_OK


def cmd_render_catalog(args: argparse.Namespace) -> int:
    document = read_json(args.catalog, "recipe catalog")
    try:
        rendered = render_catalog(document, args.namespace, args.capability)
    except RecipeCatalogError as exc:
        raise CommandError(str(exc)) from None
    _emit(rendered.configmap)
    return EXIT_OK


def cmd_catalog(args: argparse.Namespace) -> int:
    rows = packaged_catalog().rows()
    sys.stdout.write("".join("\t".join(row) + "\n" for row in rows))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    now = now_from(args.now)
    request = read_json(args.request, "deployment request")
    state = policy_state(args, now, disabled=args.disabled)
    decision = state.decide(request, now)
    _emit(decision.body)
    if decision.allowed:
        return EXIT_OK
    return EXIT_UNAVAILABLE if decision.status >= 500 else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tmi", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("keygen", help="create a new Ed25519 owner key (PEM, mode 0600)")
    p.add_argument("--private-key-out", required=True, metavar="FILE")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("pubkey", help="print the keyId and public key of a private key")
    p.add_argument("--private-key", required=True, metavar="FILE")
    p.set_defaults(func=cmd_pubkey)

    p = sub.add_parser("detect", help="print this host's accelerator block")
    p.add_argument(
        "--container-toolkit",
        action="store_true",
        help="also report whether the NVIDIA Container Toolkit lets an unprivileged "
        "container's own NVIDIA_VISIBLE_DEVICES select GPUs (the image-environment path)",
    )
    p.add_argument(
        "--toolkit-config",
        default=TOOLKIT_CONFIG,
        help=f"the toolkit's config.toml (default {TOOLKIT_CONFIG})",
    )
    p.set_defaults(func=cmd_detect)

    add_evidence_parser(sub)
    add_capacity_parser(sub)
    add_cleanup_parser(sub)
    add_render_dra_parser(sub)

    p = sub.add_parser("sign", help="sign an envelope into an immutable ConfigMap")
    p.add_argument("--envelope", required=True, metavar="FILE")
    p.add_argument("--private-key", required=True, metavar="FILE")
    p.add_argument("--name", default=DEFAULT_CONFIGMAP_NAME, help="ConfigMap name")
    p.add_argument("--now", metavar="T")
    p.set_defaults(func=cmd_sign)

    p = sub.add_parser("verify", help="verify a signed profile ConfigMap")
    p.add_argument("--bundle", required=True, metavar="CONFIGMAP_FILE")
    p.add_argument("--owner-public-key", required=True, action="append", metavar="B64")
    p.add_argument("--cluster-binding-id", required=True, metavar="ID")
    p.add_argument("--namespace", required=True, metavar="NS")
    p.add_argument("--minimum-bundle-version", type=positive_int, default=1, metavar="N")
    p.add_argument("--bundle-configmap", metavar="NAME", help="configured ConfigMap name")
    p.add_argument("--now", metavar="T")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("render-catalog", help="render a recipe catalog as an immutable ConfigMap")
    p.add_argument("--catalog", required=True, metavar="FILE")
    p.add_argument("--namespace", required=True, metavar="NS")
    p.add_argument("--capability", required=True, choices=("gpu", "cpu"))
    p.set_defaults(func=cmd_render_catalog)

    p = sub.add_parser(
        "render-scheduler-config",
        help="print the KubeSchedulerConfiguration of the owner's scheduler for a profile",
    )
    p.add_argument("--bundle", required=True, metavar="CONFIGMAP_FILE")
    p.add_argument("--owner-public-key", required=True, action="append", metavar="B64")
    p.add_argument("--cluster-binding-id", required=True, metavar="ID")
    p.add_argument("--namespace", required=True, metavar="NS")
    p.add_argument("--extender-url", required=True, metavar="URL")
    p.add_argument("--ca-file", metavar="F", help="CA of the extender's serving certificate")
    p.add_argument(
        "--extender-server-name",
        metavar="NAME",
        help="the name the extender's certificate is checked against when --extender-url "
        "names an address (a ClusterIP, for a scheduler without cluster DNS)",
    )
    p.add_argument("--minimum-bundle-version", type=positive_int, default=1, metavar="N")
    p.add_argument("--bundle-configmap", metavar="NAME", help="configured ConfigMap name")
    p.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME, metavar="NAME")
    p.add_argument("--scheduler-namespace", default=DEFAULT_SCHEDULER_NAMESPACE, metavar="NS")
    p.add_argument("--weight", type=positive_int, default=5, metavar="N")
    p.add_argument("--http-timeout", default="5s", metavar="DURATION")
    p.add_argument("--format", choices=("json", "yaml"), default="json")
    p.add_argument("--now", metavar="T")
    p.set_defaults(func=cmd_render_scheduler_config)

    p = sub.add_parser("catalog", help="print the engine catalog's images as TSV")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("plan", help="plan a deployment request exactly as the servers would")
    add_policy_arguments(p)
    p.add_argument("--request", required=True, metavar="FILE")
    p.add_argument("--disabled", action="store_true", help="tenant-mode inference off")
    p.set_defaults(func=cmd_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except (CommandError, InputError, CatalogError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.status if isinstance(exc, CommandError) else EXIT_FAILED
    return status


if __name__ == "__main__":
    raise SystemExit(main())
