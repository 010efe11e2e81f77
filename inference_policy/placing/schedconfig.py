"""The owner's second scheduler's configuration, rendered from a verified profile.

The extender lists no `managedResources`: kube-scheduler then consults it for every Pod this
scheduler places, CPU engine Pods included (a list would limit it to Pods requesting a listed
resource, and only extended resources may be listed, never `cpu`), so that CPU engines are
steered off GPU nodes and their plan is checked like any other. This scheduler places engine
Pods only, and a Pod without a plan passes the extender untouched. Every binding resource is a
real node-allocatable extended resource, so the scheduler's NodeResourcesFit keeps counting them
(including Pods it has assumed but not yet bound, which the extender cannot see), and the
extender adds the binding checks and precise reasons on top.

TLS is required to be verifiable: with `enableHTTPS` and no CA, kube-scheduler silently skips
certificate verification, so an https URL without a CA is refused rather than rendered.
"""

from __future__ import annotations

import base64
import re
from typing import Any

API_VERSION = "kubescheduler.config.k8s.io/v1"
DEFAULT_SCHEDULER_NAME = "kamiwaza-inference-scheduler"
DEFAULT_SCHEDULER_NAMESPACE = "kamiwaza-scheduling"
DEFAULT_WEIGHT = 5
DEFAULT_HTTP_TIMEOUT = "5s"
_URL = re.compile(r"(?P<scheme>https?)://[^\s/?#]+(?:/[^\s?#]*)?")
_DURATION = re.compile(r"[1-9][0-9]*(ms|s|m)")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_PEM_CERT = "-----BEGIN CERTIFICATE-----"
_SERVER_NAME = re.compile(
    r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
)


class SchedulerConfigError(ValueError):
    """An input the configuration cannot be rendered from; the message names it."""


def render_scheduler_config(
    *,
    extender_url: str,
    ca_pem: bytes | None = None,
    ca_file: str | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    scheduler_namespace: str = DEFAULT_SCHEDULER_NAMESPACE,
    weight: int = DEFAULT_WEIGHT,
    http_timeout: str = DEFAULT_HTTP_TIMEOUT,
    node_cache_capable: bool = True,
    server_name: str | None = None,
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with one profile (`scheduler_name`) and the extender. Nothing
    in it depends on the signed profile: the extender reads the profile itself. The extender's
    CA is inline (`ca_pem`, as `tmi render-scheduler-config --ca-file` puts it) or a path in the
    scheduler's container (`ca_file`, as the chart mounts the extender's certificate Secret)."""
    if ca_pem is not None and ca_file is not None:
        raise SchedulerConfigError("give the extender's CA inline or as a file path, not both")
    match = _URL.fullmatch(extender_url)
    if match is None:
        raise SchedulerConfigError(
            f"extender URL {extender_url!r} is not an http(s) URL such as "
            "https://tmi-extender.kamiwaza-scheduling.svc:443"
        )
    https = match["scheme"] == "https"
    if ca_pem is not None and not ca_pem.strip():
        raise SchedulerConfigError("the CA file is empty; it must hold the PEM certificate")
    if https and not ca_pem and not ca_file:
        raise SchedulerConfigError(
            "an https extender URL needs the CA that signed the extender's certificate "
            "(--ca-file): without one kube-scheduler skips certificate verification"
        )
    if ca_pem is not None and _PEM_CERT.encode() not in ca_pem:
        raise SchedulerConfigError("the CA file holds no PEM certificate")
    if not _NAME.fullmatch(scheduler_name):
        raise SchedulerConfigError(f"scheduler name {scheduler_name!r} is not a DNS label")
    if not _NAME.fullmatch(scheduler_namespace):
        raise SchedulerConfigError(f"namespace {scheduler_namespace!r} is not a DNS label")
    if server_name is not None and (not https or not _SERVER_NAME.fullmatch(server_name)):
        raise SchedulerConfigError(
            f"extender server name {server_name!r} must be a DNS name such as "
            "tmi-extender.kamiwaza-scheduling.svc, and needs an https URL"
        )
    if not 1 <= weight <= 100:
        raise SchedulerConfigError(f"weight {weight} is outside 1..100")
    if not _DURATION.fullmatch(http_timeout):
        raise SchedulerConfigError(f"http timeout {http_timeout!r} is not a duration such as 5s")
    extender: dict[str, Any] = {
        "urlPrefix": extender_url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": weight,
        "enableHTTPS": https,
        "httpTimeout": http_timeout,
        "nodeCacheCapable": node_cache_capable,
        # Placement on hardware the profile does not vouch for must not happen because the
        # extender was briefly unreachable.
        "ignorable": False,
    }
    if https and (ca_pem or ca_file):
        extender["tlsConfig"] = (
            {"caData": base64.b64encode(ca_pem).decode("ascii")} if ca_pem else {"caFile": ca_file}
        )
        if server_name:
            # The URL names an address (a Service's ClusterIP, where the scheduler has no
            # cluster DNS); the certificate is still checked against the Service's name.
            extender["tlsConfig"]["serverName"] = server_name
    return {
        "apiVersion": API_VERSION,
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceName": scheduler_name,
            "resourceNamespace": scheduler_namespace,
        },
        "profiles": [
            {
                "schedulerName": scheduler_name,
                "pluginConfig": [
                    {
                        # The in-tree default (LeastAllocated) spreads Pods, which would pull
                        # against the extender's best fit; this scheduler only places engine
                        # Pods, so its own scoring packs as well.
                        "name": "NodeResourcesFit",
                        "args": {
                            "scoringStrategy": {
                                "type": "MostAllocated",
                                "resources": [
                                    {"name": "cpu", "weight": 1},
                                    {"name": "memory", "weight": 1},
                                ],
                            }
                        },
                    }
                ],
            }
        ],
        "extenders": [extender],
    }


__all__ = [
    "DEFAULT_SCHEDULER_NAME",
    "DEFAULT_SCHEDULER_NAMESPACE",
    "SchedulerConfigError",
    "render_scheduler_config",
]
