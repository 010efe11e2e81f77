"""The chart's alerts and dashboards in a real Prometheus, over the servers themselves.

Debian's Prometheus runs as a local process (``localcluster.servers.prometheus``) scraping the
stack's webhook, extender and both controller replicas through the chart's own PodMonitors
(their target labels and ``honorLabels``, each Pod played by its local process), with the
chart's alert rules loaded. Two things differ from an install, both for time: scrapes and rule
evaluations run every second (the PodMonitors say 30 s), and every rule's ``for:`` is one
second in this copy (the chart's are 1 to 15 minutes; tests/chart/test_alert_rules.py holds
them with promtool). The expressions, labels and annotations are the chart's.

Under a small demo load (engine Pods planned, placed and verified, one refused, a node's
evidence report) every query of every Grafana panel returns series, and no alert is raised.
Then each alert's condition is brought about for real, one after the other, and the alert is
seen firing in Prometheus's own API with the labels that route it and a runbook link that
resolves, after being quiet before: refusals, a False verdict, a slow extender, a slow webhook,
the controller's rights removed, no leader, an expiring profile and no profile at all (which
refuses engine Pods with a 5xx and fails the extender's calls).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kits.profilekit import CLUSTER, Owner, request, with_profiles
from kits.stackkit import LARGE, dated, placed_and_verified, whole_h100_profile
from localcluster import ApiError, ControlPlane, FakeNode, create_fake_nodes, delete_fake_nodes
from localcluster.install.stack import StackSettings, TenantStack, deploy_stack, engine_pod
from localcluster.install.stack_settings import SHIPPED_BUNDLE_CONFIGMAP
from localcluster.plane.kube import JSON
from localcluster.plane.process import wait_until
from localcluster.servers.prometheus import LocalPrometheus, chart_rule_groups
from localcluster.servers.webhook import REQUEST_ANNOTATION, delete_profile, publish_profile
from tests.e2e.promkit import (
    dashboard_queries,
    dashboard_variables,
    evidence_body,
    freeze_while_busy,
    large_review,
    post,
    scrape_configs,
    slow_share,
    trickled_post,
)
from tmi_cli.evidence import post_report

pytestmark = pytest.mark.e2e

# Scrapes and evaluations every second, and every alert's `for:` one second in this copy of the
# rules: the chart's PodMonitors scrape every 30 s and its alerts wait 1 to 15 minutes.
INTERVAL = "1s"
FOR = "1s"
PATIENCE = 60.0
EVIDENCE_TOKEN = "prometheus-e2e-evidence-token"
RBAC = "rbac.authorization.k8s.io/v1"
CONTROLLER_BINDING = "tmi-allocation-controller"


@dataclass
class Setup:
    plane: ControlPlane
    stack: TenantStack
    owner: Owner
    node: str
    prometheus: LocalPrometheus
    # The engine Pods planned, placed and verified under Prometheus's watch.
    placed: list[str]

    @property
    def namespace(self) -> str:
        return self.stack.settings.namespace

    def settled(self) -> None:
        """Until what Prometheus says reflects the servers as they are now."""
        self.prometheus.wait_evaluated_since(time.time())

    def quiet(self, alert: str) -> None:
        self.settled()
        assert not self.prometheus.active(alert), f"{alert} was already raised"

    def firing(self, alert: str, **labels: str) -> JSON:
        """The one firing alert ``alert`` with ``labels``, once it fires."""
        found = self.prometheus.wait_firing(alert, PATIENCE, labels)
        assert len(found) == 1, found
        return found[0]


def signed_profile(owner: Owner, namespace: str, version: int, days: float) -> dict[str, Any]:
    """The whole-H100 profile, revision ``version``, expiring ``days`` from now, as the
    ConfigMap the stack's servers read."""
    envelope = dated(with_profiles(owner, whole_h100_profile()), namespace)
    envelope["version"] = version
    expiry = datetime.now(UTC) + timedelta(days=days)
    envelope["expiresAt"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    return owner.sign(envelope, name=SHIPPED_BUNDLE_CONFIGMAP)


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane) -> Iterator[Setup]:
    owner = Owner()
    namespace = f"tmi-prom-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        scheduling_timeout_seconds=30,
    )
    admin = control_plane.kube("admin")
    node = f"prom-h100-{uuid.uuid4().hex[:4]}"
    with deploy_stack(control_plane, settings, signed_profile(owner, namespace, 1, 30)) as stack:
        control_plane.grant_namespace_admin("tmi-installer", namespace)
        create_fake_nodes(
            admin, [FakeNode(node, gpus=2, vram_gb=80, gpu_product="NVIDIA-H100-80GB-HBM3")]
        )
        assert stack.extender is not None and stack.controller is not None
        stack.extender.wait_nodes([node])
        # The controller serves the evidence collector only with the owner's token; the standby
        # takes it, so the leader keeps verifying.
        standby = 1 - stack.controller.leader_index()
        stack.controller.replicas[standby].env = {"TMI_EVIDENCE_TOKEN": EVIDENCE_TOKEN}
        stack.controller.restart(standby)
        jobs, targets = scrape_configs(stack, INTERVAL)
        prometheus = LocalPrometheus(
            control_plane.logs_dir, jobs, chart_rule_groups(for_=FOR), interval=INTERVAL
        )
        try:
            prometheus.start()
            prometheus.wait_targets_up(targets)
            # The demo's load, watched: two engine Pods planned, placed and verified.
            installer = control_plane.kube("tmi-installer")
            placed = [f"engine-{i}-{uuid.uuid4().hex[:4]}" for i in range(2)]
            for name in placed:
                installer.create(engine_pod(namespace, LARGE, name=name))
            for name in placed:
                assert placed_and_verified(admin, stack, name)["spec"]["nodeName"] == node
            yield Setup(control_plane, stack, owner, node, prometheus, placed)
        finally:
            prometheus.stop()
            delete_fake_nodes(admin, [node])


