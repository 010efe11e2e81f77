"""The chart's contract on other Kubernetes releases (`make test-versions`): every object it
renders, both parts, server-side dry-run applied to a kube-apiserver of that release, then the
whole stack on that release doing what the chart promises
(``localcluster.install.version_behaviour``).

The pinned release (tools/k8sbin/versions.env) runs the whole e2e suite; for the others the
question is whether an owner can install the chart there at all, and with which values: the
admission policies are MutatingAdmissionPolicy v1 (1.36 on), the DRA objects resource.k8s.io
v1 (1.34 on). So each release is checked twice, with the admission policies and with the
webhook fallback (`owner.admissionPolicies.enabled=false`). The CRDs go in for real first, so
the dry run can admit the objects of their kinds. Each way that passes is then brought up on a
fresh plane of that release and probed. Each release's kube-apiserver and kube-scheduler are
built by `tools/k8sbin/build-release.sh`; etcd, KWOK and the rest are the pinned ones.

    python -m localcluster.install.version_check v1.35.4 v1.37.2    # prints the rows, writes
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

from chart_tools.generate import OWNER_NAMESPACE, TENANT_NAMESPACE, base_values
from chart_tools.render import OWNER, TENANT, part_values, render
from localcluster.install.version_behaviour import PROBES, behaviour, summary
from localcluster.plane.binaries import REQUIRED_BINARIES, bin_dir, release_of, versions
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import ApiError

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "k8sbin" / "build-release.sh"
# What each release brings of its own; the rest of the plane is the pinned release's.
RELEASE_BINARIES = ("kube-apiserver", "kube-scheduler")
REPORT = ROOT / "docs" / "compatibility.md"


def _release(version: str) -> tuple[Path, str]:
    """The directory holding this release's own binaries, and what the build said if it
    could not make them all."""
    if version == versions().kubernetes:
        return bin_dir(), ""
    done = subprocess.run([str(BUILD), version], capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"building Kubernetes {version} failed:\n{done.stderr[-2000:]}")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return Path(lines[-1]), "; ".join(errors)


def _older_scheduler(release: Path) -> Path | None:
    """The newest kube-scheduler built for the minor below ``release``'s: the version skew
    policy lets the scheduler be one minor older than the API server."""
    minor = int(release.name.split(".")[1])
    built = [
        d / "kube-scheduler"
        for d in release.parent.glob(f"v1.{minor - 1}.*")
        if (d / "kube-scheduler").is_file()
    ]
    return max(built, key=lambda p: int(p.parent.name.split(".")[2]), default=None)


def _bins(workdir: Path, release: Path) -> tuple[Path, str]:
    """The pinned binaries with this release's own in place of the pinned ones; and a note
    where this release's kube-scheduler is missing and the previous minor's stands in."""
    bins = workdir / "bin"
    bins.mkdir()
    note = ""
    for name in REQUIRED_BINARIES:
        source = (release if name in RELEASE_BINARIES else bin_dir()) / name
        if name == "kube-scheduler" and not source.is_file():
            older = _older_scheduler(release)
            if older is None:
                raise Unbuilt(f"no kube-scheduler {release.name}, nor one of the minor below")
            source, note = older, f"kube-scheduler {older.parent.name} in place of {release.name}'s"
        if not source.is_file():
            raise Unbuilt(f"no {name} {release.name}")
        (bins / name).symlink_to(source)
    return bins, note


class Unbuilt(RuntimeError):
    """A release's binary is neither built nor buildable here: its rows say so."""


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


def _way(policies: bool) -> str:
    return "with the admission policies" if policies else "webhook fallback"


def _dry_runs(bins: Path, work: Path) -> tuple[str, dict[bool, tuple[str, str]]]:
    """The served version, and (what was checked, result) for each way of installing."""
    rows: dict[bool, tuple[str, str]] = {}
    plane = ControlPlane.start(
        work, bins, start_scheduler=False, start_kwok=False, start_controller_manager=False
    )
    try:
        admin = plane.kube("admin")
        served = str(admin.request("GET", "/version")["gitVersion"])
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
            what = f"server-side dry run of the chart's {len(docs)} objects, both parts, "
            result = "pass" if not failures else "fail: " + "; ".join(failures[:3])
            rows[policies] = (f"{what}{_way(policies)} ({served})", result)
    finally:
        plane.stop()
    return served, rows


