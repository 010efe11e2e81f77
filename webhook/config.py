"""The webhook's settings, from flags or `TMI_*` environment variables, mirroring the Helm values.

The chart sets environment variables and a person debugging runs the module with flags, so every
setting accepts both; a flag wins over its variable. The policy half of the settings is the same
`PolicySettings` that `tmi plan` builds, which is what keeps `/v1/plan` and `tmi plan` in step.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from inference_policy import strictjson
from inference_policy.signing import DEFAULT_CONFIGMAP_NAME
from policy_io.files import InputError, read_json
from policy_io.state import PolicySettings

DEFAULT_PORT = 8443
# An UPDATE review carries the Pod twice, and etcd holds objects of up to 1.5 MiB, so the largest
# legitimate review is a little over 3 MiB; anything larger is not a review of a real Pod.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_SCHEDULER = PolicySettings().scheduler_name
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag and its variable."""


@dataclass(frozen=True)
class ServerSettings:
    """Everything the webhook process needs besides the ConfigMaps it reads at run time."""

    policy: PolicySettings
    cert_file: str = ""
    key_file: str = ""
    host: str | None = None
    port: int = DEFAULT_PORT
    kubeconfig: str | None = None
    cert_reload_seconds: float = 10.0
    resync_seconds: int = 300
    shutdown_timeout: float = 15.0
    drain_seconds: float = 3.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    log_level: str = "INFO"

    @property
    def namespace(self) -> str:
        return self.policy.namespace


def _bool(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{where}: {text!r} is not true or false")


def _int(text: str, where: str, minimum: int = 0, maximum: int = 2**31) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a whole number") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{where}: {value} is outside {minimum}..{maximum}")
    return value


