"""The extender's settings, from flags or `TMI_*` environment variables.

The Deployment sets environment variables and a person debugging runs the module with flags, so
every setting accepts both and a flag wins over its variable. The profile settings are the same
`PolicySettings` the webhook and `tmi verify` take, so the extender trusts exactly the profile
revision the webhook planned with.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from inference_policy.signing import DEFAULT_CONFIGMAP_NAME
from policy_io.state import PolicySettings

DEFAULT_PORT = 8443
# Full-node mode carries every candidate Node object in one body; a few thousand real Nodes
# (with their images lists) fit comfortably in this.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
ALL_NAMESPACES = "*"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag and its variable."""


@dataclass(frozen=True)
class ExtenderSettings:
    """Everything the extender process needs besides what it reads from the API at run time."""

    policy: PolicySettings
    pod_namespaces: tuple[str, ...]
    cert_file: str = ""
    key_file: str = ""
    plain_http: bool = False
    host: str | None = None
    port: int = DEFAULT_PORT
    kubeconfig: str | None = None
    cert_reload_seconds: float = 10.0
    resync_seconds: int = 1800
    watch_seconds: int = 300
    shutdown_timeout: float = 15.0
    drain_seconds: float = 3.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    log_level: str = "INFO"

    @property
    def namespace(self) -> str:
        return self.policy.namespace


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--namespace", "TMI_NAMESPACE", "the tenant namespace holding the signed profile"),
    ("--bundle-configmap", "TMI_BUNDLE_CONFIGMAP", "name of the signed profile ConfigMap"),
    ("--owner-public-key", "TMI_OWNER_PUBLIC_KEY", "trusted owner key(s), comma-separated"),
    ("--cluster-binding-id", "TMI_CLUSTER_BINDING_ID", "this cluster's binding id"),
    ("--minimum-bundle-version", "TMI_MINIMUM_BUNDLE_VERSION", "lowest profile version accepted"),
    (
        "--pod-namespaces",
        "TMI_POD_NAMESPACES",
        "namespaces whose engine Pods are accounted, comma-separated, or * for all "
        "(default: --namespace)",
    ),
    ("--cert", "TMI_TLS_CERT", "serving certificate chain (PEM)"),
    ("--key", "TMI_TLS_KEY", "serving private key (PEM)"),
    ("--host", "TMI_HOST", "address to listen on (default: every address)"),
    ("--port", "TMI_PORT", f"port (default {DEFAULT_PORT})"),
    ("--kubeconfig", "TMI_KUBECONFIG", "kubeconfig file (default: in-cluster service account)"),
    ("--cert-reload-seconds", "TMI_CERT_RELOAD_SECONDS", "how often to look for a new cert"),
    ("--resync-seconds", "TMI_RESYNC_SECONDS", "how often to re-list nodes, pods and profile"),
    ("--watch-seconds", "TMI_WATCH_SECONDS", "length of one watch request"),
    ("--shutdown-timeout", "TMI_SHUTDOWN_TIMEOUT", "seconds in-flight requests get on SIGTERM"),
    ("--drain-seconds", "TMI_DRAIN_SECONDS", "seconds to keep serving, unready, after SIGTERM"),
    ("--max-body-bytes", "TMI_MAX_BODY_BYTES", "largest request body accepted"),
    ("--log-level", "TMI_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tmi-extender",
        description="kube-scheduler extender: places planned engine Pods on the hardware their "
        "signed binding vouches for.",
        epilog="Every flag may instead be given as the environment variable in brackets.",
    )
    parser.add_argument(
        "--plain-http",
        action="store_true",
        default=None,
        help="serve plain HTTP instead of HTTPS, for a loopback test only [TMI_PLAIN_HTTP]",
    )
    for flag, env, text in _OPTIONS:
        parser.add_argument(
            flag,
            action="append" if flag == "--owner-public-key" else "store",
            help=f"{text} [{env}]",
        )
    return parser


def _bool(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{where}: {text!r} is not true or false")


def _int(text: str, where: str, minimum: int, maximum: int) -> int:
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


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ExtenderSettings:
    """Parse flags, fall back to the environment, and check every value once, here."""
    args = build_parser().parse_args(argv)
    env = dict(os.environ if environ is None else environ)

    def get(flag: str) -> str | None:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value != []:
            return ",".join(value) if isinstance(value, list) else str(value)
        var = next(e for f, e, _ in _OPTIONS if f == flag)
        found = env.get(var)
        return found if found not in (None, "") else None

    namespace = get("--namespace") or env.get("POD_NAMESPACE") or ""
    if not namespace:
        raise ConfigError("--namespace (or TMI_NAMESPACE) is required")
    keys = _split(get("--owner-public-key") or "")
    if not keys:
        raise ConfigError("--owner-public-key (or TMI_OWNER_PUBLIC_KEY) is required")
    binding = get("--cluster-binding-id")
    if not binding:
        raise ConfigError("--cluster-binding-id (or TMI_CLUSTER_BINDING_ID) is required")
    minimum = get("--minimum-bundle-version")
    policy = PolicySettings(
        enabled=True,
        namespace=namespace,
        bundle_configmap=get("--bundle-configmap") or DEFAULT_CONFIGMAP_NAME,
        owner_public_keys=keys,
        cluster_binding_id=binding,
        minimum_bundle_version=(
            _int(minimum, "--minimum-bundle-version", 1, 2**53 - 1) if minimum else 1
        ),
    )
    pod_namespaces = _split(get("--pod-namespaces") or namespace)
    if ALL_NAMESPACES in pod_namespaces and len(pod_namespaces) > 1:
        raise ConfigError("--pod-namespaces: * (all namespaces) cannot be combined with names")
    plain = args.plain_http
    if plain is None:
        plain = _bool(env.get("TMI_PLAIN_HTTP", ""), "TMI_PLAIN_HTTP")
    cert, key = get("--cert"), get("--key")
    if not plain and (not cert or not key):
        raise ConfigError(
            "--cert and --key (or TMI_TLS_CERT and TMI_TLS_KEY) are required; kube-scheduler "
            "reaches the extender over HTTPS"
        )
    level = (get("--log-level") or "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level: {level!r} is not DEBUG, INFO, WARNING or ERROR")
    defaults = ExtenderSettings(policy=policy, pod_namespaces=pod_namespaces)

    def seconds(flag: str, default: float) -> float:
        value = get(flag)
        return _float(value, flag) if value else default

    def whole(flag: str, default: int, low: int, high: int) -> int:
        value = get(flag)
        return _int(value, flag, low, high) if value else default

    return ExtenderSettings(
        policy=policy,
        pod_namespaces=pod_namespaces,
        cert_file=cert or "",
        key_file=key or "",
        plain_http=plain,
        host=get("--host"),
        port=whole("--port", DEFAULT_PORT, 1, 65535),
        kubeconfig=get("--kubeconfig") or env.get("KUBECONFIG") or None,
        cert_reload_seconds=seconds("--cert-reload-seconds", defaults.cert_reload_seconds),
        resync_seconds=whole("--resync-seconds", defaults.resync_seconds, 30, 86400),
        watch_seconds=whole("--watch-seconds", defaults.watch_seconds, 10, 3600),
        shutdown_timeout=seconds("--shutdown-timeout", defaults.shutdown_timeout),
        drain_seconds=seconds("--drain-seconds", defaults.drain_seconds),
        max_body_bytes=whole(
            "--max-body-bytes", defaults.max_body_bytes, 64 * 1024, 512 * 1024 * 1024
        ),
        log_level=level,
    )