def _behaviour(bins: Path, work: Path, policies: bool, served: str) -> tuple[str, str]:
    what = (
        f"the stack {_way(policies)}: {', '.join(PROBES)} (kube-apiserver {served}, "
        f"kube-scheduler {release_of((bins / 'kube-scheduler').resolve())})"
    )
    plane = ControlPlane.start(work, bins, start_scheduler=False, start_controller_manager=False)
    try:
        return what, summary(behaviour(plane, policies=policies))
    except Exception as exc:  # a release that breaks the stack is a result, not a crash
        return what, f"fail: the stack did not come up: {type(exc).__name__}: {exc}"
    finally:
        plane.stop()


def check(version: str) -> list[tuple[str, str]]:
    """(what was checked, result) for one release."""
    release, built = _release(version)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="tmi-version-") as tmp:
        work = Path(tmp)
        try:
            bins, note = _bins(work, release)
        except Unbuilt as exc:
            return [("the chart's every object and the stack", f"not run: {exc} ({built})")]
        served, dry = _dry_runs(bins, work / "dry-run")
        for policies in (True, False):
            rows.append(dry[policies])
            if dry[policies][1] == "pass":
                plane_dir = work / f"stack-{'policies' if policies else 'fallback'}"
                what, result = _behaviour(bins, plane_dir, policies, served)
                if note:
                    what = f"{what}; {note} ({built})"
                rows.append((what, result))
    return rows


# (what was checked, result, date) rows of one release.
Rows = list[tuple[str, str, str]]


def _table(results: dict[str, Rows]) -> str:
    lines = [
        "# Compatibility",
        "",
        "The chart on each Kubernetes release (`make test-versions`,",
        "`localcluster/install/version_check.py`). The pinned release, "
        f"{versions().kubernetes}, also runs the whole e2e suite (`make test`).",
        "",
        "Each release is checked two ways, with the admission policies and with the webhook",
        "fallback (`owner.admissionPolicies.enabled=false`, `docs/threat-model.md`): a server-side",
        "dry run of everything the chart renders, then, where that passes, the whole stack on that",
        "release's kube-apiserver and kube-scheduler, where the tenant's namespace admin finds",
        "a plain Pod shielded, a Pod reaching for a GPU outside a plan refused by the guard, an",
        "engine Pod planned by the webhook (AdmissionReview v1), bound by that scheduler through",
        "the extender (ExtenderArgs v1) and verified",
        "(`localcluster/install/version_behaviour.py`).",
        "The admission policies are MutatingAdmissionPolicy v1, served from 1.36: on an older",
        "release install the owner part with the fallback. kube-scheduler serves /livez and",
        "/readyz from 1.31; below, the chart probes its /healthz. The chart's `kubeVersion`",
        "(`>=1.30.0-0`) is the range's floor. The Go module proxy serves no",
        "k8s.io/kube-scheduler v0.31.14, so 1.31's stack runs 1.30's scheduler (the skew policy",
        "allows one minor older).",
        "",
        "| version | what was checked | result | date |",
        "| --- | --- | --- | --- |",
    ]
    for version, rows in sorted(results.items(), key=lambda kv: int(kv[0].split(".")[1])):
        for what, result, date in rows:
            # One table row each: a failure's text may carry a log's lines and bars.
            cell = " ".join(result.split()).replace("|", "/")
            lines.append(f"| {version} | {' '.join(what.split())} | {cell} | {date} |")
    return "\n".join(lines) + "\n"


def _recorded() -> dict[str, Rows]:
    """The rows the report holds now, by version (a run of some versions keeps the others)."""
    rows: dict[str, Rows] = {}
    if not REPORT.is_file():
        return rows
    for line in REPORT.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("v1."):
            rows.setdefault(cells[0], []).append((cells[1], cells[2], cells[3]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("versions", nargs="+", metavar="vX.Y.Z")
    args = parser.parse_args(argv)
    results = _recorded()
    failed = False
    for version in args.versions:
        rows = check(version)
        today = datetime.now(UTC).strftime("%Y-%m-%d")
        results[version] = [(what, result, today) for what, result in rows]
        for what, result in rows:
            print(f"{version}  {result}  {what}", flush=True)
            failed = failed or (version == versions().kubernetes and result != "pass")
        REPORT.write_text(_table(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
