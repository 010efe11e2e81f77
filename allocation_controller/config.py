"""The controller's settings, from flags or environment variables.

The chart sets environment variables and a person debugging runs the module with flags, so every
setting accepts both, and a flag wins (`serving.settings`, as in every server). The policy
settings are the webhook's own options (`TMI_OWNER_PUBLIC_KEY`, `TMI_CLUSTER_BINDING_ID`,
`TMI_ENGINE_IMAGE_MAP`, ...) so one values block configures both: the controller must re-derive
exactly the plans the webhook made, and it can only do that with the same catalog relocation,
recipe catalogs and trust. The namespace and the leader identity come from the downward API
(`POD_NAMESPACE`, `POD_NAME`).

One process serves every tenant namespace of the owner release (`allocation_controller.fleet`):
`--tenants` (`TMI_TENANTS`) gives each tenant's own trust and profile settings
(`allocation_controller.tenants`), and the flat per-tenant settings (`--namespace`, the key, the
binding id, the floor, the recipe catalogs, `--tenant-namespaces`) are then refused beside it,
so no setting is silently one or the other. Without it the one tenant is the flat settings."""

from __future__ import annotations

import argparse
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from allocation_controller.leader import LeaderSettings
from allocation_controller.tenants import parse_tenants
from inference_policy.granting.grant import DEFAULT_SCHEDULING_TIMEOUT
from inference_policy.granting.owner_rights import review_interval
from policy_io.state import PolicySettings
from serving import settings as options
from serving.settings import (
    ConfigError,
    Given,
    Option,
    Parser,
    add_follow_flag,
    add_options,
    new_parser,
    split_list,
)

DEFAULT_PORT = 8080
DEFAULT_LEASE = "tmi-allocation-controller"
# A fault-injection point for the e2e fault tests, deliberately not a flag and not in the chart:
# seconds to hold each verdict between the leader check and its patch (unset or 0: off), so a
# test can kill the replica after it has read a Pod and before it has written the condition.
FAULT_PAUSE_VARIABLE = "TMI_FAULT_PAUSE_BEFORE_PATCH_SECONDS"


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
    # Where the Lease lives (None: the tenant namespace); the chart puts it in the owner's.
    lease_namespace: str | None = None
    workers: int = 8
    api_timeout: float = 4.0
    watch_timeout: int = 300
    reconcile_timeout: float = 30.0
    log_level: str = "INFO"
    # GPU-sharing evidence (allocation_controller.evidence): served only with a token.
    evidence_token: str = field(default="", repr=False)
    evidence_ttl: float = 300.0
    fault_pause_before_patch: float = 0.0
    # How often the controller asks whether it still holds its rights in the tenant namespace
    # (`allocation_controller.rights`), and the Pod its Events about them regard (POD_NAME).
    rights_seconds: float = 15.0
    pod_name: str | None = None
    # The owner release's other tenant namespaces, whose engine Pods' accounted shares this
    # tenant's are held apart from (`allocation_controller.neighbours`).
    other_tenants: tuple[str, ...] = ()
    # Every tenant the process serves (`--tenants`); empty: the one of `policy`.
    tenants: tuple[PolicySettings, ...] = ()

    @property
    def namespace(self) -> str:
        return self.policy.namespace

    def every_tenant(self) -> tuple[PolicySettings, ...]:
        return self.tenants or (self.policy,)

    def for_tenant(self, policy: PolicySettings) -> ControllerSettings:
        """These settings for one tenant's controller in the process's fleet, whose rights
        reviews keep, all tenants together, to the owner servers' rate."""
        tenants = len(self.every_tenant())
        rights = review_interval(self.rights_seconds, tenants)
        return replace(self, policy=policy, tenants=(), rights_seconds=rights)


