"""The controller's settings, from flags or environment variables.

The chart sets environment variables and a person debugging runs the module with flags, so every
setting accepts both, and a flag wins. The policy settings use the webhook's variable names
(`TMI_OWNER_PUBLIC_KEY`, `TMI_CLUSTER_BINDING_ID`, `TMI_ENGINE_IMAGE_MAP`, ...) so one values
block configures both: the controller must re-derive exactly the plans the webhook made, and it
can only do that with the same catalog relocation, recipe catalogs and trust. The namespace and
the leader identity come from the downward API (`POD_NAMESPACE`, `POD_NAME`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from allocation_controller.leader import LeaderSettings
from inference_policy import strictjson
from inference_policy.grant import DEFAULT_SCHEDULING_TIMEOUT
from policy_io.files import InputError, read_json
from policy_io.state import PolicySettings

DEFAULT_PORT = 8080
DEFAULT_LEASE = "tmi-allocation-controller"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class ControllerSettings:
    policy: PolicySettings
    kubeconfig: str | None = None
    host: str | None = None
    port: int = DEFAULT_PORT
    scheduling_timeout: float = DEFAULT_SCHEDULING_TIMEOUT
    leader_elect: bool = True
    leader: LeaderSettings = field(
        default_factory=lambda: LeaderSettings(name=DEFAULT_LEASE, identity="allocation-controller")
    )
    workers: int = 8
    api_timeout: float = 4.0
    watch_timeout: int = 300
    reconcile_timeout: float = 30.0
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
    ("--namespace", "TMI_NAMESPACE", "the Kamiwaza namespace (default: $POD_NAMESPACE)"),
    ("--kubeconfig", "TMI_KUBECONFIG", "kubeconfig file (default: in-cluster service account)"),
    ("--owner-public-key", "TMI_OWNER_PUBLIC_KEY", "trusted owner key(s), comma-separated"),
    ("--cluster-binding-id", "TMI_CLUSTER_BINDING_ID", "this cluster's binding id"),
    ("--minimum-bundle-version", "TMI_MINIMUM_BUNDLE_VERSION", "lowest profile version accepted"),
    ("--engine-image-map", "TMI_ENGINE_IMAGE_MAP", "engine image map: a JSON file or inline JSON"),
    ("--image-registry-prefix", "TMI_IMAGE_REGISTRY_PREFIX", "global.imageRegistryPrefix"),
    ("--airgap-registry", "TMI_AIRGAP_REGISTRY", "global.airgap.registry.url"),
    ("--gpu-recipe-catalog-configmap", "TMI_GPU_RECIPE_CATALOG_CONFIGMAP", "GPU recipe catalog"),
    ("--cpu-recipe-catalog-configmap", "TMI_CPU_RECIPE_CATALOG_CONFIGMAP", "CPU recipe catalog"),
    (
        "--scheduling-timeout-seconds",
        "TMI_SCHEDULING_TIMEOUT_SECONDS",
        f"report an unscheduled Pod after this long (default {int(DEFAULT_SCHEDULING_TIMEOUT)})",
    ),
    ("--lease-name", "TMI_LEASE_NAME", f"leader election Lease (default {DEFAULT_LEASE})"),
    ("--identity", "TMI_IDENTITY", "leader identity (default: $POD_NAME, else host name)"),
    ("--lease-duration", "TMI_LEASE_DURATION", "seconds a Lease holds (default 15)"),
    ("--renew-deadline", "TMI_RENEW_DEADLINE", "seconds the leader has to renew (default 10)"),
    ("--retry-period", "TMI_RETRY_PERIOD", "seconds between election rounds (default 2)"),
    ("--workers", "TMI_WORKERS", "concurrent reconciles (default 8)"),
    ("--api-timeout", "TMI_API_TIMEOUT", "seconds per API request (default 4)"),
    ("--host", "TMI_HOST", "address for /healthz, /readyz, /metrics (default: every address)"),
    ("--port", "TMI_PORT", f"HTTP port for /healthz, /readyz, /metrics (default {DEFAULT_PORT})"),
    ("--log-level", "TMI_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tmi-controller",
        description="Owns the kamiwaza.ai/AllocationVerified condition of engine Pods.",
        epilog="Every flag may instead be given as the environment variable in brackets.",
    )
    parser.add_argument(
        "--enabled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tenant-mode inference on [TMI_ENABLED] (default: on; the controller only runs "
        "where it is)",
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="elect a leader through a Lease [TMI_LEADER_ELECT] (default: on; off only for a "
        "single replica)",
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


def _number(text: str, where: str, minimum: float, maximum: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a number") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{where}: {value} is outside {minimum:g}..{maximum:g}")
    return value


def _image_map(value: str) -> dict[str, str]:
    try:
        if value.lstrip().startswith(("{", "[")):
            document = strictjson.loads(value, what="--engine-image-map (inline JSON)")
        else:
            document = read_json(value, "engine image map")
    except (strictjson.StrictJSONError, InputError) as exc:
        raise ConfigError(f"--engine-image-map: {exc}") from None
    if not isinstance(document, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in document.items()
    ):
        raise ConfigError("--engine-image-map: must be a JSON object of image references")
    return document


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ControllerSettings:
    """Parse flags, fall back to the environment, check every value once, here."""
    args = build_parser().parse_args(argv)
    env = dict(os.environ if environ is None else environ)

    def get(flag: str) -> str | None:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value != []:
            return ",".join(value) if isinstance(value, list) else str(value)
        var = next(e for f, e, _ in _OPTIONS if f == flag)
        found = env.get(var)
        return found if found not in (None, "") else None

    def flag_bool(dest: str, var: str) -> bool:
        value = getattr(args, dest)
        if value is not None:
            return bool(value)
        text = env.get(var, "")
        return True if text == "" else _bool(text, var)

    def number(flag: str, default: float, minimum: float, maximum: float) -> float:
        value = get(flag)
        return _number(value, flag, minimum, maximum) if value else default

    namespace = get("--namespace") or env.get("POD_NAMESPACE") or ""
    if not namespace:
        raise ConfigError("--namespace (or TMI_NAMESPACE, or POD_NAMESPACE) is required")
    keys = tuple(
        part.strip() for part in (get("--owner-public-key") or "").split(",") if part.strip()
    )
    enabled = flag_bool("enabled", "TMI_ENABLED")
    if enabled and not keys:
        raise ConfigError("--owner-public-key (or TMI_OWNER_PUBLIC_KEY) is required")
    binding = get("--cluster-binding-id") or ""
    if enabled and not binding:
        raise ConfigError("--cluster-binding-id (or TMI_CLUSTER_BINDING_ID) is required")
    image_map = get("--engine-image-map")
    policy = PolicySettings(
        enabled=enabled,
        namespace=namespace,
        owner_public_keys=keys,
        cluster_binding_id=binding,
        minimum_bundle_version=int(number("--minimum-bundle-version", 1, 1, 2**53 - 1)),
        engine_image_map=_image_map(image_map) if image_map else None,
        image_registry_prefix=get("--image-registry-prefix"),
        airgap_registry=get("--airgap-registry"),
        gpu_recipe_catalog_configmap=get("--gpu-recipe-catalog-configmap"),
        cpu_recipe_catalog_configmap=get("--cpu-recipe-catalog-configmap"),
    )
    identity = (
        get("--identity") or env.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    )
    try:
        leader = LeaderSettings(
            name=get("--lease-name") or DEFAULT_LEASE,
            identity=identity,
            lease_duration=number("--lease-duration", 15.0, 2, 3600),
            renew_deadline=number("--renew-deadline", 10.0, 1, 3600),
            retry_period=number("--retry-period", 2.0, 0.1, 600),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    api_timeout = number("--api-timeout", 4.0, 0.5, 120)
    margin = leader.lease_duration - leader.renew_deadline
    leader_elect = flag_bool("leader_elect", "TMI_LEADER_ELECT")
    if leader_elect and api_timeout >= margin:
        raise ConfigError(
            f"--api-timeout ({api_timeout:g}s) must be below lease duration minus renew deadline "
            f"({margin:g}s), so a write in flight cannot outlive this replica's leadership"
        )
    level = (get("--log-level") or "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level: {level!r} is not DEBUG, INFO, WARNING or ERROR")
    return ControllerSettings(
        policy=policy,
        kubeconfig=get("--kubeconfig") or env.get("KUBECONFIG") or None,
        host=get("--host"),
        port=int(number("--port", DEFAULT_PORT, 1, 65535)),
        scheduling_timeout=number(
            "--scheduling-timeout-seconds", DEFAULT_SCHEDULING_TIMEOUT, 1, 7 * 86400
        ),
        leader_elect=leader_elect,
        leader=leader,
        workers=int(number("--workers", 8, 1, 64)),
        api_timeout=api_timeout,
        log_level=level,
    )