# -- a working stack ------------------------------------------------------------------------------


def test_a_working_stack_raises_no_alert(setup: Setup) -> None:
    setup.settled()
    assert setup.prometheus.alerts() == []


def refuse_one(setup: Setup) -> None:
    """A tenant's engine Pod with a request that is not JSON: refused, request-invalid."""
    pod = engine_pod(setup.namespace, LARGE, name=f"refused-{uuid.uuid4().hex[:4]}")
    pod["metadata"]["annotations"][REQUEST_ANNOTATION] = "{not json"
    with pytest.raises(ApiError):
        setup.plane.kube("tmi-installer").create(pod, dry_run=True)


def test_every_dashboard_panel_returns_series(setup: Setup) -> None:
    refuse_one(setup)
    assert setup.stack.controller is not None
    reporter = next(r for r in setup.stack.controller.replicas if r.env)
    post_report(f"{reporter.url}/evidence", EVIDENCE_TOKEN, evidence_body(setup.node))
    setup.settled()

    empty = [p for p in dashboard_queries() if not setup.prometheus.query(p.expr)]
    assert not empty, "panels without a series: " + "; ".join(
        f"{p.dashboard} {p.title!r}: {p.expr}" for p in empty
    )
    for name, match, label in dashboard_variables():
        values = setup.prometheus.api(f"label/{label}/values", **{"match[]": match})
        assert values, f"dashboard variable {name} lists nothing: label_values({match}, {label})"
    # A label of a server's own (the webhook's endpoint, a tenant's namespace, an evidence
    # Pod) kept as the server wrote it, not renamed exported_* under a target label.
    series = setup.prometheus.api("series", **{"match[]": '{__name__=~"tmi_.+"}'})
    clashed = sorted({k for s in series for k in s if k.startswith("exported_")})
    assert not clashed, f"labels the scrape renamed: {clashed}"
    tenants = setup.prometheus.api(
        "label/namespace/values", **{"match[]": "tmi_evidence_granted_bytes"}
    )
    reported = {a["namespace"] for a in evidence_body(setup.node)["allocations"]}
    assert set(tenants) == reported


