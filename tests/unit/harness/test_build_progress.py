"""The binary builds' progress (localcluster/plane/build_progress.py, tools/k8sbin/lib.sh): each
component's turn with the time spent and left, estimated from the last build's recorded times or
typical figures, and the whole of build.sh run against a stand-in `go` (the real builds take a
quarter of an hour and are cached, so they are not run here)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.plane import build_progress
from localcluster.plane.build_progress import (
    TYPICAL_SECONDS,
    BuildTimes,
    duration,
    estimate,
    plan_line,
    step_line,
)

ROOT = Path(__file__).resolve().parents[3]
K8SBIN = ROOT / "tools" / "k8sbin"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_durations_read_at_a_glance() -> None:
    assert [duration(s) for s in (0.4, 45, 60, 185, 3725)] == ["0s", "45s", "1m00s", "3m05s",
                                                               "1h02m"]  # fmt: skip


def test_the_estimate_is_the_last_build_else_the_typical_figure(cache: Path) -> None:
    times = BuildTimes(cache / "build-times.json")
    typical = estimate("controlplane", "etcd", times)
    assert (typical.seconds, typical.source) == (TYPICAL_SECONDS["controlplane"]["etcd"], "typical")
    times.record("controlplane", "etcd", 71.26)
    again = estimate("controlplane", "etcd", BuildTimes(cache / "build-times.json"))
    assert (again.seconds, again.source) == (71.3, "last build")
    assert estimate("controlplane", "something-new", times).source == "guess"


def test_an_unreadable_record_only_loses_the_estimate(cache: Path) -> None:
    cache.mkdir()
    (cache / "build-times.json").write_text('{"node": {"runc": "fast", "cni": -3}, "x": [')
    assert estimate("node", "runc", BuildTimes(cache / "build-times.json")).source == "typical"
    (cache / "build-times.json").write_text('{"node": {"runc": "fast", "cni": 12}}')
    times = BuildTimes(cache / "build-times.json")
    assert estimate("node", "runc", times).source == "typical"
    assert estimate("node", "cni", times).seconds == 12


def test_each_step_says_its_turn_and_what_is_left(cache: Path) -> None:
    times = BuildTimes(cache / "build-times.json")
    times.record("node", "kubelet", 200)
    assert plan_line("node", ["kubelet", "runc"], times) == (
        ">> node: building 2 component(s) (kubelet, runc), about 4m05s "
        "(the last build's times and typical figures)"
    )
    line = step_line("node", 1, 2, "kubelet", "kubelet, kube-proxy v1.36.3", 3, ["runc"], times)
    assert line == (
        ">> [1/2] building kubelet, kube-proxy v1.36.3: about 3m20s (last build); "
        "3s elapsed, about 4m05s left"
    )


def test_the_command_line_records_each_finished_component(cache: Path) -> None:
    out = io.StringIO()
    assert build_progress.main(["done", "fakedra", "tmi-fakedra", "95"], out) == 0
    assert out.getvalue() == ">> tmi-fakedra built in 1m35s (estimated 2m00s, typical)\n"
    assert json.loads((cache / "build-times.json").read_text()) == {"fakedra": {"tmi-fakedra": 95}}
    assert build_progress.main(["step", "fakedra"], out) == 2


def _stand_in_go(bin_dir: Path) -> None:
    """A `go` that answers the pins from versions.env and 'builds' each binary as an empty
    executable: what build.sh asks of the toolchain, without compiling anything."""
    go = bin_dir / "go"
    go.write_text(
        f"#!{sys.executable}\n"
        + """import os, sys
from pathlib import Path
args = sys.argv[1:]
if args[:1] == ["-C"]:
    args = args[2:]
pins = dict(line.split("=", 1) for line in Path(os.environ["FAKE_GO_VERSIONS"]).read_text().split()
            if "=" in line and not line.startswith("#"))
