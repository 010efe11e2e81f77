"""Locate the pinned, self-built toolchain: helm, kustomize and the control-plane binaries.

The binaries are built from the Go module proxy by ``tools/k8sbin/build.sh`` into a
cache directory outside the checkout, keyed by the versions in
``tools/k8sbin/versions.env``. This module computes the same directory so the chart
generator, the tests and the demo find them without extra configuration, and fails with one
actionable message when they are missing. The harness (localcluster.plane.binaries) re-exports it.
"""

from __future__ import annotations

import os
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


def versions_file() -> Path:
    return Path(__file__).resolve().parent.parent / "tools" / "k8sbin" / "versions.env"


def versions() -> Versions:
    """The pinned versions, read from tools/k8sbin/versions.env when available."""
    values = dict(_FALLBACK_VERSIONS)
    path = versions_file()
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


__all__ = [
    "REQUIRED_BINARIES",
    "BinariesMissingError",
    "Versions",
    "bin_dir",
    "default_bin_dir",
    "versions",
    "versions_file",
]
