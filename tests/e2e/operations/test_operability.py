"""What the chart ships for operators refers to what the servers really export.

The PrometheusRule (charts/tmi/files/alerts.yaml) and the Grafana dashboard
(charts/tmi/files/grafana-dashboard.json) name metrics; an alert on a metric no server exports
never fires. The stack here answers a planned and a refused engine Pod, places and verifies the
first, and then each metric name the rule and the dashboard use must be in some server's
/metrics, as a sample or as a declared family (a labelled counter may have no sample yet).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kits.stackkit import (
    LARGE,
    h100_stack,
    pod_names,
)
from localcluster import ApiError, ControlPlane
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.servers.webhook import REQUEST_ANNOTATION

pytestmark = pytest.mark.e2e

FILES = Path(__file__).resolve().parents[3] / "charts" / "tmi" / "files"
METRIC = re.compile(r"\btmi_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(
        control_plane, "tmi-ops", 30, gpus=1, gpu_product="NVIDIA-H100-80GB-HBM3"
    ) as up:
        yield up


def exported(text: str) -> set[str]:
    """Every series name the exposition declares or carries."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        # A family is declared even with no series yet (a histogram nothing has observed).
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def referenced() -> dict[str, set[str]]:
    """Metric names per source file: alert expressions and dashboard targets."""
    alerts = yaml.safe_load((FILES / "alerts.yaml").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    dashboard = json.loads((FILES / "grafana-dashboard.json").read_text())
    targets = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {
        "alerts.yaml": {m for e in exprs for m in METRIC.findall(e)},
        "grafana-dashboard.json": {m for e in targets for m in METRIC.findall(e)},
    }


def test_every_metric_the_rule_and_dashboard_use_is_exported(
    control_plane: ControlPlane, stack: TenantStack
) -> None:
    namespace = stack.settings.namespace
    installer = control_plane.kube("tmi-installer")
    with pod_names(control_plane, stack) as name:
        placed = name("ops")
        installer.create(engine_pod(namespace, LARGE, name=placed))
        control_plane.kube("admin").wait_for(
            "v1",
            "Pod",
            placed,
            namespace,
            lambda p: (condition(p, CONDITION) or {}).get("status") == "True",
            timeout=60,
            what=f"Pod {placed} verified",
        )
        refused = engine_pod(namespace, LARGE, name=name("refused"))
        refused["metadata"]["annotations"][REQUEST_ANNOTATION] = "{not json"
        with pytest.raises(ApiError):
            installer.create(refused, dry_run=True)

        assert stack.webhook is not None and stack.extender is not None
        assert stack.controller is not None
        texts = [
            stack.webhook.metrics_text(),
            stack.extender.metrics_text(),
            *(stack.controller.metrics_text(i) for i in range(len(stack.controller.replicas))),
        ]
    names = set().union(*(exported(t) for t in texts))
    for source, used in referenced().items():
        assert used, source
        missing = sorted(used - names)
        assert not missing, f"{source} uses metrics no server exports: {missing}"
