"""What the commands that decide as the servers do share: their exit statuses and error, the
owner's trust and planning flags, and the snapshot those flags make.

`tmi plan` decides one request and `tmi capacity` replays many; both must read the same flags
the same way, or the CLI would answer differently from the servers it stands in for.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from inference_policy.base.pod_view import ObjectView
from inference_policy.planning.recipe_inputs import Capability, CatalogUnavailable, Cause
from inference_policy.trust.profile import parse_timestamp
from inference_policy.trust.signing import (
    DEFAULT_CONFIGMAP_NAME,
    KeyError_,
    TrustedKeys,
    VerifyPolicy,
)
from policy_io.catalog import packaged_catalog
from policy_io.files import read_json
from policy_io.offline import fed
from policy_io.snapshot import PolicySnapshot
from policy_io.state import PolicySettings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class CommandError(Exception):
    """A failure to report as `error: <message>` with an exit status."""

    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


def now_from(value: str | None) -> datetime:
    """`--now`, or the clock's reading without it."""
    if value is None:
        return datetime.now(UTC).replace(microsecond=0)
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise CommandError(f"--now: {exc}", EXIT_USAGE) from None


def positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def keys(values: Sequence[str]) -> tuple[str, ...]:
    found = tuple(part.strip() for value in values for part in value.split(",") if part.strip())
    if not found:
        raise CommandError("--owner-public-key is required", EXIT_USAGE)
    return found


def configmap_name(args: argparse.Namespace, configmap: Any) -> str:
    if args.bundle_configmap:
        return str(args.bundle_configmap)
    name = ObjectView(configmap).name
    return DEFAULT_CONFIGMAP_NAME if name is None else name


def image_map(path: str | None) -> dict[str, str] | None:
    if path is None:
        return None
    document = read_json(path, "engine image map")
    if not isinstance(document, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in document.items()
    ):
        raise CommandError(
            f"engine image map {path} must be a JSON object from catalog image to imported image",
            EXIT_USAGE,
        )
    return document


def add_trust_arguments(
    p: argparse.ArgumentParser, *, required: bool = False, when: str = ""
) -> None:
    """The flags `verify_policy` reads: the trusted keys, the cluster, the tenant namespace,
    the version floor and the configured ConfigMap name. ``required``: the command always
    verifies; ``when`` ("with --bundle") says when an optional one does."""
    lead = f"{when}: " if when else ""
    p.add_argument(
        "--owner-public-key",
        required=required,
        action="append",
        metavar="B64",
        help=f"{lead}a trusted owner key, as tmi keygen prints it (repeat for several)",
    )
    p.add_argument(
        "--cluster-binding-id",
        required=required,
        metavar="ID",
        help=f"{lead}this cluster's id, as the profile names it",
    )
    p.add_argument(
        "--namespace", required=required, metavar="NS", help=f"{lead}the tenant namespace"
    )
    p.add_argument(
        "--minimum-bundle-version",
        type=positive_int,
        default=1,
        metavar="N",
        help=f"{lead}refuse profile versions below N (default 1)",
    )
    p.add_argument(
        "--bundle-configmap",
        metavar="NAME",
        help=f"{lead}the ConfigMap name the servers are configured with (default: the one it "
        "carries)",
    )


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the profile, its trust and the planning settings (`tmi plan`'s)."""
    p.add_argument(
        "--bundle", metavar="CONFIGMAP_FILE", help="the signed profile ConfigMap (JSON or YAML)"
    )
    add_trust_arguments(p)
    p.add_argument("--now", metavar="T", help="decide at T (RFC 3339) instead of now")
    p.add_argument(
        "--engine-image-map",
        metavar="FILE",
        help="catalog image -> imported reference, as the servers' engineImageMap",
    )
    p.add_argument("--image-registry-prefix", metavar="P", help="as global.imageRegistryPrefix")
    p.add_argument("--airgap-registry", metavar="URL", help="as global.airgap.registry.url")
    p.add_argument(
        "--gpu-recipe-catalog", metavar="FILE", help="the GPU recipe catalog ConfigMap, if any"
    )
    p.add_argument(
        "--cpu-recipe-catalog", metavar="FILE", help="the CPU recipe catalog ConfigMap, if any"
    )


def verify_policy(args: argparse.Namespace, configmap: Any) -> VerifyPolicy:
    """What the servers verify a profile ConfigMap against, from the trust flags."""
    try:
        trusted = TrustedKeys.from_base64(keys(args.owner_public_key))
    except KeyError_ as exc:
        raise CommandError(f"--owner-public-key: {exc}", EXIT_USAGE) from None
    return VerifyPolicy(
        trusted=trusted,
        cluster_binding_id=args.cluster_binding_id,
        namespace=args.namespace,
        minimum_version=args.minimum_bundle_version,
        configmap_name=configmap_name(args, configmap),
    )


def policy_snapshot(
    args: argparse.Namespace, now: datetime, *, disabled: bool = False
) -> PolicySnapshot:
    """What the servers would plan with given these flags, their ConfigMaps read at ``now``: the
    files go through the servers' own feed (`policy_io.offline`), so the CLI answers as they do."""
    configmap: Any = None
    if not disabled:
        missing = [
            flag
            for flag, value in (
                ("--bundle", args.bundle),
                ("--owner-public-key", args.owner_public_key),
                ("--cluster-binding-id", args.cluster_binding_id),
                ("--namespace", args.namespace),
            )
            if not value
        ]
        if missing:
            raise CommandError(f"{', '.join(missing)} required unless --disabled", EXIT_USAGE)
        configmap = read_json(args.bundle, "bundle ConfigMap")
    settings = PolicySettings(
        enabled=not disabled,
        namespace=args.namespace or "kamiwaza",
        bundle_configmap=configmap_name(args, configmap),
        owner_public_keys=keys(args.owner_public_key) if args.owner_public_key else (),
        cluster_binding_id=args.cluster_binding_id or "",
        minimum_bundle_version=args.minimum_bundle_version,
        engine_image_map=image_map(args.engine_image_map),
        image_registry_prefix=args.image_registry_prefix,
        airgap_registry=args.airgap_registry,
    )
    catalogs: dict[Capability, Any] = {}
    if args.gpu_recipe_catalog:
        catalogs["gpu"] = read_json(args.gpu_recipe_catalog, "catalog")
    if args.cpu_recipe_catalog:
        catalogs["cpu"] = read_json(args.cpu_recipe_catalog, "catalog")
    feed = fed(
        settings,
        now,
        profile=configmap if configmap is not None else None,
        catalogs=catalogs,
        catalog=packaged_catalog(),
    )
    if feed.state.trust_error and not disabled:
        raise CommandError(f"--owner-public-key: {feed.state.trust_error}", EXIT_USAGE)
    snapshot = feed.snapshot
    for capability in catalogs:
        recipes = snapshot.recipes(capability)
        # A file that is no catalog is a mistake in the command, not a refusal to plan with.
        if isinstance(recipes, CatalogUnavailable) and recipes.cause is Cause.INVALID:
            raise CommandError(recipes.detail)
    return snapshot
