"""The cluster view of GPU-sharing evidence: each GPU node's latest `tmi evidence` report, as
Prometheus gauges labelled by node, namespace, Pod, workload, binding and physical GPU UUID.

A reporter DaemonSet on the GPU nodes (manifests/monitoring/evidence-reporter.yaml) runs
`tmi evidence --every ... --post` and PUTs each report here. The controller keeps the latest
report per node and forgets one that is not refreshed within its lifetime, so a node that stops
reporting loses its series rather than showing its last figures forever. The figures are
computed on the node (`inference_policy.evidence.judge`, with the Pods' plans); the collector
only reads them back through `inference_policy.evidence.read_report`, which refuses anything
that is not such a report, so a bad post cannot mint label sets.

Writes need a bearer token the owner puts in a Secret (TMI_EVIDENCE_TOKEN); without one the
route is not served at all.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inference_policy.evidence import EvidenceError, ReportView, read_report
from serving.app import read_limited
from serving.probes import json_response, problem

__all__ = [
    "ALLOCATION_LABELS",
    "EVIDENCE_PATH",
    "GPU_LABELS",
    "METRIC_NAMES",
    "EvidenceBoard",
    "EvidenceCollector",
    "add_evidence_routes",
]

EVIDENCE_PATH = "/evidence"
MAX_REPORT_BYTES = 4 * 1024 * 1024
DEFAULT_TTL_S = 300.0
MAX_NODES = 4096

ALLOCATION_LABELS = (
    "node",
    "namespace",
    "pod",
    "workload",
    "binding",
    "gpu_uuid",
    "mig_instance",
    "isolation",
)
GPU_LABELS = ("node", "gpu_uuid")
METRIC_NAMES = (
    "tmi_evidence_granted_bytes",
    "tmi_evidence_used_bytes",
    "tmi_evidence_overuse_bytes",
    "tmi_evidence_share_honoured",
    "tmi_evidence_unaccounted_processes",
    "tmi_evidence_unaccounted_bytes",
    "tmi_evidence_gpu_pods",
    "tmi_evidence_overlapping_pairs",
    "tmi_evidence_node_honoured",
    "tmi_evidence_report_age_seconds",
    "tmi_evidence_reports",
)


@dataclass(frozen=True)
class _Entry:
    view: ReportView
    received: float


class EvidenceBoard:
    """The latest report of each node, until it is older than `ttl` seconds."""

    def __init__(self, ttl: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self.accepted = 0
        self.refused = 0

    def accept(self, document: object) -> ReportView:
        """Keep a report as its node's latest; EvidenceError when it is not a report."""
        try:
            view = read_report(document)
        except EvidenceError:
            self.refused += 1
            raise
        self._expire()
        if view.node not in self._entries and len(self._entries) >= MAX_NODES:
            self.refused += 1
            raise EvidenceError(f"reports from more than {MAX_NODES} nodes are not kept")
        self._entries[view.node] = _Entry(view, self.clock())
        self.accepted += 1
        return view

    def _expire(self) -> None:
        now = self.clock()
        for node in [n for n, e in self._entries.items() if now - e.received > self.ttl]:
            del self._entries[node]

    def current(self) -> list[tuple[ReportView, float]]:
        """Each live node's report and its age in seconds."""
        self._expire()
        now = self.clock()
        return [(e.view, now - e.received) for _, e in sorted(self._entries.items())]


