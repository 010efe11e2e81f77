"""docs/compatibility.md as `make test-versions` writes it: one row per release and check, and
a run of some releases keeping the others' rows and the dates they were checked on."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster.install import version_check


def test_the_report_round_trips_and_orders_by_minor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "compatibility.md"
    monkeypatch.setattr(version_check, "REPORT", report)
    results = {
        "v1.37.2": [("dry run, policies", "pass", "2026-12-04")],
        "v1.30.14": [
            ("dry run, policies", "fail: MutatingAdmissionPolicy x: not served", "2026-12-03")
        ],
    }
    report.write_text(version_check._table(results))
    rows = [row for row in report.read_text().splitlines() if row.startswith("| v1.")]
    assert [row.split("|")[1].strip() for row in rows] == ["v1.30.14", "v1.37.2"]
    assert version_check._recorded() == results


def test_the_checked_in_report_lists_every_minor_of_the_range() -> None:
    text = version_check.REPORT.read_text()
    makefile = (version_check.ROOT / "mk" / "controlplane.mk").read_text()
    line = next(row for row in makefile.splitlines() if row.startswith("K8S_RANGE ?="))
    for version in line.split("?=")[1].split():
        assert f"| {version} |" in text, version


def test_a_failure_that_spans_lines_stays_one_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "compatibility.md"
    monkeypatch.setattr(version_check, "REPORT", report)
    failure = "fail: the stack did not come up: timed out; log:\n\tline | one\n\tline two"
    results = {"v1.33.13": [("the stack", failure, "2026-12-04")]}
    report.write_text(version_check._table(results))
    assert version_check._recorded() == {
        "v1.33.13": [
            (
                "the stack",
                "fail: the stack did not come up: timed out; log: line / one line two",
                "2026-12-04",
            )
        ]
    }
