"""The chart's own Deployments on the real node: what a user's cluster runs, with no process
played by the harness.

The webhook, the extender, the allocation controller and the owner's kube-scheduler run as the
chart's Pods from the imported images (``localcluster.nodes.node_stack``); the API server calls the
webhook through its Service and the scheduler Pod calls the extender through its Service's
ClusterIP. The running processes are read on the host (``/proc``) through containerd's task
list: their user, their read-only root and their environment are the runtime's, not the spec's.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chart_tools.render import OWNER, TENANT, part_values, render
from kits.nodekit import (
    chart_on_node,
    is_ready,
    wait_pod,
)
from kits.stackkit import LARGE
from localcluster import ApiError, ControlPlane
from localcluster.nodes.node_stack import CONTROLLER, EXTENDER, WEBHOOK, ChartStack
from localcluster.nodes.realnode import RealNode, probe_report
from localcluster.plane.process import wait_until
from localcluster.servers.engine_pods import CONDITION, condition, engine_deployment, engine_pod
from localcluster.servers.prometheus import (
    LocalPrometheus,
    ScrapedPod,
    chart_rule_groups,
    podmonitor_scrape_configs,
)
from localcluster.servers.webhook import PLAN_ANNOTATION, REQUEST_ANNOTATION

pytestmark = pytest.mark.e2e

ROLLOUT_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def chart(node_plane: ControlPlane, real_node: RealNode) -> Iterator[ChartStack]:
    with chart_on_node(node_plane, real_node, "tmi-chart") as up:
        yield up


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def _root_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError(f"/proc/{pid}/mountinfo has no root mount")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def test_every_chart_deployment_runs_on_the_real_node_as_the_chart_says(
    real_node: RealNode, chart: ChartStack
) -> None:
    deployments = chart.deployments()
    assert {name for _, name in deployments} >= {
        WEBHOOK,
        EXTENDER,
        CONTROLLER,
        chart.settings.scheduler_name,
    }
    for namespace, name in deployments:
        pods = chart.pods(namespace, name)
        assert pods, f"{namespace}/{name} has no Pods"
        for pod in pods:
            assert pod["spec"]["nodeName"] == real_node.name
            assert is_ready(pod), f"{pod['metadata']['name']} is not Ready"
            for container in pod["spec"]["containers"]:
                pid = real_node.container_pid(pod, container["name"])
                # The chart's runAsUser and readOnlyRootFilesystem, in force on the process.
                assert _status(pid, "Uid").split()[0] == "65532", (name, container["name"])
                assert "ro" in _root_options(pid), (name, container["name"])
                if namespace == chart.namespace:
                    # The tenant's own servers are shielded like any Pod of the namespace.
                    assert _environ(pid).get("NVIDIA_VISIBLE_DEVICES") == "void"


def test_an_engine_pod_goes_through_the_chart_pods_to_ready_on_the_real_node(
    node_plane: ControlPlane, real_node: RealNode, chart: ChartStack
) -> None:
    ns = chart.namespace
    tenant = node_plane.kube("tmi-installer")
    created = tenant.create(engine_pod(ns, LARGE, name="engine-chart"))
    try:
        # Planned by the webhook's Pods (the API server called its Service).
        assert PLAN_ANNOTATION in created["metadata"]["annotations"]
        assert created["spec"]["schedulerName"] == chart.settings.scheduler_name
        # Placed by the scheduler's Pod with the extender's Pods, verified by the controller's.
        pod = wait_pod(tenant, ns, "engine-chart", is_ready, timeout=ROLLOUT_TIMEOUT)
        assert pod["spec"]["nodeName"] == real_node.name
        verified = condition(pod, CONDITION)
        assert verified is not None and verified["status"] == "True"
        (uuid_,) = real_node.allocations(created["metadata"]["uid"])[("engine", "nvidia.com/gpu")]
        assert (
            probe_report(tenant, ns, "engine-chart", "engine")["env"]["NVIDIA_VISIBLE_DEVICES"]
            == uuid_
        )
    finally:
        node_plane.kube("admin").delete("v1", "Pod", "engine-chart", ns, grace_period_seconds=0)


def test_a_killed_webhook_pod_is_restarted_by_the_kubelet_while_creates_continue(
    node_plane: ControlPlane, real_node: RealNode, chart: ChartStack
) -> None:
    ns = chart.namespace
    admin = node_plane.kube("admin")
    victim, *others = chart.pods(ns, WEBHOOK)
    assert others, "the chart runs more than one webhook replica"
    name = victim["metadata"]["name"]
    restarts = victim["status"]["containerStatuses"][0]["restartCount"]
    real_node.kill_container(victim, "webhook")
    planned = refused = 0

    def restarted() -> bool:
        nonlocal planned, refused
        # Creates go on throughout: each is planned or refused, never admitted unplanned.
        try:
            pod = admin.create(engine_pod(ns, LARGE), dry_run=True)
        except ApiError as exc:
            assert "tenant-inference.kamiwaza.ai" in exc.message, exc.message
            refused += 1
        else:
            assert PLAN_ANNOTATION in pod["metadata"]["annotations"]
            planned += 1
        now = admin.get("v1", "Pod", name, ns)
        status = now["status"]["containerStatuses"][0]
        return status["restartCount"] > restarts and is_ready(now)

    wait_until(restarted, timeout=120, what=f"the kubelet to restart {name}")
    assert planned > 0 and planned >= refused
    # The restarted replica serves again: every create is planned.
    for _ in range(5):
        pod = admin.create(engine_pod(ns, LARGE), dry_run=True)
        assert PLAN_ANNOTATION in pod["metadata"]["annotations"]


def test_an_engine_deployment_rolls_out_with_real_readiness(
    node_plane: ControlPlane, real_node: RealNode, chart: ChartStack
) -> None:
    ns, name = chart.namespace, f"engine-{uuid.uuid4().hex[:6]}"
    tenant = node_plane.kube("tmi-installer")
    # Two GPUs for two replicas: an old Pod must go before a new one fits.
    tenant.create(
        engine_deployment(
            ns, name, LARGE, replicas=2, max_surge=0, max_unavailable=1, grace_seconds=1
        )
    )

    def rolled_out(generation: int) -> list[dict[str, Any]] | None:
        dep = tenant.get("apps/v1", "Deployment", name, ns)
        status = dep.get("status") or {}
        done = (
            status.get("observedGeneration", 0) >= generation
            and status.get("updatedReplicas") == 2
            and status.get("availableReplicas") == 2
            and status.get("replicas") == 2
        )
        if not done:
            return None
        listed = tenant.request(
            "GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": f"app={name}"}
        )
        pods = [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == 2 and all(is_ready(p) for p in pods) else None

    try:
        first = wait_until(lambda: rolled_out(1), timeout=ROLLOUT_TIMEOUT, what="the rollout")
        new_request = {**LARGE, "model": {**LARGE["model"], "weightsBytes": 52_000_000_000}}
        patch = {
            "spec": {
                "template": {
                    "metadata": {"annotations": {REQUEST_ANNOTATION: json.dumps(new_request)}}
                }
            }
        }
        tenant.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns}/deployments/{name}",
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )
        second = wait_until(lambda: rolled_out(2), timeout=ROLLOUT_TIMEOUT, what="the update")
        assert {p["metadata"]["uid"] for p in first}.isdisjoint(
            p["metadata"]["uid"] for p in second
        )
        seen = set()
        for pod in second:
            assert pod["spec"]["nodeName"] == real_node.name
            (device,) = real_node.allocations(pod["metadata"]["uid"])[("engine", "nvidia.com/gpu")]
            report = probe_report(tenant, ns, pod["metadata"]["name"], "engine")
            assert report["env"]["NVIDIA_VISIBLE_DEVICES"] == device
            seen.add(device)
        # Each replica holds its own GPU of the two.
        assert seen == set(real_node.fixture.uuids())
    finally:
        with contextlib.suppress(ApiError):
            node_plane.kube("admin").delete("apps/v1", "Deployment", name, ns)


def test_helm_test_passes_the_webhook_answers_and_the_extender_serves(
    node_plane: ControlPlane, chart: ChartStack
) -> None:
    """The chart's `helm test` Pods, run as `helm test` runs them (created, then read back):
    the tenant's (created by its installer) gets an answer from the webhook's plan API, the
    owner's from the extender, each over its Service and the certificate its callers check."""
    admin = node_plane.kube("admin")
    assert chart.tenant is not None and chart.owner is not None
    parts = ((chart.tenant, "tmi-installer"), (chart.owner, "admin"))
    ran = []
    for part, identity in parts:
        for pod in part.tests():
            namespace = pod["metadata"].get("namespace") or part.namespace
            name = pod["metadata"]["name"]
            node_plane.kube(identity).create(pod, namespace=namespace)
            try:
                done = wait_pod(
                    admin,
                    namespace,
                    name,
                    lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
                )
                log = admin.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
                # The client decodes a JSON answer, and tmi ping prints one.
                report = log if isinstance(log, dict) and "raw" not in log else None
                assert done["status"]["phase"] == "Succeeded", log
                assert report is not None and report["answered"] is True, log
                assert report["status"] < 500 and report["body"], log
                ran.append(name)
            finally:
                with contextlib.suppress(ApiError):
                    admin.delete("v1", "Pod", name, namespace, grace_period_seconds=0)
    assert ran == ["tmi-webhook-test", "tmi-extender-test"]