class EvidenceCollector(Collector):
    """Renders the board at each scrape: no series outlives the report it came from."""

    def __init__(self, board: EvidenceBoard) -> None:
        self.board = board

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, text: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=list(labels))

        granted = gauge(
            "tmi_evidence_granted_bytes",
            "GPU memory the Pod's plan grants on this GPU (share, MIG slice or whole device)",
            ALLOCATION_LABELS,
        )
        used = gauge(
            "tmi_evidence_used_bytes",
            "Peak GPU memory the driver accounted to the Pod's processes over the report's samples",
            ALLOCATION_LABELS,
        )
        overuse = gauge(
            "tmi_evidence_overuse_bytes",
            "Used memory beyond the grant (0 when within it)",
            ALLOCATION_LABELS,
        )
        honoured = gauge(
            "tmi_evidence_share_honoured",
            "1 when the allocation is honoured, 0 when not, -1 when inconclusive",
            ALLOCATION_LABELS,
        )
        unaccounted = gauge(
            "tmi_evidence_unaccounted_processes",
            "Processes on the GPU that belong to no granted Pod (bypasses)",
            GPU_LABELS,
        )
        unaccounted_bytes = gauge(
            "tmi_evidence_unaccounted_bytes",
            "GPU memory held by processes that belong to no granted Pod",
            GPU_LABELS,
        )
        pods = gauge("tmi_evidence_gpu_pods", "Pods seen holding a context on the GPU", GPU_LABELS)
        pairs = gauge(
            "tmi_evidence_overlapping_pairs",
            "Pairs of holders seen on the GPU in the same sample",
            GPU_LABELS,
        )
        node_ok = gauge(
            "tmi_evidence_node_honoured",
            "1 when the node's report says every share is honoured, 0 when not, -1 inconclusive",
            ("node",),
        )
        age = gauge(
            "tmi_evidence_report_age_seconds", "Seconds since the node's report arrived", ("node",)
        )
        states = {"honoured": 1.0, "not-honoured": 0.0, "inconclusive": -1.0}
        for view, seconds in self.board.current():
            node_ok.add_metric([view.node], states[view.status])
            age.add_metric([view.node], seconds)
            for row in view.allocations:
                labels = [
                    row.node,
                    row.namespace,
                    row.pod,
                    row.workload,
                    row.binding,
                    row.gpu_uuid,
                    row.mig_instance,
                    row.isolation,
                ]
                if row.granted_bytes is not None:
                    granted.add_metric(labels, row.granted_bytes)
                if row.used_bytes is not None:
                    used.add_metric(labels, row.used_bytes)
                if row.overuse_bytes is not None:
                    overuse.add_metric(labels, row.overuse_bytes)
                honoured.add_metric(labels, states[row.status])
            for gpu in view.gpus:
                labels = [gpu.node, gpu.gpu_uuid]
                unaccounted.add_metric(labels, gpu.unaccounted_processes)
                unaccounted_bytes.add_metric(labels, gpu.unaccounted_bytes)
                pods.add_metric(labels, gpu.pods)
                pairs.add_metric(labels, gpu.overlapping_pairs)
        reports = CounterMetricFamily(
            "tmi_evidence_reports", "Evidence reports received, by result", labels=["result"]
        )
        reports.add_metric(["accepted"], self.board.accepted)
        reports.add_metric(["refused"], self.board.refused)
        yield from (
            granted,
            used,
            overuse,
            honoured,
            unaccounted,
            unaccounted_bytes,
            pods,
            pairs,
            node_ok,
            age,
            reports,
        )


def add_evidence_routes(
    app: web.Application, board: EvidenceBoard, token: str, registry: CollectorRegistry
) -> None:
    """Serve `PUT /evidence` (bearer `token`) into `board`, and export the board on `registry`.
    A report is read like any server's body (`serving.app.read_limited`): within the app's read
    timeout, and up to its `client_max_size`, which is to be MAX_REPORT_BYTES."""
    if not token:
        raise ValueError("the evidence route needs a token")
    expected = f"Bearer {token}".encode()
    too_large = {"status": 413, "detail": f"a report is at most {MAX_REPORT_BYTES} bytes"}
    registry.register(EvidenceCollector(board))

    async def put_evidence(request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return problem(401, "a bearer token is required to post evidence")
        body = await read_limited(request, MAX_REPORT_BYTES, too_large)
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            board.refused += 1
            return problem(400, "the body is not JSON")
        try:
            view = board.accept(document)
        except EvidenceError as exc:
            return problem(400, str(exc))
        return json_response(
            {"node": view.node, "allocations": len(view.allocations), "status": view.status}
        )

    async def get_evidence(request: web.Request) -> web.Response:
        return json_response(
            [
                {"node": view.node, "status": view.status, "ageSeconds": round(age, 1)}
                for view, age in board.current()
            ]
        )

    app.router.add_put(EVIDENCE_PATH, put_evidence)
    app.router.add_get(EVIDENCE_PATH, get_evidence)
