"""Locate the self-built control-plane binaries, helm and kustomize.

The binaries are built from the Go module proxy by ``tools/k8sbin/build.sh`` into a
cache directory outside the checkout, keyed by the versions in
``tools/k8sbin/versions.env``. This module computes the same directory so tests and the
demo find them without extra configuration, and fails with one actionable message
when they are missing.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REQUIRED_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kubectl",
    "kube-controller-manager",
    "kwok",
    "helm",
    "kustomize",
    "tmi-oci",
)

# Used only when the checkout's versions.env cannot be found (an installed wheel);
# keep in step with tools/k8sbin/versions.env.
_FALLBACK_VERSIONS = {
    "K8S_VERSION": "v1.36.3",
    "ETCD_VERSION": "v3.6.16",
    "KWOK_VERSION": "v0.8.0",
    "HELM_VERSION": "v3.22.0",
    "KUSTOMIZE_VERSION": "v5.8.2",
}


class BinariesMissingError(RuntimeError):
    """The control-plane binaries are not where the harness looks for them."""


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str
    helm: str = _FALLBACK_VERSIONS["HELM_VERSION"]
    kustomize: str = _FALLBACK_VERSIONS["KUSTOMIZE_VERSION"]

    @property
    def cache_key(self) -> str:
        # Must match the key build.sh computes.
        return (
            f"{self.kubernetes}-etcd{self.etcd.removeprefix('v')}-kwok{self.kwok.removeprefix('v')}"
            f"-helm{self.helm.removeprefix('v')}-kustomize{self.kustomize.removeprefix('v')}"
        )


def _versions_file() -> Path:
    return Path(__file__).resolve().parent.parent / "tools" / "k8sbin" / "versions.env"


def versions() -> Versions:
    """The pinned versions, read from tools/k8sbin/versions.env when available."""
    values = dict(_FALLBACK_VERSIONS)
    path = _versions_file()
    if path.is_file():
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return Versions(
        values["K8S_VERSION"],
        values["ETCD_VERSION"],
        values["KWOK_VERSION"],
        values["HELM_VERSION"],
        values["KUSTOMIZE_VERSION"],
    )


def default_bin_dir() -> Path:
    """Where build.sh puts the binaries unless TMI_K8S_BIN_DIR says otherwise."""
    override = os.environ.get("TMI_K8S_BIN_DIR")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "tmi" / "k8sbin" / versions().cache_key


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


def bin_dir() -> Path:
    """Return the directory holding every binary, or raise BinariesMissingError."""
    path = default_bin_dir()
    missing = [
        name
        for name in REQUIRED_BINARIES
        if not (path / name).is_file() or not os.access(path / name, os.X_OK)
    ]
    if missing:
        raise BinariesMissingError(
            f"control-plane binaries missing from {path}: {', '.join(missing)}. "
            "Run `make controlplane` (tools/k8sbin/build.sh) to build them, "
            "or point TMI_K8S_BIN_DIR at a directory that has them."
        )
    return path


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


def _built(script_name: str, override: str, what: str, binaries: Sequence[str]) -> Path:
    """The directory a build script (a no-op once built) prints, or the override variable's,
    holding every one of ``binaries``; else BinariesMissingError naming what to run."""
    given = os.environ.get(override)
    script = _versions_file().parent / script_name
    if given:
        path = Path(given).expanduser()
    elif script.is_file():
        done = subprocess.run([str(script)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BinariesMissingError(f"building {what} failed ({script}):\n{done.stderr[-2000:]}")
        path = Path(done.stdout.strip().splitlines()[-1])
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