# -- each alert, brought about ------------------------------------------------------------------


def test_refusals_are_reported_by_their_code(setup: Setup) -> None:
    setup.quiet("TmiRefusals")
    refuse_one(setup)
    alert = setup.firing("TmiRefusals", reason="request-invalid")
    assert alert["labels"]["severity"] == "info"
    assert alert["annotations"]["runbook"] == "docs/operations.md#request-invalid"


def test_one_false_verdict_is_reported_by_its_reason(setup: Setup) -> None:
    setup.quiet("TmiAllocationVerifiedFalse")
    # The namespace admin rewrites a running Pod's deployment request (to one planned onto two
    # GPUs): its plan is then no signed revision's for it, and the controller writes one
    # verdict, PlanMismatch.
    forged = request("vllm", config__tensor_parallel_size=2)
    setup.plane.kube("tmi-installer").request(
        "PATCH",
        f"/api/v1/namespaces/{setup.namespace}/pods/{setup.placed[0]}",
        body={"metadata": {"annotations": {REQUEST_ANNOTATION: json.dumps(forged)}}},
        content_type="application/merge-patch+json",
    )
    alert = setup.firing("TmiAllocationVerifiedFalse", reason="PlanMismatch")
    summary = "Engine Pods are reported AllocationVerified=False (PlanMismatch)."
    assert alert["annotations"]["summary"] == summary
    assert alert["annotations"]["runbook"] == "docs/operations.md#planmismatch"


def test_a_slow_extender_is_reported_by_verb(setup: Setup) -> None:
    setup.quiet("TmiExtenderSlow")
    assert setup.stack.extender is not None
    pod = setup.plane.kube("admin").get("v1", "Pod", setup.placed[1], setup.namespace)
    call = json.dumps({"Pod": pod, "NodeNames": [setup.node]}).encode()
    assert trickled_post(setup.stack.extender, "/filter", call, spread=1.5) == 200
    alert = setup.firing("TmiExtenderSlow", verb="filter")
    assert alert["annotations"]["runbook"] == "docs/operations.md#tmiextenderslow"


def test_a_slow_webhook_is_reported_by_endpoint(setup: Setup) -> None:
    setup.quiet("TmiWebhookSlow")
    webhook = setup.stack.webhook
    assert webhook is not None

    # One review, sent again and again: the webhook parses each in full before any memo.
    review = large_review(setup.namespace, 150_000)

    def send() -> None:
        post(webhook, "/mutate", review)

    # Enough slow answers for a 99th percentile over a second, by the webhook's own count (read
    # between freezes, which Prometheus's scrapes mostly miss); then Prometheus must see it.
    freezes = freeze_while_busy(
        webhook,
        send,
        lambda: (
            slow_share(webhook, "tmi_webhook_request_duration_seconds", endpoint="mutate") > 0.015
        ),
        timeout=2 * PATIENCE,
    )
    alert = setup.firing("TmiWebhookSlow", endpoint="mutate")
    assert alert["annotations"]["runbook"] == "docs/operations.md#tmiwebhookslow", freezes


def test_the_controllers_rights_removed_are_reported_for_the_tenant_namespace(
    setup: Setup,
) -> None:
    setup.quiet("TmiExtenderRightsUnconfirmed")
    setup.quiet("TmiControllerRightsMissing")
    admin = setup.plane.kube("admin")
    assert setup.stack.owner is not None
    binding = next(
        d
        for d in setup.stack.owner.docs
        if d["kind"] == "RoleBinding"
        and d["metadata"]["name"] == CONTROLLER_BINDING
        and d["metadata"].get("namespace") == setup.namespace
    )
    admin.delete(RBAC, "RoleBinding", CONTROLLER_BINDING, setup.namespace)
    try:
        unconfirmed = setup.firing("TmiExtenderRightsUnconfirmed", namespace=setup.namespace)
        assert setup.namespace in unconfirmed["annotations"]["summary"]
        wanted = {("pods", "list"), ("pods", "watch"), ("pods", "get"), ("pods/status", "patch")}

        def all_missing() -> list[JSON]:
            found = setup.prometheus.active("TmiControllerRightsMissing", "firing")
            rights = {(a["labels"]["resource"], a["labels"]["verb"]) for a in found}
            return found if rights == wanted else []

        missing = wait_until(all_missing, timeout=PATIENCE, what="every right reported missing")
        assert {a["labels"]["namespace"] for a in missing} == {setup.namespace}
        assert all(setup.namespace in a["annotations"]["summary"] for a in missing)
    finally:
        admin.apply(copy.deepcopy(binding))
    wait_until(
        lambda: (
            not setup.prometheus.active("TmiExtenderRightsUnconfirmed")
            and not setup.prometheus.active("TmiControllerRightsMissing")
        ),
        timeout=PATIENCE,
        what="the rights alerts resolved once the RoleBinding is back",
    )


