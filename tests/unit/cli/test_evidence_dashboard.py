"""The GPU-sharing evidence dashboard queries only what the collector exports: every metric a panel
or variable names is emitted for the fixtures' reports, with every label the query selects or
groups by, and the reporter manifests point at what the CLI and the controller serve."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from allocation_controller.evidence import (
    EVIDENCE_PATH,
    METRIC_NAMES,
    EvidenceBoard,
    EvidenceCollector,
)
from inference_policy.evidence import judge
from tests.evidencekit import MIG, SHARED, nvml_observation, owners, pods
from tmi_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "manifests" / "monitoring"
DASHBOARD = ROOT / "charts" / "tmi" / "files" / "gpu-sharing-evidence-dashboard.json"
_METRIC = re.compile(r"\btmi_evidence_[a-z_]+")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"(tmi_evidence_[a-z_]+)\{([^}]*)\}")


def exported() -> dict[str, set[str]]:
    """Metric sample name -> the label names it carries, for the fixtures' reports."""
    board = EvidenceBoard()
    for directory, node in ((SHARED, "gpu-h200-0"), (MIG, "gpu-h200-1")):
        observation = nvml_observation(directory)
        board.accept(judge(observation, owners(directory, observation), pods(directory), node=node))
    registry = CollectorRegistry()
    registry.register(EvidenceCollector(board))
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"]
        for v in dashboard["templating"]["list"]
        if isinstance(v.get("query"), dict)
    ]
    return exprs


def test_every_metric_the_dashboard_uses_is_exported_with_its_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    samples = exported()
    exprs = queries(dashboard)
    assert len(exprs) >= 10
    used: set[str] = set()
    for expr in exprs:
        names = _METRIC.findall(expr)
        assert names, expr
        for name in names:
            used.add(name)
            assert name in samples, f"{name} is not exported ({expr})"
        grouped = {
            label.strip() for group in _BY.findall(expr) for label in group.split(",") if label
        }
        for name in names:
            assert grouped <= samples[name], f"{name} lacks {grouped - samples[name]} ({expr})"
        for name, selector in _SELECTOR.findall(expr):
            selected = {part.split("=")[0].strip().rstrip("!~") for part in selector.split(",")}
            assert selected <= samples[name], f"{name} lacks {selected - samples[name]}"
    # The four figures are on the dashboard.
    for figure in (
        "tmi_evidence_granted_bytes",
        "tmi_evidence_used_bytes",
        "tmi_evidence_overuse_bytes",
        "tmi_evidence_unaccounted_processes",
    ):
        assert figure in used
    exported_names = {name.removesuffix("_total") for name in samples}
    assert exported_names == set(METRIC_NAMES)


def test_the_dashboard_is_organised_by_tenant_workload_worker_and_physical_uuid() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"namespace", "workload", "node", "gpu_uuid"} <= variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "tmi-gpu-sharing-evidence"


def test_the_reporter_runs_the_cli_against_the_controllers_route() -> None:
    documents = list(yaml.safe_load_all((MONITORING / "evidence-reporter.yaml").read_text()))
    daemonset = next(d for d in documents if d["kind"] == "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    (container,) = spec["containers"]
    args = container["args"]
    # The flags parse as `tmi evidence` takes them.
    parsed = build_parser().parse_args([*container["command"][1:], *args])
    assert parsed.pods_from_api and parsed.every == 30 and parsed.samples == 6
    assert parsed.post.endswith(EVIDENCE_PATH)
    service = yaml.safe_load((MONITORING / "evidence-service.yaml").read_text())
    host = parsed.post.split("//", 1)[1].split(":", 1)[0]
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert service["spec"]["ports"][0]["port"] == int(parsed.post.rsplit(":", 1)[1].split("/")[0])
