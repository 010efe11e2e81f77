"""Progress of the long commands: drawn on a terminal, and nothing at all in a pipe or a log
(where `tmi evidence` runs as a reporter DaemonSet), nor for a single step."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.evidencekit import SHARED, FakeEvidenceNvml, load
from tmi_cli import evidence_command, main
from tmi_cli.gpu_processes import NvmlReader
from tmi_cli.progress import progress


class Terminal(io.StringIO):
    """Standard error as a terminal would be."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_each_step_and_the_time() -> None:
    out = Terminal()
    with progress("replaying the deployments", 3, out) as done:
        for _ in range(3):
            done()
    shown = out.getvalue()
    assert "replaying the deployments" in shown and "3/3" in shown
    assert "elapsed" in shown and "left" in shown


@pytest.mark.parametrize(("stream", "total"), [(io.StringIO(), 5), (Terminal(), 1)])
def test_a_pipe_or_a_single_step_gets_nothing(stream: io.StringIO, total: int) -> None:
    with progress("sampling the GPUs", total, stream) as done:
        for _ in range(total):
            done()
    assert stream.getvalue() == ""


def test_tmi_evidence_shows_its_samples_on_a_terminal_and_prints_the_same_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = load(SHARED, "nvml-samples.json")
    monkeypatch.setattr(evidence_command, "open_reader", lambda: NvmlReader(FakeEvidenceNvml(dump)))
    monkeypatch.setattr("time.sleep", lambda s: None)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    argv = ["evidence", "--pods", str(SHARED / "pods.json"), "--proc", str(SHARED / "proc"),
            "--samples", "3", "--interval", "0"]  # fmt: skip
    assert main.main(argv) == 1
    assert "sampling the GPUs" in terminal.getvalue() and "3/3" in terminal.getvalue()
    report = json.loads(capsys.readouterr().out)
    assert len(report["samples"]) == 3
