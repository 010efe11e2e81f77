"""What the Prometheus e2e test (tests/e2e/operations/test_prometheus.py) builds on: the chart's
PodMonitors turned into the scrape jobs of a local Prometheus over the stack's processes, the
queries of the chart's Grafana dashboards, and the two ways the test makes a server slow.

Slowness is made, not mocked, and as each server's own latency metric measures it. The
extender's clock starts when a call's head has arrived, so a call whose body arrives over more
than a second (a congested link) is a slow answer. The webhook's starts once the body is read,
so it is frozen instead (SIGSTOP, as CPU throttling or a stalled node freezes it) at moments
while it answers reviews large enough to keep it busy.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chart_tools.render import OWNER, TENANT, part_values, render
from inference_policy.evidence import judge
from localcluster.install.stack import TenantStack
from localcluster.plane.components import HOST
from localcluster.plane.kube import JSON
from localcluster.plane.metrics import metric
from localcluster.servers.prometheus import ScrapedPod, podmonitor_scrape_configs
from localcluster.servers.server import LocalServer
from tests.evidencekit import SHARED, nvml_observation, owners, pods

FILES = Path(__file__).resolve().parents[2] / "charts" / "tmi" / "files"
DASHBOARDS = ("grafana-dashboard.json", "gpu-sharing-evidence-dashboard.json")
# Grafana's template variables, as "All" selects them.
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
LABEL_VALUES = re.compile(r"label_values\((?P<match>.+),\s*(?P<label>\w+)\)")


@dataclass(frozen=True)
class Panel:
    """One query of a dashboard panel, its variables as "All" sets them."""

    dashboard: str
    title: str
    expr: str


def _panels(panels: list[JSON]) -> Iterator[JSON]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_queries() -> list[Panel]:
    """Every target's expression of every panel of the chart's dashboards."""
    found = []
    for name in DASHBOARDS:
        dashboard = json.loads((FILES / name).read_text())
        for panel in _panels(dashboard["panels"]):
            for target in panel.get("targets") or []:
                expr = VARIABLE.sub(".*", target["expr"])
                found.append(Panel(name, panel["title"], expr))
    return found


def dashboard_variables() -> list[tuple[str, str, str]]:
    """Each `label_values(match, label)` variable of the dashboards: (name, match, label), with
    the variables it refers to as "All" sets them."""
    found = []
    for name in DASHBOARDS:
        dashboard = json.loads((FILES / name).read_text())
        for variable in dashboard.get("templating", {}).get("list", []):
            query = variable.get("query")
            text = query.get("query") if isinstance(query, dict) else query
            parts = LABEL_VALUES.fullmatch(str(text or ""))
            if variable.get("type") == "query" and parts:
                match = VARIABLE.sub(".*", parts["match"])
                found.append((variable["name"], match, parts["label"]))
    return found


# -- scraping the stack through the chart's PodMonitors ------------------------------------------


def podmonitors(stack: TenantStack) -> list[JSON]:
    """The PodMonitors both parts of the chart render for this stack with monitoring on."""
    values = {**stack.values(), "monitoring": {"podMonitor": {"enabled": True}}}
    settings = stack.settings
    docs = [
        *render(part_values(TENANT, values), namespace=settings.namespace),
        *render(part_values(OWNER, values), namespace=settings.scheduler_namespace),
    ]
    return [d for d in docs if d["kind"] == "PodMonitor"]


def _pod(server: LocalServer, namespace: str, app: str, container: str) -> ScrapedPod:
    return ScrapedPod(
        name=server.process_name,
        namespace=namespace,
        app=app,
        container=container,
        address=f"{HOST}:{server.port}",
        scheme=server.scheme,
        ca_file=server.plane.ca_file if server.scheme == "https" else None,
    )


def scrape_configs(stack: TenantStack, interval: str) -> tuple[list[JSON], int]:
    """The scrape jobs of the chart's PodMonitors over the stack's processes, and how many
    targets they name."""
    assert stack.webhook and stack.extender and stack.controller
    assert stack.tenant and stack.owner
    settings = stack.settings
    pods = [
        _pod(
            stack.webhook,
            settings.namespace,
            "tmi-webhook",
            stack.tenant.container("tmi-webhook")["name"],
        ),
        _pod(
            stack.extender,
            settings.scheduler_namespace,
            "tmi-extender",
            stack.owner.container("tmi-extender")["name"],
        ),
        *(
            _pod(
                replica,
                settings.scheduler_namespace,
                "tmi-allocation-controller",
                stack.owner.container(replica.deployment)["name"],
            )
            for replica in stack.controller.replicas
        ),
    ]
    return podmonitor_scrape_configs(podmonitors(stack), pods, interval), len(pods)


# -- slowness -----------------------------------------------------------------------------------


def post(server: LocalServer, path: str, body: bytes) -> int:
    """POST ``body`` to ``server`` as JSON; the answer's status."""
    context = ssl.create_default_context(cafile=str(server.plane.ca_file))
    request = urllib.request.Request(
        f"{server.url}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        answer.read()
        return int(answer.status)


def trickled_post(server: LocalServer, path: str, body: bytes, spread: float) -> int:
    """POST ``body`` to ``server`` with its second half sent ``spread`` seconds after the head
    and the first half; the answer's status."""
    context = ssl.create_default_context(cafile=str(server.plane.ca_file))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    half = len(body) // 2
    with (
        socket.create_connection((HOST, server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        tls.sendall(head + body[:half])
        time.sleep(spread)  # the slowness itself, not a wait for anything
        tls.sendall(body[half:])
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def large_review(namespace: str, annotations: int) -> bytes:
    """An AdmissionReview of a plain Pod with that many small annotations: parsing it keeps the
    webhook busy for tens of milliseconds inside the time it measures (150,000 take 70 ms, a
    few milliseconds more than the body takes to arrive)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"bulky-{uuid.uuid4().hex[:6]}",
            "namespace": namespace,
            "annotations": {f"k{i}": "xxxx" for i in range(annotations)},
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "tmi-installer"},
            "object": pod,
        },
    }
    return json.dumps(review).encode()


def slow_share(server: LocalServer, name: str, **labels: str) -> float:
    """The share of the answers histogram ``name`` (with ``labels``) counted over a second, as
    ``server`` reports it: over 0.01, its 99th percentile is above a second."""
    samples = server.metrics()
    total = metric(samples, f"{name}_count", **labels)
    fast = metric(samples, f"{name}_bucket", le="1.0", **labels)
    return (total - fast) / total if total else 0.0


def freeze_while_busy(
    server: LocalServer, send: Callable[[], object], done: Callable[[], bool], timeout: float
) -> int:
    """Until ``done``, freeze ``server``'s process for 1.2 s at random moments while a thread
    calls ``send`` back to back; how many freezes it took. A freeze that lands inside an answer
    makes that answer slow by its length."""
    assert server.process is not None
    pid = server.process.pid
    stop = threading.Event()
    failures: list[BaseException] = []

    def sender() -> None:
        while not stop.is_set():
            try:
                send()
            except OSError as exc:  # a call cut short by the freeze is just not counted
                failures.append(exc)

    thread = threading.Thread(target=sender, name="busy-sender", daemon=True)
    thread.start()
    freezes = 0
    deadline = time.monotonic() + timeout
    try:
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"still not done after {freezes} freezes: {failures[-3:]}")
            time.sleep(random.uniform(0.05, 0.3))
            os.killpg(pid, signal.SIGSTOP)
            try:
                time.sleep(1.2)
            finally:
                os.killpg(pid, signal.SIGCONT)
            freezes += 1
    finally:
        stop.set()
        thread.join(timeout=15)
    return freezes


def evidence_body(node: str) -> dict[str, Any]:
    """A `tmi evidence` report of the shared-H200 fixture, as ``node``'s reporter posts it."""
    observation = nvml_observation(SHARED)
    return judge(observation, owners(SHARED, observation), pods(SHARED), node=node)
