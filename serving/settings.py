"""Settings from flags with `TMI_*` environment fallbacks, each value checked once, at start.

The charts set environment variables and a person debugging runs a server with flags, so every
setting accepts both and a flag wins over its variable. The options the servers have in common
are defined once here, so that one values block names a setting by the same flag, variable and
help text in every server; each server lists the options it takes in its own order.

A setting that cannot be used raises `ConfigError` naming the flag (and its variable), which a
server's entry point turns into `error: ...` and exit status 2, the status argparse itself uses
for an unknown flag.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn, TypedDict

from inference_policy.base import strictjson
from policy_io import caps
from policy_io.files import InputError, read_json
from policy_io.state import PolicySettings

HTTPS_PORT = 8443
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# aiohttp's own limit on a request line and on one header field; a real caller's headers (the
# API server's, kube-scheduler's) are a few hundred bytes.
DEFAULT_MAX_HEADER_BYTES = 8190
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_EPILOG = "Every flag may instead be given as the environment variable in brackets."


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag and its variable."""


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """How long and how much a caller may take before the server gives up on its connection.

    The callers (the API server, kube-scheduler) give up after their own timeout, 5 s as the
    shipped manifests set it and 30 s at most, so a body still arriving after `read_timeout`
    is from no caller that will read the answer; it gets 408 and its connection closed. A
    connection that sends no complete request head for `idle_timeout` seconds is closed, which
    bounds both a header trickle and an idle keep-alive connection; it is above the 90 s after
    which Go's HTTP client drops idle connections itself, so the client, not the server, ends
    an idle connection and never sends a request into one being closed. A TLS handshake gets
    `tls_handshake_timeout` seconds instead of asyncio's 60. `max_header_bytes` caps the request
    line and each header field (431/400 past it), `max_headers` their number.
    """

    read_timeout: float = 10.0
    idle_timeout: float = 120.0
    tls_handshake_timeout: float = 10.0
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = 128
    # How long the server keeps reading a body it will not use (a 408 or a 413 answered before
    # the body ended) so the caller reads the answer rather than a reset; a trickle is cut then.
    linger_seconds: float = 1.0

    def handler_options(self) -> dict[str, Any]:
        """The keyword arguments aiohttp's request handler takes for these limits."""
        return {
            "keepalive_timeout": self.idle_timeout,
            "max_line_size": self.max_header_bytes,
            "max_field_size": self.max_header_bytes,
            "max_headers": self.max_headers,
            "lingering_time": self.linger_seconds,
        }


@dataclass(frozen=True, kw_only=True)
class ServingSettings:
    """What a server that answers calls over HTTPS takes besides its own settings: the policy
    it serves, where it listens and with which certificate, and how it stops."""

    policy: PolicySettings
    cert_file: str = ""
    key_file: str = ""
    host: str | None = None
    port: int = HTTPS_PORT
    kubeconfig: str | None = None
    cert_reload_seconds: float = 10.0
    shutdown_timeout: float = 15.0
    drain_seconds: float = 3.0
    log_level: str = "INFO"
    limits: ConnectionLimits = ConnectionLimits()
    # A plain-HTTP port for /metrics and the probes, apart from the serving port, so that a
    # NetworkPolicy (which sees ports, not paths) can admit the monitoring namespace to metrics
    # alone. None keeps /metrics on the serving port.
    metrics_port: int | None = None

    @property
    def namespace(self) -> str:
        return self.policy.namespace


class RevisionCaps(TypedDict):
    """`REVISION_CAPS` as read, by the `PolicySettings` fields they set."""

    max_profile_revisions: int
    max_revision_bytes: int


class Option(NamedTuple):
    """A setting given as `flag` or as the variable `env`; `repeated` flags accumulate."""

    flag: str
    env: str
    help: str
    repeated: bool = False


