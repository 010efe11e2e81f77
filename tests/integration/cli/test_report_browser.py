"""The report pages in a real browser: each page of `tmi evidence --html` and `tmi capacity
--html`, opened from a file as an owner opens an attachment, loads with no console error and no
fetch, shows every GPU UUID and Pod (every node and deployment) of the recorded reports as text
a person sees, and runs nothing a hostile name smuggles in.

Screenshots land in .artifacts/report-pages/ for a person to look at; with TMI_DOC_IMAGES=1 the
documentation's pictures (docs/images/) are taken afresh from the same pages.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from tests.evidencekit import MIG, SHARED
from tests.reportkit import (
    HOSTILE,
    capacity_fleet,
    capacity_report,
    evidence_report,
    gpu_uuids,
    pod_names,
)
from tmi_cli.report_capacity import capacity_page
from tmi_cli.report_evidence import evidence_page

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / ".artifacts" / "report-pages"
DOC_IMAGES = ROOT / "docs" / "images"
FLEET = [str(node["metadata"]["name"]) for node in capacity_fleet()]
# The pages the documentation shows (docs/sharing-evidence.md, docs/operations.md).
DOCUMENTED = {"evidence-report", "capacity-report"}


def _open(browser: webdriver.Chrome, page: str, path: Path) -> str:
    """Load `page` from a file as a person would; the text they see."""
    path.write_text(page)
    browser.get(path.as_uri())
    # Selenium leaves get_log unannotated; the entries are dicts with a "level".
    logs: list[dict[str, Any]] = browser.get_log("browser")  # type: ignore[no-untyped-call]
    severe = [e for e in logs if e.get("level") == "SEVERE"]
    assert severe == [], severe
    # Nothing was fetched: no style, font, image or script from anywhere.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    return str(browser.find_element(By.TAG_NAME, "body").text)


def _screenshot(browser: webdriver.Chrome, name: str) -> Path:
    """The whole page, as tall as it is, into the artefacts (and the docs when asked)."""
    height = int(browser.execute_script("return document.documentElement.scrollHeight"))
    browser.set_window_size(1400, min(height + 16, 8000))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    assert browser.save_screenshot(str(shot))
    if os.environ.get("TMI_DOC_IMAGES") == "1" and name in DOCUMENTED:
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        (DOC_IMAGES / f"{name}.png").write_bytes(shot.read_bytes())
    browser.set_window_size(1400, 900)
    return shot


@pytest.mark.parametrize(
    ("name", "report"),
    [("evidence-report", lambda: evidence_report(SHARED)),
     ("evidence-report-mig", lambda: evidence_report(MIG))],
)  # fmt: skip
def test_the_evidence_page_shows_every_gpu_and_pod(
    browser: webdriver.Chrome, tmp_path: Path, name: str, report: Callable[[], dict[str, Any]]
) -> None:
    document = report()
    text = _open(browser, evidence_page(document), tmp_path / f"{name}.html")
    for uuid in gpu_uuids(document):
        assert uuid in text
    for pod in pod_names(document):
        assert pod in text
    assert document["verdict"]["status"] in text
    assert _screenshot(browser, name).stat().st_size > 10_000


def test_the_capacity_page_shows_every_node_and_deployment(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    document = capacity_report()
    text = _open(browser, capacity_page(document, FLEET), tmp_path / "capacity.html")
    for node in FLEET:
        assert node in text
    for entry in [*document["placed"], *document["waiting"], *document["refused"]]:
        assert entry["name"] in text
    for waiting in document["waiting"]:
        assert waiting["reason"] in text
    assert _screenshot(browser, "capacity-report").stat().st_size > 10_000


@pytest.mark.parametrize("which", ["evidence", "capacity"])
def test_a_hostile_name_is_shown_as_text_and_never_run(
    browser: webdriver.Chrome, tmp_path: Path, which: str
) -> None:
    if which == "evidence":
        page = evidence_page(evidence_report(SHARED, hostile=True))
    else:
        page = capacity_page(capacity_report(hostile=True), FLEET)
    text = _open(browser, page, tmp_path / f"hostile-{which}.html")
    assert HOSTILE in text
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.accept()
    # The page's only script element is the embedded report, a data block.
    scripts = browser.find_elements(By.TAG_NAME, "script")
    assert [s.get_attribute("type") for s in scripts] == ["application/json"]
