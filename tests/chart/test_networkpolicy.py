"""The chart's NetworkPolicies, evaluated as the NetworkPolicy API defines them.

No CNI enforces policies on the local control plane, so the rendered policies are held to the
API's semantics here: a source is admitted to a port when some ingress rule's peers match it
(a podSelector alone: Pods of the policy's namespace; a namespaceSelector alone: every Pod of the
matching namespaces; an ipBlock: addresses in the CIDR) and its ports include the port.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import pytest

from chart_tools import generate as chartgen
from chart_tools.render import OWNER, TENANT, find, part_values, render
from localcluster.plane.kube import JSON

TENANT_NS = chartgen.TENANT_NAMESPACE
OWNER_NS = chartgen.OWNER_NAMESPACE
MONITORING = {"kubernetes.io/metadata.name": "monitoring", "kamiwaza.ai/monitoring": "true"}
API_SERVER_CIDR = "10.0.0.0/28"


@dataclass(frozen=True)
class Source:
    namespace: str = ""
    namespace_labels: dict[str, str] = field(default_factory=dict)
    pod_labels: dict[str, str] = field(default_factory=dict)
    ip: str = "10.244.1.7"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "extend the evaluator for matchExpressions"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer(peer: dict[str, Any], policy_ns: str, source: Source) -> bool:
    if "ipBlock" in peer:
        return ipaddress.ip_address(source.ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    in_namespace = (
        _selects(namespaces, source.namespace_labels)
        if namespaces is not None
        else source.namespace == policy_ns
    )
    return in_namespace and (pods is None or _selects(pods, source.pod_labels))


def admits(policy: JSON, source: Source, port: int) -> bool:
    ns = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress") or []:
        peers = rule.get("from")
        ports = rule.get("ports")
        if (not peers or any(_peer(p, ns, source) for p in peers)) and (
            not ports or any(p.get("port") == port for p in ports)
        ):
            return True
    return False


def policy(part: str, name: str, **tenant: Any) -> JSON:
    values = chartgen.base_values()
    values.setdefault("tenant", {}).update(tenant)
    namespace = TENANT_NS if part == TENANT else OWNER_NS
    return find(render(part_values(part, values), namespace=namespace), "NetworkPolicy", name)


def tenant_pod(**labels: str) -> Source:
    return Source(TENANT_NS, {"kubernetes.io/metadata.name": TENANT_NS}, labels)


def monitoring_pod() -> Source:
    return Source("monitoring", MONITORING, {"app": "prometheus"})


def owner_pod(**labels: str) -> Source:
    return Source(OWNER_NS, {"kubernetes.io/metadata.name": OWNER_NS}, labels)


def test_only_the_scheduler_reaches_the_extender_and_only_monitoring_its_metrics() -> None:
    extender = policy(OWNER, "tmi-extender")
    scheduler = owner_pod(**{"app.kubernetes.io/name": "kamiwaza-inference-scheduler"})
    assert admits(extender, scheduler, 8443)
    assert not admits(extender, monitoring_pod(), 8443)
    assert admits(extender, monitoring_pod(), 9090)
    assert not admits(extender, scheduler, 9090)
    assert not admits(extender, tenant_pod(), 8443)
    assert not admits(extender, owner_pod(app="anything-else"), 8443)
    assert not admits(extender, scheduler, 9000)


def test_only_monitoring_reaches_the_controllers_metrics() -> None:
    controller = policy(OWNER, "tmi-allocation-controller")
    assert admits(controller, monitoring_pod(), 8080)
    assert not admits(controller, tenant_pod(app="platform"), 8080)
    unlabelled = Source("monitoring", {"kubernetes.io/metadata.name": "monitoring"})
    assert not admits(controller, unlabelled, 8080)


def test_with_the_api_servers_cidrs_the_webhook_admits_it_the_platform_and_monitoring() -> None:
    webhook = policy(TENANT, "tmi-webhook", apiServerCIDRs=[API_SERVER_CIDR])
    assert admits(webhook, Source(ip="10.0.0.5"), 8443)
    # /v1/plan is alone on 8444: the platform's Pods reach it, and not /mutate.
    assert admits(webhook, tenant_pod(app="platform"), 8444)
    assert not admits(webhook, tenant_pod(app="platform"), 8443)
    assert not admits(webhook, Source(ip="10.0.0.5"), 8444)
    assert not admits(webhook, monitoring_pod(), 8444)
    # /metrics is alone on 9090: monitoring reaches it, and only it.
    assert not admits(webhook, monitoring_pod(), 8443)
    assert admits(webhook, monitoring_pod(), 9090)
    assert not admits(webhook, tenant_pod(app="platform"), 9090)
    assert not admits(webhook, Source(ip="10.0.0.5"), 9090)
    other = Source("elsewhere", {"kubernetes.io/metadata.name": "elsewhere"}, ip="10.244.9.9")
    assert not admits(webhook, other, 8443)
    assert not admits(webhook, Source(ip="10.0.0.5"), 9443)


@pytest.mark.parametrize("source", [Source(ip="192.0.2.1"), monitoring_pod()])
def test_without_them_the_webhook_port_is_open_and_only_that_port(source: Source) -> None:
    # The API server is not a Pod and its address is the cluster's: the port stays reachable.
    webhook = policy(TENANT, "tmi-webhook")
    assert admits(webhook, source, 8443)
    assert not admits(webhook, source, 8080)


def test_without_them_metrics_stay_monitoring_only() -> None:
    webhook = policy(TENANT, "tmi-webhook")
    assert admits(webhook, monitoring_pod(), 9090)
    assert not admits(webhook, Source(ip="192.0.2.1"), 9090)
    assert not admits(webhook, tenant_pod(app="platform"), 9090)