def test_no_leader_is_reported(setup: Setup) -> None:
    setup.quiet("TmiControllerNoLeader")
    controller = setup.stack.controller
    assert controller is not None
    admin = setup.plane.kube("admin")
    lease = controller.lease()
    assert lease is not None
    # A holder that is gone but whose Lease has not run out: neither replica may take it.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease["spec"].update(
        holderIdentity="a-replica-that-is-gone", leaseDurationSeconds=3600, renewTime=now
    )
    namespace = lease["metadata"]["namespace"]
    admin.request(
        "PUT",
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{controller.lease_name}",
        body=lease,
    )
    try:
        alert = setup.firing("TmiControllerNoLeader")
        assert alert["labels"]["severity"] == "critical"
    finally:
        admin.delete("coordination.k8s.io/v1", "Lease", controller.lease_name, namespace)
    controller.wait_leader()
    wait_until(
        lambda: not setup.prometheus.active("TmiControllerNoLeader"),
        timeout=PATIENCE,
        what="TmiControllerNoLeader resolved once a replica leads",
    )


def test_a_profile_that_expires_within_a_week_warns(setup: Setup) -> None:
    setup.quiet("TmiProfileExpiringSoon")
    publish_profile(setup.plane, signed_profile(setup.owner, setup.namespace, 2, 3))
    alert = setup.firing("TmiProfileExpiringSoon")
    assert "expires in 2d 23h" in alert["annotations"]["description"]


def test_no_profile_refuses_with_a_server_error_and_fails_the_extender(setup: Setup) -> None:
    for alert in ("TmiProfileNotValid", "TmiWebhookErrors", "TmiExtenderErrors"):
        setup.quiet(alert)
    assert setup.stack.extender is not None
    bundle = setup.stack.settings.bundle_configmap
    delete_profile(setup.plane, setup.namespace, bundle)
    try:
        setup.firing("TmiProfileNotValid")
        # An engine Pod is then refused (profile-refused, 503) ...
        pod = engine_pod(setup.namespace, LARGE, name=f"late-{uuid.uuid4().hex[:4]}")
        with pytest.raises(ApiError, match="profile"):
            setup.plane.kube("tmi-installer").create(pod, dry_run=True)
        errors = setup.firing("TmiWebhookErrors")
        assert errors["annotations"]["runbook"] == "docs/operations.md#tmiwebhookerrors"
        # ... and the extender cannot place one planned before.
        planned = setup.plane.kube("admin").get("v1", "Pod", setup.placed[1], setup.namespace)
        call = json.dumps({"Pod": planned, "NodeNames": [setup.node]}).encode()
        assert trickled_post(setup.stack.extender, "/filter", call, spread=0) == 200
        setup.firing("TmiExtenderErrors")
    finally:
        publish_profile(setup.plane, signed_profile(setup.owner, setup.namespace, 3, 30))
    wait_until(
        lambda: (
            not setup.prometheus.active("TmiProfileNotValid")
            and not setup.prometheus.active("TmiProfileExpiringSoon")
        ),
        timeout=PATIENCE,
        what="the profile alerts resolved once a month-long revision is published",
    )
