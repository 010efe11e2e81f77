"""Render the shipped Helm chart (charts/tmi) with the self-built helm.

The chart generator (chart_tools.generate), the e2e stack and the chart tests all need the
objects a user's `helm template`/`helm install` would produce, rendered by the same helm version
the project pins, so that RBAC, settings and the webhook configuration under test are the
shipped ones and not copies that can drift. The two parts of the chart are separate releases
(the tenant's namespaced one and the owner's cluster-scoped one), so each render names its part.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from chart_tools.toolchain import bin_dir, versions

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "tmi"
TENANT = "tenant"
OWNER = "owner"
PARTS = (TENANT, OWNER)
SOURCE_PREFIX = "# Source: "
# One rendered object, as plain JSON (the harness's localcluster.plane.kube.JSON is the same type).
JSON = dict[str, Any]


class ChartError(RuntimeError):
    """helm refused the chart or the values; the message is helm's."""


def helm() -> Path:
    return bin_dir() / "helm"


def kustomize() -> Path:
    return bin_dir() / "kustomize"


def part_values(part: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with exactly one part of the chart switched on."""
    if part not in PARTS:
        raise ValueError(f"unknown chart part {part!r}")
    merged: dict[str, Any] = json.loads(json.dumps(dict(values)))
    for name in PARTS:
        merged.setdefault(name, {})["enabled"] = name == part
    return merged


def _run(args: Sequence[str]) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ChartError(f"{' '.join(args[:3])} failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def template_text(
    values: Mapping[str, Any],
    *,
    namespace: str,
    release: str = "tmi",
    chart: Path = CHART,
    kube_version: str | None = None,
) -> str:
    """What ``helm template`` prints for ``values`` (a JSON file, so no --set quoting rules),
    for a cluster of ``kube_version`` (default: the version the local cluster runs, as
    ``helm install`` would read it from the cluster). With the owner part on, the chart's
    crds/ come first, as ``helm install`` creates them; the tenant's install skips them
    (``--skip-crds``: its installer may not create definitions)."""
    owner = bool((values.get("owner") or {}).get("enabled"))
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="tmi-values-") as handle:
        json.dump(dict(values), handle)
        handle.flush()
        return _run(
            [
                str(helm()),
                "template",
                release,
                str(chart),
                f"--namespace={namespace}",
                f"--values={handle.name}",
                f"--kube-version={kube_version or versions().kubernetes}",
                *(["--include-crds"] if owner else []),
            ]
        )


def render(
    values: Mapping[str, Any],
    *,
    namespace: str,
    release: str = "tmi",
    chart: Path = CHART,
    kube_version: str | None = None,
) -> list[JSON]:
    """The rendered objects, in helm's order."""
    text = template_text(
        values, namespace=namespace, release=release, chart=chart, kube_version=kube_version
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_source(text: str) -> dict[str, list[str]]:
    """The rendered documents grouped by the template that produced them (helm's Source lines),
    each document's text without that line."""
    groups: dict[str, list[str]] = {}
    for raw in text.split("\n---\n"):
        lines = raw.strip("\n").removeprefix("---\n").splitlines()
        source = next(
            (ln[len(SOURCE_PREFIX) :] for ln in lines if ln.startswith(SOURCE_PREFIX)), None
        )
        body = "\n".join(ln for ln in lines if not ln.startswith(SOURCE_PREFIX)).strip("\n")
        if source is None or not body or yaml.safe_load(body) is None:
            continue
        groups.setdefault(source, []).append(body)
    return groups


def lint(values_files: Sequence[Path] = (), *, chart: Path = CHART, strict: bool = True) -> str:
    """``helm lint`` output; raises ChartError on any error (and, ``strict``, any warning)."""
    args = [str(helm()), "lint", str(chart)]
    if strict:
        args.append("--strict")
    args.extend(f"--values={path}" for path in values_files)
    return _run(args)


def kustomize_build(directory: Path) -> list[JSON]:
    text = _run([str(kustomize()), "build", str(directory)])
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: Sequence[JSON], kind: str, name: str, namespace: str | None = None) -> JSON:
    """The one rendered object of ``kind`` called ``name`` (in ``namespace`` when given)."""
    for doc in docs:
        meta = doc.get("metadata") or {}
        if (doc.get("kind"), meta.get("name")) == (kind, name) and (
            namespace is None or meta.get("namespace") == namespace
        ):
            return doc
    raise KeyError(f"the chart rendered no {kind} {name}")


__all__ = [
    "CHART",
    "OWNER",
    "PARTS",
    "TENANT",
    "ChartError",
    "by_source",
    "find",
    "helm",
    "kustomize",
    "kustomize_build",
    "lint",
    "part_values",
    "render",
    "template_text",
]
