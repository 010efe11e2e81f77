"""The local Prometheus scrapes as the Prometheus Operator would from the chart's PodMonitors.

What the e2e test proves about label names (an alert grouping by `namespace`, a panel filtering
on `endpoint`) holds for an install only if the harness's scrape jobs carry the target labels the
Operator gives a PodMonitor's targets and the PodMonitor's own `honorLabels`; and its waits read
the API's nanosecond timestamps.
"""

from __future__ import annotations

from pathlib import Path

from localcluster.servers.prometheus import (
    ScrapedPod,
    api_time,
    chart_rule_groups,
    podmonitor_scrape_configs,
)


def monitor(honour: bool | None) -> dict[str, object]:
    endpoint: dict[str, object] = {"port": "metrics", "path": "/metrics", "interval": "30s"}
    if honour is not None:
        endpoint["honorLabels"] = honour
    return {
        "kind": "PodMonitor",
        "metadata": {"name": "tmi-webhook", "namespace": "kamiwaza"},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "tmi-webhook"}},
            "podMetricsEndpoints": [endpoint],
        },
    }


PODS = [
    ScrapedPod(
        "tmi-webhook-a",
        "kamiwaza",
        "tmi-webhook",
        "webhook",
        "127.0.0.1:1",
        "https",
        Path("/ca.pem"),
    ),
    ScrapedPod("tmi-extender-a", "kamiwaza-scheduling", "tmi-extender", "extender", "127.0.0.1:2"),
]


def test_a_podmonitor_scrapes_the_pods_it_selects_with_the_operators_labels() -> None:
    (job,) = podmonitor_scrape_configs([monitor(True)], PODS, "1s")
    assert job["job_name"] == "podMonitor/kamiwaza/tmi-webhook/0"
    assert job["honor_labels"] is True
    assert job["scheme"] == "https"
    assert job["tls_config"] == {"ca_file": "/ca.pem"}
    assert job["scrape_interval"] == "1s"
    (targets,) = job["static_configs"]
    assert targets["targets"] == ["127.0.0.1:1"]
    assert targets["labels"] == {
        "namespace": "kamiwaza",
        "pod": "tmi-webhook-a",
        "container": "webhook",
        "endpoint": "metrics",
        "job": "kamiwaza/tmi-webhook",
    }


def test_labels_are_not_honoured_unless_the_podmonitor_says_so() -> None:
    (job,) = podmonitor_scrape_configs([monitor(None)], PODS, "1s")
    assert job["honor_labels"] is False


def test_the_rules_copy_shortens_every_for() -> None:
    rules = [r for g in chart_rule_groups(for_="1s") for r in g["rules"]]
    assert rules
    assert {r["for"] for r in rules} == {"1s"}
    assert {r["for"] for g in chart_rule_groups() for r in g["rules"]} != {"1s"}


def test_timestamps_with_nanoseconds_and_zones_are_read() -> None:
    assert api_time("2026-05-01T10:00:00.123456789Z") == 1777629600.123456
    assert api_time("2026-05-01T10:00:00Z") == 1777629600.0
    assert api_time("2026-05-01T12:00:00.5+02:00") == 1777629600.5
