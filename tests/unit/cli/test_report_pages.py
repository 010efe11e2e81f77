"""The HTML pages of `tmi evidence --html` and `tmi capacity --html`: each GPU, Pod, node and
deployment of the recorded reports is on its page, a tenant's hostile name is escaped, nothing
is fetched from a network, and the page carries the very JSON the command prints."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from kits.profilekit import CLUSTER, NAMESPACE, NOW_TEXT, Owner, with_profiles
from kits.stackkit import whole_h100_profile
from tests.evidencekit import MIG, SHARED, FakeEvidenceNvml, load
from tests.reportkit import (
    HOSTILE,
    capacity_fleet,
    capacity_report,
    evidence_report,
    gpu_uuids,
    pod_names,
)
from tmi_cli import evidence_command, main
from tmi_cli.gpu_processes import NvmlReader
from tmi_cli.report_capacity import capacity_page
from tmi_cli.report_evidence import evidence_page

_EMBEDDED = re.compile(
    r'<script type="application/json" id="tmi-report">(?P<json>.*?)</script>', re.S
)
# Any attribute or CSS that would make the browser fetch: a src, href, srcset, action, poster
# or url() naming a scheme or a scheme-relative address (a page-internal "#anchor" is fine).
_FETCH = re.compile(
    r"""(?:\b(?:src|href|srcset|action|poster|data)\s*=\s*["']?\s*(?!#)[a-z][a-z0-9+.-]*:"""
    r"""|\b(?:src|href)\s*=\s*["']?\s*//|url\(\s*["']?(?!#)[a-z/])""",
    re.I,
)


def assert_self_contained(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    assert not _FETCH.search(page), _FETCH.search(page)
    assert "default-src 'none'" in page  # the browser refuses any fetch the markup could ask
    # The only script element is the embedded report, a data block no browser runs.
    assert page.count("<script") == 1 == len(_EMBEDDED.findall(page))


def embedded(page: str) -> Any:
    found = _EMBEDDED.search(page)
    assert found is not None
    return json.loads(found["json"])


@pytest.mark.parametrize("directory", [SHARED, MIG], ids=["shared", "mig"])
def test_the_evidence_page_shows_each_gpu_and_pod_and_embeds_the_report(directory: Path) -> None:
    report = evidence_report(directory)
    page = evidence_page(report)
    for uuid in gpu_uuids(report):
        assert uuid in page
    for pod in pod_names(report):
        assert pod in page
    assert f">{report['verdict']['status']}<" in page
    assert embedded(page) == report
    assert_self_contained(page)


def test_the_evidence_page_marks_overlaps_over_grant_and_outside_processes() -> None:
    page = evidence_page(evidence_report(SHARED))
    # The memory-pressure Pod went 1 GiB past its 4 GiB share; a host process and a Pod with no
    # grant held the card; every holder overlapped in memory.
    assert "5.0 GiB used of 4.0 GiB granted · 1.0 GiB over" in page
    assert "not-in-a-pod" in page and "no-gpu-grant" in page
    assert "overlap: samples 0–2 (sharing memory)" in page
    mig = evidence_page(evidence_report(MIG))
    assert "(on separate MIG slices)" in mig and "(sharing memory)" not in mig


def test_a_hostile_pod_name_is_escaped_everywhere() -> None:
    report = evidence_report(SHARED, hostile=True)
    page = evidence_page(report)
    assert HOSTILE not in page and "<script>" not in page
    assert escape(HOSTILE) in page
    assert embedded(page)["gpus"][0]["pods"][0]["pod"] == HOSTILE
    assert_self_contained(page)


def test_a_report_without_gpus_says_so() -> None:
    report = evidence_report(SHARED)
    report.update(gpus=[], allocations=[], overlaps=[], bypasses=[])
    page = evidence_page(report)
    assert "No GPU was read" in page
    assert_self_contained(page)


def test_the_capacity_page_draws_every_node_placement_and_waiting_reason() -> None:
    report = capacity_report(hostile=True)
    page = capacity_page(report, [n["metadata"]["name"] for n in capacity_fleet()])
    for node in ("h100-a", "h100-b", "l40s-0"):
        assert f'<span class="mono">{node}</span>' in page
    for placed in report["placed"]:
        assert escape(placed["name"]) in page
    for waiting in report["waiting"]:
        assert waiting["name"] in page and escape(waiting["reason"]) in page
        assert waiting["code"] in page
    assert "1 stranded" in page and "32 GB stranded" in page
    assert "engine-not-qualified" in page
    assert HOSTILE not in page and "<script>" not in page
    assert embedded(page) == report
    assert_self_contained(page)


def test_a_node_with_nothing_to_offer_still_appears() -> None:
    page = capacity_page(capacity_report(), ["cpu-only", "h100-a"])
    assert '<span class="mono">cpu-only</span>' in page
    assert "No accelerator offered, held or free." in page


# -- the commands --------------------------------------------------------------------------------


def test_tmi_evidence_writes_the_page_beside_the_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = load(SHARED, "nvml-samples.json")
    monkeypatch.setattr(evidence_command, "open_reader", lambda: NvmlReader(FakeEvidenceNvml(dump)))
    monkeypatch.setattr("time.sleep", lambda s: None)
    out = tmp_path / "evidence.html"
    status = main.main(
        ["evidence", "--pods", str(SHARED / "pods.json"), "--proc", str(SHARED / "proc"),
         "--node", "gpu-h200-0", "--samples", "3", "--interval", "0", "--html", str(out)]
    )  # fmt: skip
    printed, err = capsys.readouterr()
    assert status == 1
    # Piped (not a terminal): no progress bar in the log.
    assert err == ""
    report = json.loads(printed)
    page = out.read_text()
    assert embedded(page) == report
    assert "tmi-memory-pressure-q7k2p" in page


def test_tmi_evidence_refuses_an_html_path_it_cannot_write_before_sampling(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def never() -> Any:
        raise AssertionError("sampled although the page could not be written")

    monkeypatch.setattr(evidence_command, "open_reader", never)
    status = main.main(["evidence", "--html", str(tmp_path / "no-such-dir" / "e.html")])
    assert status == 2 and "does not exist" in capsys.readouterr().err


def _capacity_argv(tmp_path: Path, *extra: str) -> list[str]:
    owner = Owner()
    bundle, deps, fleet = tmp_path / "bundle.json", tmp_path / "deps.json", tmp_path / "nodes.json"
    bundle.write_text(json.dumps(owner.sign(with_profiles(owner, whole_h100_profile()))))
    large = json.loads((Path(__file__).resolve().parents[3] / "examples" /
                        "request-llama70b-vllm.json").read_text())  # fmt: skip
    deps.write_text(json.dumps([{"name": HOSTILE, "request": large, "tenant": "team-a"}]))
    fleet.write_text(json.dumps({"items": capacity_fleet()}))
    return [
        "capacity", "--bundle", str(bundle), "--owner-public-key", owner.public_key,
        "--cluster-binding-id", CLUSTER, "--namespace", NAMESPACE, "--now", NOW_TEXT,
        "--deployments", str(deps), "--fleet", str(fleet), *extra,
    ]  # fmt: skip


def test_tmi_capacity_writes_the_page_with_the_json_it_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "capacity.html"
    assert main.main(_capacity_argv(tmp_path, "-o", "json", "--html", str(out))) == 0
    printed, err = capsys.readouterr()
    report = json.loads(printed)
    page = out.read_text()
    assert embedded(page) == report and err == ""
    # The 70B needs two H100s on one node: h100-a is the one that has them.
    assert report["placed"][0]["node"] == "h100-a"
    assert escape(HOSTILE) in page and HOSTILE not in page
    for node in ("h100-a", "h100-b", "l40s-0"):
        assert node in page
    assert_self_contained(page)


def test_tmi_capacity_refuses_an_unwritable_html_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _capacity_argv(tmp_path, "--html", str(tmp_path / "missing" / "c.html"))
    assert main.main(argv) == 2
    assert "does not exist" in capsys.readouterr().err