NAMESPACE = Option(
    "--namespace", "TMI_NAMESPACE", "the Kamiwaza namespace (default: $POD_NAMESPACE)"
)
BUNDLE_CONFIGMAP = Option(
    "--bundle-configmap", "TMI_BUNDLE_CONFIGMAP", "name of the signed profile ConfigMap"
)
# Repeated and comma-separated both, so a key rotation can trust two keys at once.
OWNER_PUBLIC_KEY = Option(
    "--owner-public-key", "TMI_OWNER_PUBLIC_KEY", "trusted owner key(s), comma-separated", True
)
CLUSTER_BINDING_ID = Option(
    "--cluster-binding-id", "TMI_CLUSTER_BINDING_ID", "this cluster's binding id"
)
MINIMUM_BUNDLE_VERSION = Option(
    "--minimum-bundle-version", "TMI_MINIMUM_BUNDLE_VERSION", "lowest profile version accepted"
)
ENGINE_IMAGE_MAP = Option(
    "--engine-image-map", "TMI_ENGINE_IMAGE_MAP", "engine image map: a JSON file or inline JSON"
)
IMAGE_REGISTRY_PREFIX = Option(
    "--image-registry-prefix", "TMI_IMAGE_REGISTRY_PREFIX", "global.imageRegistryPrefix"
)
AIRGAP_REGISTRY = Option("--airgap-registry", "TMI_AIRGAP_REGISTRY", "global.airgap.registry.url")
GPU_RECIPE_CATALOG_CONFIGMAP = Option(
    "--gpu-recipe-catalog-configmap", "TMI_GPU_RECIPE_CATALOG_CONFIGMAP", "GPU recipe catalog"
)
CPU_RECIPE_CATALOG_CONFIGMAP = Option(
    "--cpu-recipe-catalog-configmap", "TMI_CPU_RECIPE_CATALOG_CONFIGMAP", "CPU recipe catalog"
)
CERT = Option("--cert", "TMI_TLS_CERT", "serving certificate chain (PEM)")
KEY = Option("--key", "TMI_TLS_KEY", "serving private key (PEM)")
HOST = Option("--host", "TMI_HOST", "address to listen on (default: every address)")
KUBECONFIG = Option(
    "--kubeconfig", "TMI_KUBECONFIG", "kubeconfig file (default: in-cluster service account)"
)
CERT_RELOAD_SECONDS = Option(
    "--cert-reload-seconds", "TMI_CERT_RELOAD_SECONDS", "how often to look for a new cert"
)
SHUTDOWN_TIMEOUT = Option(
    "--shutdown-timeout", "TMI_SHUTDOWN_TIMEOUT", "seconds in-flight requests get on SIGTERM"
)
DRAIN_SECONDS = Option(
    "--drain-seconds", "TMI_DRAIN_SECONDS", "seconds to keep serving, unready, after SIGTERM"
)
MAX_BODY_BYTES = Option("--max-body-bytes", "TMI_MAX_BODY_BYTES", "largest request body accepted")
LOG_LEVEL = Option("--log-level", "TMI_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR")
READ_TIMEOUT = Option(
    "--read-timeout", "TMI_READ_TIMEOUT", "seconds a request body may take to arrive (default 10)"
)
IDLE_TIMEOUT = Option(
    "--idle-timeout",
    "TMI_IDLE_TIMEOUT",
    "seconds a connection may wait for its next request head (default 120)",
)
TLS_HANDSHAKE_TIMEOUT = Option(
    "--tls-handshake-timeout",
    "TMI_TLS_HANDSHAKE_TIMEOUT",
    "seconds a TLS handshake may take (default 10)",
)
MAX_HEADER_BYTES = Option(
    "--max-header-bytes",
    "TMI_MAX_HEADER_BYTES",
    f"longest request line or header field (default {DEFAULT_MAX_HEADER_BYTES})",
)
# What a slow or abusive caller may hold: every server that answers calls takes the same four.
LIMITS = (READ_TIMEOUT, IDLE_TIMEOUT, TLS_HANDSHAKE_TIMEOUT, MAX_HEADER_BYTES)
METRICS_PORT = Option(
    "--metrics-port",
    "TMI_METRICS_PORT",
    "plain-HTTP port for /metrics and the probes only, apart from the serving port (default: "
    "/metrics on the serving port)",
)

# The trust a profile is verified with: every server takes the same three, so that all of them
# accept exactly the same profile revisions.
TRUST = (OWNER_PUBLIC_KEY, CLUSTER_BINDING_ID, MINIMUM_BUNDLE_VERSION)
# What tenant data may cost each server that follows profile revisions (`policy_io.caps`).
MAX_PROFILE_REVISIONS = Option(
    "--max-profile-revisions",
    "TMI_MAX_PROFILE_REVISIONS",
    "verified profile revisions kept per tenant namespace; a labelled ConfigMap arriving "
    f"beyond them is refused unverified (default {caps.MAX_PROFILE_REVISIONS})",
)
MAX_PROFILE_REVISION_BYTES = Option(
    "--max-profile-revision-bytes",
    "TMI_MAX_PROFILE_REVISION_BYTES",
    "most data a profile ConfigMap may carry; a larger one is refused unread "
    f"(default {caps.MAX_REVISION_BYTES})",
)
REVISION_CAPS = (MAX_PROFILE_REVISIONS, MAX_PROFILE_REVISION_BYTES)
# What a plan depends on besides the profile: the webhook plans with these and the controller
# re-derives the webhook's plans with them.
PLANNING = (
    ENGINE_IMAGE_MAP,
    IMAGE_REGISTRY_PREFIX,
    AIRGAP_REGISTRY,
    GPU_RECIPE_CATALOG_CONFIGMAP,
    CPU_RECIPE_CATALOG_CONFIGMAP,
)


