"""The runbook covers every code an operator can meet, and every alert links into it.

docs/operations.md is keyed by the refusal codes (``RefusalCode``), the extender's node verdict
codes (``NodeVerdictCode``) and the AllocationVerified reasons (``codes.ALLOCATION_REASONS``);
the lists are closed, so a code added without its runbook section fails here. The chart's alerts
name runbook anchors, which must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from inference_policy.base.codes import (
    ALLOCATION_REASONS,
    VERDICT_DESCRIPTIONS,
    NodeVerdictCode,
    RefusalCode,
)

ROOT = Path(__file__).resolve().parents[4]
RUNBOOK = ROOT / "docs" / "operations.md"
ALERTS = ROOT / "charts" / "tmi" / "files" / "alerts.yaml"


def headings() -> list[str]:
    return re.findall(r"^### (\S+)\s*$", RUNBOOK.read_text(), flags=re.MULTILINE)


def anchors() -> set[str]:
    # GitHub's anchors for these one-word headings: the heading, lower-cased.
    return {h.lower() for h in headings()}


@pytest.mark.parametrize("code", [c.value for c in RefusalCode])
def test_every_refusal_code_has_a_section(code: str) -> None:
    assert code in headings()


@pytest.mark.parametrize("code", [c.value for c in NodeVerdictCode])
def test_every_node_verdict_code_has_a_section(code: str) -> None:
    assert code in headings()


def test_every_node_verdict_code_is_described() -> None:
    assert set(VERDICT_DESCRIPTIONS) == set(NodeVerdictCode)


@pytest.mark.parametrize("reason", ALLOCATION_REASONS)
def test_every_allocation_verified_reason_has_a_section(reason: str) -> None:
    assert reason in headings()


def test_no_section_is_twice() -> None:
    assert len(headings()) == len(set(headings()))


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_alert_links_to_a_section() -> None:
    found = anchors()
    for rule in alerts():
        link = str(rule["annotations"]["runbook"])  # type: ignore[index]
        page, _, anchor = link.partition("#")
        assert page == "docs/operations.md"
        if "{{" in anchor:
            # Keyed by a label: every value it can take has a section (checked above).
            assert "$labels.reason" in anchor
            continue
        assert anchor in found, rule["alert"]


def test_every_alert_is_documented_by_name() -> None:
    names = {str(rule["alert"]) for rule in alerts()}
    assert names <= set(headings())