_OPTIONS: tuple[Option, ...] = (
    options.NAMESPACE,
    options.BUNDLE_CONFIGMAP,
    options.KUBECONFIG,
    *options.TRUST,
    *options.PLANNING,
    *options.REVISION_CAPS,
    Option(
        "--scheduling-timeout-seconds",
        "TMI_SCHEDULING_TIMEOUT_SECONDS",
        f"report an unscheduled Pod after this long (default {int(DEFAULT_SCHEDULING_TIMEOUT)})",
    ),
    Option("--lease-name", "TMI_LEASE_NAME", f"leader election Lease (default {DEFAULT_LEASE})"),
    Option(
        "--lease-namespace",
        "TMI_LEASE_NAMESPACE",
        "namespace of the Lease (default: --namespace; the chart: the owner's, beside it)",
    ),
    Option("--identity", "TMI_IDENTITY", "leader identity (default: $POD_NAME, else host name)"),
    Option("--lease-duration", "TMI_LEASE_DURATION", "seconds a Lease holds (default 15)"),
    Option(
        "--renew-deadline", "TMI_RENEW_DEADLINE", "seconds the leader has to renew (default 10)"
    ),
    Option("--retry-period", "TMI_RETRY_PERIOD", "seconds between election rounds (default 2)"),
    Option("--workers", "TMI_WORKERS", "concurrent reconciles (default 8)"),
    Option("--api-timeout", "TMI_API_TIMEOUT", "seconds per API request (default 4)"),
    Option(
        "--host", "TMI_HOST", "address for /healthz, /readyz, /metrics (default: every address)"
    ),
    Option(
        "--port",
        "TMI_PORT",
        f"HTTP port for /healthz, /readyz, /metrics (default {DEFAULT_PORT})",
    ),
    options.LOG_LEVEL,
    Option(
        "--rights-seconds",
        "TMI_RIGHTS_SECONDS",
        "how often the controller asks whether it still may read Pods and write their status in "
        "the tenant namespace (default 15; at once after a refusal)",
    ),
    Option(
        "--tenants",
        "TMI_TENANTS",
        "every tenant namespace this process serves, a JSON array of objects: namespace, "
        "ownerPublicKey, clusterBindingId, bundleConfigMap, followRevisions, "
        "minimumBundleVersion, gpuRecipeCatalogConfigMap, cpuRecipeCatalogConfigMap (default: "
        "the one tenant of --namespace and the flat settings)",
    ),
    Option(
        "--tenant-namespaces",
        "TMI_TENANT_NAMESPACES",
        "the owner release's tenant namespaces, comma-separated: a Pod here whose accounted share "
        "meets one of theirs on a GPU is reported (default: none but this one)",
    ),
    Option(
        "--evidence-token",
        "TMI_EVIDENCE_TOKEN",
        "bearer token GPU nodes' `tmi evidence --post` must present (default: no evidence route)",
    ),
    Option(
        "--evidence-ttl-seconds",
        "TMI_EVIDENCE_TTL_SECONDS",
        "forget a node's evidence report after this long without a new one (default 300)",
    ),
)


def build_parser() -> Parser:
    parser = new_parser(
        "tmi-controller", "Owns the kamiwaza.ai/AllocationVerified condition of engine Pods."
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
    add_follow_flag(parser)
    add_options(parser, _OPTIONS)
    return parser


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ControllerSettings:
    """Parse flags, fall back to the environment, check every value once, here."""
    given = Given.parse(build_parser(), _OPTIONS, argv, environ)
    get, number = given.get, given.number
    enabled = given.switch("enabled", "TMI_ENABLED", default=True)
    tenants_text = get("--tenants")
    if tenants_text:
        flat = [flag for flag in _PER_TENANT if get(flag)]
        if flat:
            raise ConfigError(
                f"--tenants gives each tenant's settings; {', '.join(flat)} cannot be given "
                "beside it (give the tenant's value in its --tenants entry)"
            )
        shared = given.policy(enabled=enabled, trust_required=True, namespace_required=False)
        tenants = parse_tenants(tenants_text, shared)
        policy = tenants[0]
    else:
        tenants = ()
        policy = given.policy(enabled=enabled, trust_required=True)
    namespace = policy.namespace
    identity = (
        get("--identity")
        or given.env.get("POD_NAME")
        or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
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
    leader_elect = given.switch("leader_elect", "TMI_LEADER_ELECT", default=True)
    if leader_elect and api_timeout >= margin:
        raise ConfigError(
            f"--api-timeout ({api_timeout:g}s) must be below lease duration minus renew deadline "
            f"({margin:g}s), so a write in flight cannot outlive this replica's leadership"
        )
    level = given.log_level()
    pause_text = given.env.get(FAULT_PAUSE_VARIABLE, "").strip()
    try:
        pause = float(pause_text) if pause_text else 0.0
    except ValueError:
        raise ConfigError(f"{FAULT_PAUSE_VARIABLE} must be a number of seconds") from None
    if not 0 <= pause <= 3600:
        raise ConfigError(f"{FAULT_PAUSE_VARIABLE} must be between 0 and 3600 seconds")
    return ControllerSettings(
        policy=policy,
        kubeconfig=given.kubeconfig(),
        host=get("--host"),
        port=given.whole("--port", DEFAULT_PORT, 1, 65535),
        scheduling_timeout=number(
            "--scheduling-timeout-seconds", DEFAULT_SCHEDULING_TIMEOUT, 1, 7 * 86400
        ),
        leader_elect=leader_elect,
        leader=leader,
        lease_namespace=get("--lease-namespace") or namespace,
        workers=given.whole("--workers", 8, 1, 64),
        api_timeout=api_timeout,
        log_level=level,
        evidence_token=get("--evidence-token") or "",
        evidence_ttl=number("--evidence-ttl-seconds", 300.0, 10, 86400),
        fault_pause_before_patch=pause,
        rights_seconds=number("--rights-seconds", 15.0, 1, 3600),
        pod_name=given.env.get("POD_NAME") or None,
        other_tenants=tuple(
            dict.fromkeys(
                ns for ns in split_list(get("--tenant-namespaces") or "") if ns != namespace
            )
        ),
        tenants=tenants,
    )


# The flat settings that are one tenant's own: `--tenants` carries them per tenant instead.
_PER_TENANT = (
    "--namespace",
    "--bundle-configmap",
    "--owner-public-key",
    "--cluster-binding-id",
    "--minimum-bundle-version",
    "--gpu-recipe-catalog-configmap",
    "--cpu-recipe-catalog-configmap",
    "--tenant-namespaces",
)
