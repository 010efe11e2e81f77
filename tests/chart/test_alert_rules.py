"""The chart's alerts hold in Prometheus's own rule engine, not only by the metric names they use.

promtool (Debian's `prometheus` package, installed when missing by
`localcluster.servers.prometheus.prometheus_binaries`) checks the rule groups the chart's
PrometheusRule carries and runs the unit tests of tests/chart/prometheus/alerts_test.yaml: for
every alert, series that make it fire (its labels and annotations once its `for:` has passed)
and series that leave it quiet. A broken expression, a wrong `by` clause or an annotation that no
longer renders fails here. The e2e tier proves the same rules against the servers themselves
(tests/e2e/operations/test_prometheus.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.servers.prometheus import chart_rule_groups, prometheus_binaries

UNIT_TESTS = Path(__file__).resolve().parent / "prometheus" / "alerts_test.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return prometheus_binaries()[1]


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The chart's groups as the rule file the unit tests name (rules.yaml), beside them."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": chart_rule_groups()}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return tmp_path


def alert_names() -> list[str]:
    return [r["alert"] for g in chart_rule_groups() for r in g["rules"] if "alert" in r]


def run(promtool: Path, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_promtool_checks_the_chart_rules(promtool: Path, rules_dir: Path) -> None:
    output = run(promtool, "check", "rules", "--lint=all", "rules.yaml", cwd=rules_dir)
    assert f"SUCCESS: {len(alert_names())} rules found" in output


def test_each_alert_fires_and_stays_quiet_in_promtool_unit_tests(
    promtool: Path, rules_dir: Path
) -> None:
    output = run(promtool, "test", "rules", UNIT_TESTS.name, cwd=rules_dir)
    assert "SUCCESS" in output


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    """A new alert without unit tests, or a test of an alert that is gone, fails here."""
    cases: list[dict[str, Any]] = [
        case
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    names = set(alert_names())
    assert {c["alertname"] for c in cases} == names
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert firing == names, f"no case where these fire: {sorted(names - firing)}"
    assert quiet == names, f"no case where these stay quiet: {sorted(names - quiet)}"
