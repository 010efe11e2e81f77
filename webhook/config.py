"""The webhook's settings, from flags or `TMI_*` environment variables, mirroring the Helm values.

Which options the webhook takes and what each must be is here; how a flag and its variable
combine is `serving.settings`, the same for every server. The policy half of the settings is the
same `PolicySettings` that `tmi plan` builds, which is what keeps `/v1/plan` and `tmi plan` in
step."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from policy_io.state import PolicySettings
from serving import settings as options
from serving.settings import (
    ConfigError,
    Given,
    Option,
    Parser,
    ServingSettings,
    add_follow_flag,
    add_options,
    new_parser,
    parse_image_map,
    split_list,
)

DEFAULT_PORT = options.HTTPS_PORT
# An UPDATE review carries the Pod twice, and etcd holds objects of up to 1.5 MiB, so the largest
# legitimate review is a little over 3 MiB; anything larger is not a review of a real Pod.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_SCHEDULER = PolicySettings().scheduler_name


@dataclass(frozen=True, kw_only=True)
class ServerSettings(ServingSettings):
    """Everything the webhook process needs besides the ConfigMaps it reads at run time."""

    resync_seconds: int = 300
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # /v1/plan alone on a port of its own (HTTPS), so a NetworkPolicy can admit the platform's
    # Pods to the plan API and only the API server to /mutate.
    plan_port: int | None = None


_OPTIONS: tuple[Option, ...] = (
    options.BUNDLE_CONFIGMAP,
    *options.TRUST,
    *options.PLANNING,
    *options.REVISION_CAPS,
    Option(
        "--gpu-registry-credentials-secret",
        "TMI_GPU_REGISTRY_CREDENTIALS_SECRET",
        "pull Secret for GPU engine Pods",
    ),
    Option(
        "--cpu-registry-credentials-secret",
        "TMI_CPU_REGISTRY_CREDENTIALS_SECRET",
        "pull Secret for CPU engine Pods",
    ),
    Option("--scheduler-name", "TMI_SCHEDULER_NAME", "schedulerName set on engine Pods"),
    options.NAMESPACE,
    options.CERT,
    options.KEY,
    options.HOST,
    Option("--port", "TMI_PORT", f"HTTPS port (default {DEFAULT_PORT})"),
    options.KUBECONFIG,
    options.CERT_RELOAD_SECONDS,
    Option("--resync-seconds", "TMI_RESYNC_SECONDS", "how often to re-list the ConfigMaps"),
    options.SHUTDOWN_TIMEOUT,
    options.DRAIN_SECONDS,
    options.MAX_BODY_BYTES,
    *options.LIMITS,
    options.METRICS_PORT,
    Option(
        "--plan-port",
        "TMI_PLAN_PORT",
        "HTTPS port for /v1/plan alone, apart from /mutate (default: /v1/plan on the serving port)",
    ),
    options.LOG_LEVEL,
)


def build_parser() -> Parser:
    parser = new_parser(
        "tmi-webhook", "Tenant-mode inference admission webhook and plan API (HTTPS)."
    )
    parser.add_argument(
        "--enabled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tenant-mode inference on [TMI_ENABLED] (default: off, as the chart's default)",
    )
    add_follow_flag(parser)
    add_options(parser, _OPTIONS)
    return parser


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ServerSettings:
    """Parse flags, fall back to the environment, and check every value once, here."""
    given = Given.parse(build_parser(), _OPTIONS, argv, environ)
    get = given.get
    enabled = given.switch("enabled", "TMI_ENABLED", default=False)
    namespace = get("--namespace") or given.env.get("POD_NAMESPACE") or ""
    if not namespace:
        raise ConfigError("--namespace (or TMI_NAMESPACE, or POD_NAMESPACE) is required")
    image_map = get("--engine-image-map")
    policy = PolicySettings(
        enabled=enabled,
        namespace=namespace,
        bundle_configmap=get("--bundle-configmap") or DEFAULT_CONFIGMAP_NAME,
        follow_revisions=given.follow_revisions(),
        owner_public_keys=split_list(get("--owner-public-key") or ""),
        cluster_binding_id=get("--cluster-binding-id") or "",
        minimum_bundle_version=given.whole("--minimum-bundle-version", 1, 1, 2**53 - 1),
        engine_image_map=parse_image_map(image_map) if image_map else None,
        image_registry_prefix=get("--image-registry-prefix"),
        airgap_registry=get("--airgap-registry"),
        gpu_recipe_catalog_configmap=get("--gpu-recipe-catalog-configmap"),
        cpu_recipe_catalog_configmap=get("--cpu-recipe-catalog-configmap"),
        gpu_registry_credentials_secret=get("--gpu-registry-credentials-secret"),
        cpu_registry_credentials_secret=get("--cpu-registry-credentials-secret"),
        scheduler_name=get("--scheduler-name") or DEFAULT_SCHEDULER,
        **given.revision_caps(),
    )
    cert, key = get("--cert"), get("--key")
    if not cert or not key:
        raise ConfigError("--cert and --key (or TMI_TLS_CERT and TMI_TLS_KEY) are required")
    level = given.log_level()
    defaults = ServerSettings(policy=policy)
    return ServerSettings(
        policy=policy,
        cert_file=cert,
        key_file=key,
        host=get("--host"),
        port=(port := given.whole("--port", DEFAULT_PORT, 1, 65535)),
        kubeconfig=given.kubeconfig(),
        cert_reload_seconds=given.seconds("--cert-reload-seconds", defaults.cert_reload_seconds),
        resync_seconds=given.whole("--resync-seconds", defaults.resync_seconds, 10, 86400),
        shutdown_timeout=given.seconds("--shutdown-timeout", defaults.shutdown_timeout),
        drain_seconds=given.seconds("--drain-seconds", defaults.drain_seconds),
        max_body_bytes=given.whole(
            "--max-body-bytes", defaults.max_body_bytes, 64 * 1024, 64 * 1024 * 1024
        ),
        log_level=level,
        limits=given.limits(),
        metrics_port=(metrics := given.own_port(options.METRICS_PORT.flag, port)),
        plan_port=given.own_port("--plan-port", port, metrics),
    )