def _float(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a number") from None
    if not 0 <= value < 86400:
        raise ConfigError(f"{where}: {value} is outside 0..86400 seconds")
    return value


def parse_image_map(value: str, where: str = "--engine-image-map") -> dict[str, str]:
    """An engine image map given inline (a JSON object) or as the path of a JSON file."""
    try:
        if value.lstrip().startswith(("{", "[")):
            document = strictjson.loads(value, what=f"{where} (inline JSON)")
        else:
            document = read_json(value, "engine image map")
    except (strictjson.StrictJSONError, InputError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not isinstance(document, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in document.items()
    ):
        raise ConfigError(
            f"{where}: the engine image map must be a JSON object from each catalog image "
            "to the reference it was imported as"
        )
    return document


def split_keys(values: Sequence[str]) -> tuple[str, ...]:
    """Owner public keys: repeated and/or comma-separated, so a rotation can trust two at once."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


# (flag, environment variable, help). Defaults are applied in `settings_from_args`, so that an
# absent flag can fall back to its variable.
_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--bundle-configmap", "TMI_BUNDLE_CONFIGMAP", "name of the signed profile ConfigMap"),
    ("--owner-public-key", "TMI_OWNER_PUBLIC_KEY", "trusted owner key(s), comma-separated"),
    ("--cluster-binding-id", "TMI_CLUSTER_BINDING_ID", "this cluster's binding id"),
    ("--minimum-bundle-version", "TMI_MINIMUM_BUNDLE_VERSION", "lowest profile version accepted"),
    ("--engine-image-map", "TMI_ENGINE_IMAGE_MAP", "engine image map: a JSON file or inline JSON"),
    ("--image-registry-prefix", "TMI_IMAGE_REGISTRY_PREFIX", "global.imageRegistryPrefix"),
    ("--airgap-registry", "TMI_AIRGAP_REGISTRY", "global.airgap.registry.url"),
    ("--gpu-recipe-catalog-configmap", "TMI_GPU_RECIPE_CATALOG_CONFIGMAP", "GPU recipe catalog"),
    ("--cpu-recipe-catalog-configmap", "TMI_CPU_RECIPE_CATALOG_CONFIGMAP", "CPU recipe catalog"),
    (
        "--gpu-registry-credentials-secret",
        "TMI_GPU_REGISTRY_CREDENTIALS_SECRET",
        "pull Secret for GPU engine Pods",
    ),
    (
        "--cpu-registry-credentials-secret",
        "TMI_CPU_REGISTRY_CREDENTIALS_SECRET",
        "pull Secret for CPU engine Pods",
    ),
    ("--scheduler-name", "TMI_SCHEDULER_NAME", "schedulerName set on engine Pods"),
    ("--namespace", "TMI_NAMESPACE", "the Kamiwaza namespace (default: $POD_NAMESPACE)"),
    ("--cert", "TMI_TLS_CERT", "serving certificate chain (PEM)"),
    ("--key", "TMI_TLS_KEY", "serving private key (PEM)"),
    ("--host", "TMI_HOST", "address to listen on (default: every address)"),
    ("--port", "TMI_PORT", f"HTTPS port (default {DEFAULT_PORT})"),
    ("--kubeconfig", "TMI_KUBECONFIG", "kubeconfig file (default: in-cluster service account)"),
    ("--cert-reload-seconds", "TMI_CERT_RELOAD_SECONDS", "how often to look for a new cert"),
    ("--resync-seconds", "TMI_RESYNC_SECONDS", "how often to re-list the ConfigMaps"),
    ("--shutdown-timeout", "TMI_SHUTDOWN_TIMEOUT", "seconds in-flight requests get on SIGTERM"),
    ("--drain-seconds", "TMI_DRAIN_SECONDS", "seconds to keep serving, unready, after SIGTERM"),
    ("--max-body-bytes", "TMI_MAX_BODY_BYTES", "largest request body accepted"),
    ("--log-level", "TMI_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tmi-webhook",
        description="Tenant-mode inference admission webhook and plan API (HTTPS).",
        epilog="Every flag may instead be given as the environment variable in brackets.",
    )
    parser.add_argument(
        "--enabled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tenant-mode inference on [TMI_ENABLED] (default: off, as the chart's default)",
    )
    for flag, env, text in _OPTIONS:
        parser.add_argument(
            flag,
            action="append" if flag == "--owner-public-key" else "store",
            help=f"{text} [{env}]",
        )
    return parser


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ServerSettings:
    """Parse flags, fall back to the environment, and check every value once, here."""
    args = build_parser().parse_args(argv)
    env = dict(os.environ if environ is None else environ)

    def get(flag: str) -> str | None:
        dest = flag.lstrip("-").replace("-", "_")
        value = getattr(args, dest)
        if value is not None and value != []:
            return ",".join(value) if isinstance(value, list) else str(value)
        var = next(e for f, e, _ in _OPTIONS if f == flag)
        found = env.get(var)
        return found if found not in (None, "") else None

    enabled = args.enabled
    if enabled is None:
        enabled = _bool(env.get("TMI_ENABLED", ""), "TMI_ENABLED")
    namespace = get("--namespace") or env.get("POD_NAMESPACE") or ""
    if not namespace:
        raise ConfigError("--namespace (or TMI_NAMESPACE, or POD_NAMESPACE) is required")
    image_map = get("--engine-image-map")
    minimum = get("--minimum-bundle-version")
    policy = PolicySettings(
        enabled=enabled,
        namespace=namespace,
        bundle_configmap=get("--bundle-configmap") or DEFAULT_CONFIGMAP_NAME,
        owner_public_keys=split_keys([get("--owner-public-key") or ""]),
        cluster_binding_id=get("--cluster-binding-id") or "",
        minimum_bundle_version=(
            _int(minimum, "--minimum-bundle-version", 1, 2**53 - 1) if minimum else 1
        ),
        engine_image_map=parse_image_map(image_map) if image_map else None,
        image_registry_prefix=get("--image-registry-prefix"),
        airgap_registry=get("--airgap-registry"),
        gpu_recipe_catalog_configmap=get("--gpu-recipe-catalog-configmap"),
        cpu_recipe_catalog_configmap=get("--cpu-recipe-catalog-configmap"),
        gpu_registry_credentials_secret=get("--gpu-registry-credentials-secret"),
        cpu_registry_credentials_secret=get("--cpu-registry-credentials-secret"),
        scheduler_name=get("--scheduler-name") or DEFAULT_SCHEDULER,
    )
    cert, key = get("--cert"), get("--key")
    if not cert or not key:
        raise ConfigError("--cert and --key (or TMI_TLS_CERT and TMI_TLS_KEY) are required")
    port = get("--port")
    level = (get("--log-level") or "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level: {level!r} is not DEBUG, INFO, WARNING or ERROR")
    defaults = ServerSettings(policy=policy)

    def seconds(flag: str, default: float) -> float:
        value = get(flag)
        return _float(value, flag) if value else default

    body = get("--max-body-bytes")
    resync = get("--resync-seconds")
    return ServerSettings(
        policy=policy,
        cert_file=cert,
        key_file=key,
        host=get("--host"),
        port=_int(port, "--port", 1, 65535) if port else DEFAULT_PORT,
        kubeconfig=get("--kubeconfig") or env.get("KUBECONFIG") or None,
        cert_reload_seconds=seconds("--cert-reload-seconds", defaults.cert_reload_seconds),
        resync_seconds=(
            _int(resync, "--resync-seconds", 10, 86400) if resync else defaults.resync_seconds
        ),
        shutdown_timeout=seconds("--shutdown-timeout", defaults.shutdown_timeout),
        drain_seconds=seconds("--drain-seconds", defaults.drain_seconds),
        max_body_bytes=(
            _int(body, "--max-body-bytes", 64 * 1024, 64 * 1024 * 1024)
            if body
            else defaults.max_body_bytes
        ),
        log_level=level,
    )