modules = {"k8s.io/kubernetes": "K8S_VERSION", "go.etcd.io/etcd/server/v3": "ETCD_VERSION",
           "sigs.k8s.io/kwok": "KWOK_VERSION", "helm.sh/helm/v3": "HELM_VERSION",
           "sigs.k8s.io/kustomize/kustomize/v5": "KUSTOMIZE_VERSION"}
if args[:2] == ["list", "-m"]:
    print(pins.get(modules.get(args[-1], ""), "v0.36.3").strip("'\\""))
elif args[:2] == ["env", "GOVERSION"]:
    print("go1.26.0")
elif args[:1] == ["build"]:
    out = args[args.index("-o") + 1]
    packages = args[args.index("-o") + 2:]
    targets = [Path(out)]
    if out.endswith("/"):
        targets = [Path(out) / p.rstrip("/").split("/")[-1] for p in packages]
    for target in targets:
        target.write_text("")
        target.chmod(0o755)
    print("go build", " ".join(args), file=sys.stderr)
"""
    )
    go.chmod(0o755)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_build_sh_shows_each_component_and_keeps_its_time(tmp_path: Path, cache: Path) -> None:
    # A copy of the scripts whose use_go puts the stand-in first (the real one prefers
    # /usr/local/go), beside the real progress module.
    tools = tmp_path / "tree" / "tools" / "k8sbin"
    tools.mkdir(parents=True)
    for name in ("build.sh", "versions.env"):
        shutil.copy(K8SBIN / name, tools / name)
    lib = (K8SBIN / "lib.sh").read_text()
    (tools / "lib.sh").write_text(lib + '\nuse_go() { export PATH="$FAKE_GO_BIN:$PATH"; }\n')
    (tmp_path / "tree" / "localcluster").symlink_to(ROOT / "localcluster")
    fake_bin = tmp_path / "go-bin"
    fake_bin.mkdir()
    _stand_in_go(fake_bin)
    env = {
        **os.environ,
        "FAKE_GO_BIN": str(fake_bin),
        "FAKE_GO_VERSIONS": str(tools / "versions.env"),
        "TMI_K8S_BIN_DIR": str(tmp_path / "k8sbin"),
        # This interpreter, not whatever python3 a version manager's shim picks.
        "TMI_BUILD_PYTHON": sys.executable,
    }
    done = subprocess.run(
        ["bash", str(tools / "build.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "k8sbin")
    lines = [line for line in done.stderr.splitlines() if line.startswith(">>")]
    assert lines[0].startswith(">> controlplane: building 6 component(s) (kubernetes, etcd,")
    assert lines[1].startswith(">> [1/6] building kube-apiserver kube-scheduler")
    # The first component starts at once, but a loaded machine may have spent a second already.
    assert re.search(r"\(typical\); \d+s elapsed, about ", lines[1]), lines[1]
    assert any(line.startswith(">> [6/6] building tmi-oci") for line in lines)
    assert lines[-1].startswith(">> controlplane: built in ")
    recorded = json.loads((cache / "build-times.json").read_text())["controlplane"]
    assert set(recorded) == {"kubernetes", "etcd", "kwok", "helm", "kustomize", "tmi-oci"}

    # One binary missing: only it is built, and its estimate is now the last build's.
    (tmp_path / "k8sbin" / "kwok").unlink()
    again = subprocess.run(
        ["bash", str(tools / "build.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert again.returncode == 0, again.stderr
    assert ">> [1/1] building kwok " in again.stderr and "(last build)" in again.stderr


def test_the_harness_passes_a_builds_progress_through_as_it_comes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`make test` and the demo start a build through the harness (binaries._built): its
    progress reaches the terminal, and its directory is still read from standard output."""
    from localcluster.plane.binaries import run_build

    script = tmp_path / "build-fake.sh"
    script.write_text(
        "#!/usr/bin/env bash\n"
        "echo '>> [1/2] building a' >&2\necho '>> [2/2] building b' >&2\necho /the/dir\n"
    )
    script.chmod(0o755)
    code, out, err = run_build(script)
    assert (code, out) == (0, "/the/dir\n")
    assert capfd.readouterr().err == ">> [1/2] building a\n>> [2/2] building b\n" == err