def test_prometheus_scrapes_every_chart_pod_through_its_podmonitor(
    node_plane: ControlPlane, chart: ChartStack
) -> None:
    """The chart's own metrics endpoints, as its Pods serve them on the node (plain HTTP on the
    port the PodMonitor names), scraped by a real Prometheus through the jobs its PodMonitors
    make: every Pod is up and exports its server's series under the labels the dashboards and
    alerts group by."""
    assert chart.values is not None
    values = {**chart.values, "monitoring": {"podMonitor": {"enabled": True}}}
    parts = ((TENANT, chart.namespace), (OWNER, chart.settings.scheduler_namespace))
    monitors = [
        doc
        for part, namespace in parts
        for doc in render(part_values(part, values), namespace=namespace)
        if doc["kind"] == "PodMonitor"
    ]
    ports = {str(e["port"]) for m in monitors for e in m["spec"]["podMetricsEndpoints"]}
    apps = {m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for m in monitors}
    pods = []
    for namespace, name in chart.deployments():
        for pod in chart.pods(namespace, name):
            if pod["metadata"]["labels"].get("app.kubernetes.io/name") not in apps:
                continue  # the owner's kube-scheduler, which no PodMonitor selects
            found = [
                (container["name"], port["containerPort"])
                for container in pod["spec"]["containers"]
                for port in container.get("ports") or []
                if port.get("name") in ports
            ]
            assert len(found) == 1, (pod["metadata"]["name"], found)
            ((container, port),) = found
            pods.append(
                ScrapedPod(
                    name=pod["metadata"]["name"],
                    namespace=namespace,
                    app=pod["metadata"]["labels"]["app.kubernetes.io/name"],
                    container=container,
                    address=f"{pod['status']['podIP']}:{port}",
                )
            )
    assert {p.app for p in pods} == {WEBHOOK, EXTENDER, CONTROLLER}
    jobs = podmonitor_scrape_configs(monitors, pods, "1s")
    with LocalPrometheus(node_plane.logs_dir, jobs, chart_rule_groups(), interval="1s") as prom:
        up = prom.wait_targets_up(len(pods))
        assert {t["labels"]["pod"] for t in up} == {p.name for p in pods}
        for monitor in monitors:
            job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
            series = prom.query(f'count by (pod) ({{__name__=~"tmi_.+", job="{job}"}})')
            assert series, f"the Pods of {job} exported no tmi_* series"
        # The servers' own labels (a tenant's namespace, the webhook's endpoint) are kept.
        assert not prom.query('count({__name__=~"tmi_.+", exported_namespace!=""})')
