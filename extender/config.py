"""The extender's settings, from flags or `TMI_*` environment variables.

Which options the extender takes and what each must be is here; how a flag and its variable
combine is `serving.settings`, the same for every server. The profile settings are the same
`PolicySettings` the webhook and `tmi verify` take, so the extender trusts exactly the profile
revision the webhook planned with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.tenants import Tenant, parse_tenants
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
    split_list,
)

DEFAULT_PORT = options.HTTPS_PORT
# Full-node mode carries every candidate Node object in one body; a few thousand real Nodes
# (with their images lists) fit comfortably in this.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
ALL_NAMESPACES = "*"


@dataclass(frozen=True, kw_only=True)
class ExtenderSettings(ServingSettings):
    """Everything the extender process needs besides what it reads from the API at run time."""

    pod_namespaces: tuple[str, ...]
    plain_http: bool = False
    resync_seconds: int = 1800
    watch_seconds: int = 300
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # The cluster-scoped TenantAdmission holding the tenant's rollback floor
    # (`inference_policy.trust.rollback`); None: only the configured floor holds.
    rollback_record: str | None = None
    # Every tenant (`extender.tenants`); empty: the one of `policy` and `rollback_record`.
    tenants: tuple[Tenant, ...] = ()
    # How often the room figures are checked and changes published (`extender.room_publisher`);
    # 0: none are published.
    room_seconds: float = 2.0
    # The allocation controller's user name: engine Pods are placed only where its rights are
    # confirmed, asked every `rights_seconds` (`extender.owner_rights`); None: not checked.
    allocation_controller: str | None = None
    rights_seconds: float = 5.0

    def every_tenant(self) -> tuple[Tenant, ...]:
        return self.tenants or (Tenant(self.policy, self.rollback_record),)


_OPTIONS: tuple[Option, ...] = (
    Option("--namespace", "TMI_NAMESPACE", "the tenant namespace holding the signed profile"),
    options.BUNDLE_CONFIGMAP,
    *options.TRUST,
    # The extender re-derives each Pod's plan (the grant check), so it plans with what the
    # webhook plans with.
    *options.PLANNING,
    *options.REVISION_CAPS,
    Option(
        "--rollback-record",
        "TMI_ROLLBACK_RECORD",
        "the cluster-scoped TenantAdmission where the highest verified profile version is "
        "kept; no profile is used until it is read",
    ),
    Option(
        "--tenants",
        "TMI_TENANTS",
        "further tenant namespaces, a JSON array of objects: namespace and what differs from "
        "the first tenant (bundleConfigMap, followRevisions, ownerPublicKey, clusterBindingId, "
        "minimumBundleVersion, gpu/cpuRecipeCatalogConfigMap, rollbackRecord)",
    ),
    Option(
        "--allocation-controller",
        "TMI_ALLOCATION_CONTROLLER",
        "the allocation controller's user name (system:serviceaccount:<owner namespace>:"
        "tmi-allocation-controller): no engine Pod of a tenant namespace is placed unless the "
        "API server confirms it may list, watch and get Pods and patch their status there "
        "(default: not checked)",
    ),
    Option(
        "--rights-seconds",
        "TMI_RIGHTS_SECONDS",
        "how often the allocation controller's rights are asked; an answer is trusted for "
        "three times this (default 5)",
    ),
    Option(
        "--pod-namespaces",
        "TMI_POD_NAMESPACES",
        "namespaces whose engine Pods are accounted, comma-separated, or * for all "
        "(default: every tenant namespace)",
    ),
    options.CERT,
    options.KEY,
    options.HOST,
    Option("--port", "TMI_PORT", f"port (default {DEFAULT_PORT})"),
    options.KUBECONFIG,
    options.CERT_RELOAD_SECONDS,
    Option(
        "--resync-seconds", "TMI_RESYNC_SECONDS", "how often to re-list nodes, pods and profile"
    ),
    Option("--watch-seconds", "TMI_WATCH_SECONDS", "length of one watch request"),
    Option(
        "--room-seconds",
        "TMI_ROOM_SECONDS",
        "how often each tenant's room figures (tmi-binding-room) are checked and a change "
        "written; 0 writes none (default 2)",
    ),
    options.SHUTDOWN_TIMEOUT,
    options.DRAIN_SECONDS,
    options.MAX_BODY_BYTES,
    *options.LIMITS,
    options.METRICS_PORT,
    options.LOG_LEVEL,
)


def build_parser() -> Parser:
    parser = new_parser(
        "tmi-extender",
        "kube-scheduler extender: places planned engine Pods on the hardware their signed "
        "binding vouches for.",
    )
    parser.add_argument(
        "--plain-http",
        action="store_true",
        default=None,
        help="serve plain HTTP instead of HTTPS, for a loopback test only [TMI_PLAIN_HTTP]",
    )
    add_follow_flag(parser)
    add_options(parser, _OPTIONS)
    return parser


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ExtenderSettings:
    """Parse flags, fall back to the environment, and check every value once, here."""
    given = Given.parse(build_parser(), _OPTIONS, argv, environ)
    get = given.get
    policy = given.policy(enabled=True, trust_required=True)
    rollback = get("--rollback-record") or None
    tenants = parse_tenants(get("--tenants"), Tenant(policy, rollback))
    pod_namespaces = split_list(get("--pod-namespaces") or ",".join(t.namespace for t in tenants))
    if ALL_NAMESPACES in pod_namespaces and len(pod_namespaces) > 1:
        raise ConfigError("--pod-namespaces: * (all namespaces) cannot be combined with names")
    plain = given.switch("plain_http", "TMI_PLAIN_HTTP", default=False)
    cert, key = get("--cert"), get("--key")
    if not plain and (not cert or not key):
        raise ConfigError(
            "--cert and --key (or TMI_TLS_CERT and TMI_TLS_KEY) are required; kube-scheduler "
            "reaches the extender over HTTPS"
        )
    level = given.log_level()
    defaults = ExtenderSettings(policy=policy, pod_namespaces=pod_namespaces)
    return ExtenderSettings(
        policy=policy,
        pod_namespaces=pod_namespaces,
        cert_file=cert or "",
        key_file=key or "",
        plain_http=plain,
        host=get("--host"),
        port=(port := given.whole("--port", DEFAULT_PORT, 1, 65535)),
        kubeconfig=given.kubeconfig(),
        cert_reload_seconds=given.seconds("--cert-reload-seconds", defaults.cert_reload_seconds),
        resync_seconds=given.whole("--resync-seconds", defaults.resync_seconds, 30, 86400),
        watch_seconds=given.whole("--watch-seconds", defaults.watch_seconds, 10, 3600),
        shutdown_timeout=given.seconds("--shutdown-timeout", defaults.shutdown_timeout),
        drain_seconds=given.seconds("--drain-seconds", defaults.drain_seconds),
        rollback_record=rollback,
        tenants=tenants,
        room_seconds=given.number("--room-seconds", defaults.room_seconds, 0, 60),
        allocation_controller=get("--allocation-controller") or None,
        rights_seconds=given.number("--rights-seconds", defaults.rights_seconds, 0.1, 300),
        max_body_bytes=given.whole(
            "--max-body-bytes", defaults.max_body_bytes, 64 * 1024, 512 * 1024 * 1024
        ),
        log_level=level,
        limits=given.limits(),
        metrics_port=given.own_port(options.METRICS_PORT.flag, port),
    )