class Parser(argparse.ArgumentParser):
    """An argument parser whose refusal reads like a refused setting: `error: ...`, status 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


def new_parser(prog: str, description: str) -> Parser:
    return Parser(prog=prog, description=description, epilog=_EPILOG)


def add_follow_flag(parser: argparse.ArgumentParser) -> None:
    """`--follow-profile-revisions`: the servers that plan or place follow the newest verified
    signed profile ConfigMap instead of the one `--bundle-configmap` names."""
    parser.add_argument(
        "--follow-profile-revisions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan with the newest verified signed profile ConfigMap (label "
        "kamiwaza.ai/inference-profile=true) instead of --bundle-configmap; publishing a "
        "revision is then the only step [TMI_FOLLOW_PROFILE_REVISIONS]",
    )


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """One flag per option, its variable named in its help. No defaults: an absent flag must
    stay distinguishable from a given one, so that it can fall back to its variable."""
    for option in options:
        parser.add_argument(
            option.flag,
            action="append" if option.repeated else "store",
            help=f"{option.help} [{option.env}]",
        )


def parse_bool(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{where}: {text!r} is not true or false")


def parse_whole(text: str, where: str, minimum: int, maximum: int) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a whole number") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{where}: {value} is outside {minimum}..{maximum}")
    return value


def parse_seconds(text: str, where: str) -> float:
    """A duration of less than a day; 0 turns off what it paces."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a number") from None
    if not 0 <= value < 86400:
        raise ConfigError(f"{where}: {value} is outside 0..86400 seconds")
    return value


def parse_number(text: str, where: str, minimum: float, maximum: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a number") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{where}: {value} is outside {minimum:g}..{maximum:g}")
    return value


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_image_map(
    value: str,
    where: str = ENGINE_IMAGE_MAP.flag,
    expected: str = "the engine image map must be a JSON object from each catalog image to "
    "the reference it was imported as",
) -> dict[str, str]:
    """An engine image map given inline (a JSON object) or as the path of a JSON file;
    `expected` says what it must be when it is JSON of another shape."""
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
        raise ConfigError(f"{where}: {expected}")
    return document


