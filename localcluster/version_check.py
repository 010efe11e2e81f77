"""The chart's contract on other Kubernetes releases: every object it renders, both parts,
server-side dry-run applied to a kube-apiserver of that release (`make test-versions`).

The pinned release (tools/k8sbin/versions.env) runs the whole e2e suite; for the others the
question is whether an owner can install the chart there at all, and with which values: the
admission policies are MutatingAdmissionPolicy v1 (1.36 on), the DRA objects resource.k8s.io
v1 (1.34 on). So each release is checked twice, with the admission policies and with the
webhook fallback (`owner.admissionPolicies.enabled=false`). The CRDs go in for real first, so
the dry run can admit the objects of their kinds. Each release's kube-apiserver is built by
`tools/k8sbin/build-apiserver.sh`; etcd is the pinned one.

    python -m localcluster.version_check v1.35.4 v1.37.2    # prints the rows, writes
                                                            # docs/compatibility.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localcluster.binaries import REQUIRED_BINARIES, bin_dir, versions
from localcluster.chart import OWNER, TENANT, part_values, render
from localcluster.chartgen import OWNER_NAMESPACE, TENANT_NAMESPACE, base_values
from localcluster.controlplane import ControlPlane
from localcluster.kube import ApiError

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tools" / "k8sbin" / "build-apiserver.sh"
REPORT = ROOT / "docs" / "compatibility.md"


def _apiserver(version: str) -> Path:
    if version == versions().kubernetes:
        return bin_dir() / "kube-apiserver"
    done = subprocess.run([str(BUILD), version], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building kube-apiserver {version} failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _bins(workdir: Path, apiserver: Path) -> Path:
    """The pinned binaries with this release's kube-apiserver in place of the pinned one."""
    bins = workdir / "bin"
    bins.mkdir()
    for name in REQUIRED_BINARIES:
        (bins / name).symlink_to(apiserver if name == "kube-apiserver" else bin_dir() / name)
    return bins


def _docs(policies: bool) -> list[dict[str, Any]]:
    values = base_values()
    owner = values.setdefault("owner", {})
    owner.setdefault("admissionPolicies", {})["enabled"] = policies
    # cert-manager's kinds are cert-manager's to serve; without it the Secrets are the owner's.
    owner.setdefault("extender", {})["certManager"] = False
    values.setdefault("tenant", {})["certManager"] = False
    docs: list[dict[str, Any]] = []
    for part, namespace in ((TENANT, TENANT_NAMESPACE), (OWNER, OWNER_NAMESPACE)):
        for doc in render(part_values(part, values), namespace=namespace):
            doc.setdefault("metadata", {}).setdefault("namespace", namespace)
            docs.append(doc)
    return docs


def check(version: str) -> list[tuple[str, str]]:
    """(what was checked, result) for one release."""
    apiserver = _apiserver(version)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="tmi-version-") as tmp:
        work = Path(tmp)
        plane = ControlPlane.start(
            work / "plane",
            _bins(work, apiserver),
            start_scheduler=False,
            start_kwok=False,
            start_controller_manager=False,
        )
        try:
            admin = plane.kube("admin")
            served = admin.request("GET", "/version")["gitVersion"]
            for namespace in (TENANT_NAMESPACE, OWNER_NAMESPACE):
                plane.create_namespace(namespace)
            for policies in (True, False):
                docs = _docs(policies)
                for doc in docs:
                    if doc["kind"] == "CustomResourceDefinition":
                        admin.apply(doc)
                failures = []
                for doc in docs:
                    if doc["kind"] in ("CustomResourceDefinition", "Namespace"):
                        continue
                    try:
                        admin.apply(doc, dry_run=True)
                    except (ApiError, LookupError, ValueError) as exc:
                        failures.append(f"{doc['kind']} {doc['metadata'].get('name')}: {exc}")
                what = f"server-side dry run of the chart's {len(docs)} objects, both parts, " + (
                    "with the admission policies" if policies else "webhook fallback"
                )
                result = "pass" if not failures else "fail: " + "; ".join(failures[:3])
                rows.append((f"{what} ({served})", result))
        finally:
            plane.stop()
    return rows


def _table(results: dict[str, list[tuple[str, str]]], date: str) -> str:
    lines = [
        "# Compatibility",
        "",
        "The chart on each Kubernetes release (`make test-versions`,",
        "`localcluster/version_check.py`). The pinned release, "
        f"{versions().kubernetes}, also runs the whole e2e suite (`make test`).",
        "",
        "The admission policies are MutatingAdmissionPolicy v1, served from 1.36: on an older",
        "release install the owner part with `owner.admissionPolicies.enabled=false` (the webhook",
        "fallback, `docs/threat-model.md`). The chart's `kubeVersion` (`>=1.30.0-0`) is the",
        "range's floor. A release marked `not run` has no kube-apiserver built here yet;",
        "`make test-versions` builds and checks it.",
        "",
        "| version | what was checked | result | date |",
        "| --- | --- | --- | --- |",
    ]
    for version, rows in sorted(results.items(), key=lambda kv: int(kv[0].split(".")[1])):
        for what, result in rows:
            lines.append(f"| {version} | {what} | {result.replace('|', '/')} | {date} |")
    return "\n".join(lines) + "\n"


def _recorded() -> dict[str, list[tuple[str, str]]]:
    """The rows the report holds now, by version (a run of some versions keeps the others)."""
    rows: dict[str, list[tuple[str, str]]] = {}
    if not REPORT.is_file():
        return rows
    for line in REPORT.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("v1."):
            rows.setdefault(cells[0], []).append((cells[1], cells[2]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("versions", nargs="+", metavar="vX.Y.Z")
    args = parser.parse_args(argv)
    results = _recorded()
    failed = False
    for version in args.versions:
        rows = check(version)
        results[version] = rows
        for what, result in rows:
            print(f"{version}  {result}  {what}", flush=True)
            failed = failed or (version == versions().kubernetes and result != "pass")
    REPORT.write_text(_table(results, datetime.now(UTC).strftime("%Y-%m-%d")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
