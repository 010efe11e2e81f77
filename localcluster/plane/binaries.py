"""Locate the self-built binaries the harness runs: the control plane's (through the chart
tools' toolchain lookup, chart_tools.toolchain, re-exported here), the real node's and the
simulated GPUs' DRA plugin.

The control-plane binaries, helm and kustomize are built by ``tools/k8sbin/build.sh``; the
node's by ``tools/k8sbin/build-node.sh``. Each lookup fails with one actionable message when
they are missing.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from chart_tools.toolchain import (
    REQUIRED_BINARIES,
    BinariesMissingError,
    Versions,
    bin_dir,
    default_bin_dir,
    versions,
    versions_file,
)


@functools.cache
def release_of(binary: Path) -> str:
    """The Kubernetes release a component binary says it is (`--version`: "Kubernetes
    v1.30.14"), "unknown" when it says none. Read once per binary."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"v1\.\d+\.\d+\S*", out.stdout)
    return found.group(0) if found else "unknown"


def minor_of(release: str) -> int | None:
    """1.30's 30, None for a release that is not v1.N.P."""
    found = re.match(r"v1\.(\d+)\.", release)
    return int(found.group(1)) if found else None


NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "bridge",
    "host-local",
    "loopback",
    "portmap",
    "tmi-fakegpu",
    "tmi-probe",
)


def run_build(script: Path) -> tuple[int, str, str]:
    """Run a build script, passing its progress lines (standard error) through as they come, so
    a first build of a quarter of an hour shows each component's turn and the time left; returns
    its exit status, standard output (the directory) and the tail of its standard error."""
    tail: deque[str] = deque(maxlen=200)
    with subprocess.Popen(
        [str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as build:
        # Standard output is one line (the directory), so reading standard error first
        # cannot leave the script blocked on a full pipe.
        assert build.stderr is not None and build.stdout is not None
        for line in build.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line)
        out = build.stdout.read()
    return build.returncode, out, "".join(tail)


def _built(script_name: str, override: str, what: str, binaries: Sequence[str]) -> Path:
    """The directory a build script (a no-op once built) prints, or the override variable's,
    holding every one of ``binaries``; else BinariesMissingError naming what to run."""
    given = os.environ.get(override)
    script = versions_file().parent / script_name
    if given:
        path = Path(given).expanduser()
    elif script.is_file():
        code, out, err = run_build(script)
        if code != 0:
            raise BinariesMissingError(f"building {what} failed ({script}):\n{err[-2000:]}")
        path = Path(out.strip().splitlines()[-1])
    else:
        raise BinariesMissingError(f"no checkout: set {override} to {what}")
    missing = [name for name in binaries if not os.access(path / name, os.X_OK)]
    if missing:
        raise BinariesMissingError(
            f"{what} missing from {path}: {', '.join(missing)}. "
            f"Run `make node` (tools/k8sbin/{script_name})."
        )
    return path


def node_bin_dir() -> Path:
    """The real node's binaries (``tools/k8sbin/build-node.sh``, which owns their cache key and
    is a no-op once they are built), or raise BinariesMissingError."""
    return _built("build-node.sh", "TMI_NODE_BIN_DIR", "the node binaries", NODE_BINARIES)


def fakedra_bin() -> Path:
    """``tmi-fakedra``, the simulated GPUs' DRA kubelet plugin (``tools/k8sbin/build-fakedra.sh``,
    a no-op once built), or raise BinariesMissingError."""
    path = _built("build-fakedra.sh", "TMI_FAKEDRA_BIN_DIR", "tmi-fakedra", ("tmi-fakedra",))
    return path / "tmi-fakedra"


__all__ = [
    "NODE_BINARIES",
    "REQUIRED_BINARIES",
    "BinariesMissingError",
    "Versions",
    "bin_dir",
    "default_bin_dir",
    "fakedra_bin",
    "minor_of",
    "node_bin_dir",
    "release_of",
    "run_build",
    "versions",
]
