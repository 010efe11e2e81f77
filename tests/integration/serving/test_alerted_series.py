"""Every series an alert counts a first event on is exported from 0 before that event.

Prometheus has no sample of a series before it appears, so a counter series born at 1 is no
increase to `rate` or `increase`: the chart's TmiAllocationVerifiedFalse would miss the first
False verdict of a reason, TmiWebhookErrors the first server-side refusal and TmiExtenderErrors
the first failed call (tests/e2e/operations/test_prometheus.py brings each about once). Each
server therefore writes those series at 0 from its start, which is what is read here, from a
fresh server's registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from allocation_controller.metrics import Metrics
from extender.app import RUNTIME as EXTENDER_RUNTIME
from inference_policy.base.codes import ALLOCATION_REASONS
from kits.extenderkit import extender_app
from kits.profilekit import Owner
from kits.webhookkit import webhook_app
from localcluster.plane.metrics import parse_metrics
from webhook.app import RUNTIME as WEBHOOK_RUNTIME


def series(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in parse_metrics(generate_latest(registry).decode())
        if s.name == name
    }


def test_the_controller_exports_every_verdict_reason_from_zero() -> None:
    verdicts = series(Metrics().registry, "tmi_allocation_verdicts_total")
    assert set(verdicts.values()) == {0.0}
    reasons = {dict(labels)["reason"]: dict(labels)["status"] for labels in verdicts}
    assert set(reasons) == set(ALLOCATION_REASONS)
    assert reasons["Verified"] == "True"
    assert reasons["PlanMismatch"] == "False"
    assert reasons["VerifiedSharedWithAnotherTenant"] == "True"
    assert reasons["SharedWithAnotherTenant"] == "False"


def test_the_webhook_exports_its_server_side_refusals_from_zero() -> None:
    app, _, _ = webhook_app(Owner())
    decisions = series(app[WEBHOOK_RUNTIME].metrics.registry, "tmi_webhook_decisions_total")
    server_side = {
        (d["endpoint"], d["status"], d["reason"])
        for d in map(dict, decisions)
        if d["status"].startswith("5")
    }
    assert server_side == {
        ("mutate", "503", "profile-refused"),
        ("plan", "503", "profile-refused"),
        ("mutate", "503", "catalog-unavailable"),
        ("plan", "503", "catalog-unavailable"),
        ("mutate", "500", "internal-error"),
        ("plan", "500", "internal-error"),
    }
    assert set(decisions.values()) == {0.0}


def test_the_extender_exports_its_failed_calls_from_zero() -> None:
    app, _ = extender_app(Owner())
    requests = series(app[EXTENDER_RUNTIME].metrics.registry, "tmi_extender_requests_total")
    assert {(dict(k)["verb"], dict(k)["outcome"]) for k in requests} == {
        (verb, outcome)
        for verb in ("filter", "prioritize")
        for outcome in ("error", "not-ready", "profile-refused")
    }
    assert set(requests.values()) == {0.0}