class Given:
    """What was given for each option: its flag, else its variable when that is not empty."""

    def __init__(
        self,
        args: argparse.Namespace,
        options: Sequence[Option],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.args = args
        self.env = dict(os.environ if environ is None else environ)
        self._variables = {option.flag: option.env for option in options}

    @classmethod
    def parse(
        cls,
        parser: argparse.ArgumentParser,
        options: Sequence[Option],
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Given:
        return cls(parser.parse_args(argv), options, environ)

    def get(self, flag: str) -> str | None:
        """The text given for `flag`; a repeated flag's values joined by commas."""
        value = getattr(self.args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value != []:
            return ",".join(value) if isinstance(value, list) else str(value)
        found = self.env.get(self._variables[flag])
        return found if found not in (None, "") else None

    def switch(self, dest: str, variable: str, default: bool) -> bool:
        """An on/off flag (`--x`/`--no-x`), else its variable, else `default`."""
        value = getattr(self.args, dest, None)
        if value is not None:
            return bool(value)
        text = self.env.get(variable, "")
        return default if not text.strip() else parse_bool(text, variable)

    def whole(self, flag: str, default: int, minimum: int, maximum: int) -> int:
        value = self.get(flag)
        return parse_whole(value, flag, minimum, maximum) if value else default

    def seconds(self, flag: str, default: float) -> float:
        value = self.get(flag)
        return parse_seconds(value, flag) if value else default

    def number(self, flag: str, default: float, minimum: float, maximum: float) -> float:
        value = self.get(flag)
        return parse_number(value, flag, minimum, maximum) if value else default

    def limits(self) -> ConnectionLimits:
        """The connection limits (`LIMITS`), each within bounds a server can live with."""
        defaults = ConnectionLimits()
        return ConnectionLimits(
            read_timeout=self.number(READ_TIMEOUT.flag, defaults.read_timeout, 0.1, 3600),
            idle_timeout=self.number(IDLE_TIMEOUT.flag, defaults.idle_timeout, 1, 86400),
            tls_handshake_timeout=self.number(
                TLS_HANDSHAKE_TIMEOUT.flag, defaults.tls_handshake_timeout, 0.1, 600
            ),
            max_header_bytes=self.whole(
                MAX_HEADER_BYTES.flag, defaults.max_header_bytes, 1024, 1024 * 1024
            ),
        )

    def revision_caps(self) -> RevisionCaps:
        """`REVISION_CAPS`, as the `PolicySettings` fields they set."""
        return {
            "max_profile_revisions": self.whole(
                MAX_PROFILE_REVISIONS.flag, caps.MAX_PROFILE_REVISIONS, 1, 4096
            ),
            "max_revision_bytes": self.whole(
                MAX_PROFILE_REVISION_BYTES.flag, caps.MAX_REVISION_BYTES, 4096, caps.CEILING_BYTES
            ),
        }

    def optional(self, flag: str) -> str | None:
        """`get` for an option this server may not offer (None when it does not)."""
        return self.get(flag) if flag in self._variables else None

    def policy(
        self, *, enabled: bool, trust_required: bool, namespace_required: bool = True
    ) -> PolicySettings:
        """The policy settings every server reads from the same options, assembled and checked
        here once: the tenant namespace (else the Pod's own, `POD_NAMESPACE`), the trust, the
        profile and recipe ConfigMaps, the image relocation and the revision caps, each refused
        with the flag and its variable named. `trust_required`: the owner's key and binding id
        must be given while tenant mode is on; without `namespace_required` they are a
        multi-tenant server's shared settings, each tenant's given elsewhere."""
        optional = self.optional
        namespace = optional(NAMESPACE.flag) or self.env.get("POD_NAMESPACE") or ""
        if namespace_required and not namespace:
            raise ConfigError("--namespace (or TMI_NAMESPACE, or POD_NAMESPACE) is required")
        keys = split_list(optional(OWNER_PUBLIC_KEY.flag) or "")
        binding = optional(CLUSTER_BINDING_ID.flag) or ""
        required = enabled and trust_required and namespace_required
        if required and not keys:
            raise ConfigError("--owner-public-key (or TMI_OWNER_PUBLIC_KEY) is required")
        if required and not binding:
            raise ConfigError("--cluster-binding-id (or TMI_CLUSTER_BINDING_ID) is required")
        image_map = optional(ENGINE_IMAGE_MAP.flag)
        defaults = PolicySettings()
        return PolicySettings(
            enabled=enabled,
            namespace=namespace,
            bundle_configmap=optional(BUNDLE_CONFIGMAP.flag) or defaults.bundle_configmap,
            follow_revisions=self.follow_revisions(),
            owner_public_keys=keys,
            cluster_binding_id=binding,
            minimum_bundle_version=(
                self.whole(MINIMUM_BUNDLE_VERSION.flag, 1, 1, 2**53 - 1)
                if MINIMUM_BUNDLE_VERSION.flag in self._variables
                else 1
            ),
            engine_image_map=parse_image_map(image_map) if image_map else None,
            image_registry_prefix=optional(IMAGE_REGISTRY_PREFIX.flag),
            airgap_registry=optional(AIRGAP_REGISTRY.flag),
            gpu_recipe_catalog_configmap=optional(GPU_RECIPE_CATALOG_CONFIGMAP.flag),
            cpu_recipe_catalog_configmap=optional(CPU_RECIPE_CATALOG_CONFIGMAP.flag),
            gpu_registry_credentials_secret=optional("--gpu-registry-credentials-secret"),
            cpu_registry_credentials_secret=optional("--cpu-registry-credentials-secret"),
            scheduler_name=optional("--scheduler-name") or defaults.scheduler_name,
            **self.revision_caps(),
        )

    def follow_revisions(self) -> bool:
        """`add_follow_flag`'s switch, else TMI_FOLLOW_PROFILE_REVISIONS, else off."""
        return self.switch("follow_profile_revisions", "TMI_FOLLOW_PROFILE_REVISIONS", False)

    def own_port(self, flag: str, *taken: int | None) -> int | None:
        """A port some paths are served on alone (`--metrics-port`, `--plan-port`), if one is
        given; never one already `taken` by the serving port or another such port."""
        value = self.get(flag)
        if not value:
            return None
        port = parse_whole(value, flag, 1, 65535)
        if port in taken:
            raise ConfigError(f"{flag} {port} is already the serving or another port; give another")
        return port

    def kubeconfig(self) -> str | None:
        """The kubeconfig flag or variable, else `KUBECONFIG` as kubectl reads it; None for the
        in-cluster service account."""
        return self.get(KUBECONFIG.flag) or self.env.get("KUBECONFIG") or None

    def log_level(self) -> str:
        level = (self.get(LOG_LEVEL.flag) or "INFO").upper()
        if level not in LOG_LEVELS:
            raise ConfigError(f"--log-level: {level!r} is not DEBUG, INFO, WARNING or ERROR")
        return level
