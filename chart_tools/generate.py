"""Regenerate what is derived from the chart and the core, or check that it is current.

Two things must not be edited by hand, because a hand edit is exactly how they would drift:

* the CEL in the chart: the owner's admission policies (charts/tmi/files/admission-policies.yaml,
  the core's ``inference_policy.admission.policy_cel.policy_parts()``) and the fallback guard
  webhook's ``reaches-for-an-accelerator`` matchCondition
  (charts/tmi/files/reaches-for-an-accelerator.cel,
  ``inference_policy.admission.access_cel.cel_condition()``), both the predicate the webhook
  checks;
* the kustomize bases under manifests/ (webhook/, controller/, owner/, scheduler/, tenant/),
  which are the chart rendered with charts/tmi/ci/kustomize-base-values.yaml, one file per
  chart template, so `kubectl apply -k` installs the same objects `helm install` does.

    python -m chart_tools.generate           # rewrite them
    python -m chart_tools.generate --check   # exit 1 and name every stale file
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from chart_tools.render import CHART, OWNER, TENANT, by_source, part_values, template_text
from inference_policy.admission.access_cel import cel_condition
from inference_policy.admission.policy_cel import policy_parts

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
CEL_FILE = CHART / "files" / "reaches-for-an-accelerator.cel"
POLICY_FILE = CHART / "files" / "admission-policies.yaml"
BASE_VALUES = CHART / "ci" / "kustomize-base-values.yaml"
TENANT_NAMESPACE = "kamiwaza"
OWNER_NAMESPACE = "kamiwaza-scheduling"
# Stand-in owner key: the schema wants a well-formed one; the bases show the placeholder.
KEY_STAND_IN = "A" * 43 + "="
KEY_PLACEHOLDER = "<OWNER_PUBLIC_KEY>"
# Chart template directory -> kustomize base directory under manifests/.
BASE_DIRS = {
    "crds": "owner",
    "tenant/webhook": "webhook",
    "owner/controller": "controller",
    "owner": "owner",
    "owner/scheduler": "scheduler",
}
# The bases a user applies for each part, over the per-component directories.
PART_BASES = {
    "tenant": ("../webhook",),
    "owner-all": ("../owner", "../scheduler", "../controller"),
}


def _header(source: str) -> str:
    return (
        f"# Generated from charts/{source} by `python -m chart_tools.generate`"
        "\n# (values: charts/tmi/ci/kustomize-base-values.yaml). Edit the chart, not this file.\n"
    )


def base_values() -> dict[str, Any]:
    # The scheduler configuration is the chart's own (it trusts the extender's CA from the
    # certificate Secret), so the bases carry no placeholder for an owner to fill in.
    values: dict[str, Any] = yaml.safe_load(BASE_VALUES.read_text())
    return values


class _BlockDumper(yaml.SafeDumper):
    """Multi-line CEL as literal blocks, so the generated file reads like the expression."""


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _block)


def _policy_text() -> str:
    header = (
        "# Generated from inference_policy.admission.access_cel by "
        "`python -m chart_tools.generate`;\n"
        "# templates/owner/admission-policies.yaml reads it. Edit the core, not this file.\n"
    )
    body = yaml.dump(policy_parts(), Dumper=_BlockDumper, sort_keys=False, width=100)
    return header + body


def _kustomization(comment: str, resources: list[str]) -> str:
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources,
    }
    return comment + yaml.safe_dump(doc, sort_keys=False)


def core_files() -> dict[Path, str]:
    """The chart files generated from the core, which the chart's templates read."""
    return {CEL_FILE: cel_condition() + "\n", POLICY_FILE: _policy_text()}


def expected_files() -> dict[Path, str]:
    """Every generated file and its content (the manifests as rendered from the chart files
    now on disk: `main` writes the core's first)."""
    files = core_files()
    values = base_values()
    rendered: dict[str, list[str]] = {}
    for part, namespace in ((TENANT, TENANT_NAMESPACE), (OWNER, OWNER_NAMESPACE)):
        text = template_text(part_values(part, values), namespace=namespace)
        rendered.update(by_source(text))
    per_dir: dict[str, list[str]] = {d: [] for d in BASE_DIRS.values()}
    for source, all_docs in sorted(rendered.items()):
        # Helm hooks run only on their event (the tenant's pre-delete cleanup); a kustomize
        # base would run them at apply, so they are left out (README, "Installing").
        docs = [d for d in all_docs if "helm.sh/hook" not in d]
        if not docs:
            continue
        # A template, or a definition in crds/ (rendered before the templates).
        template = source.removeprefix(f"{CHART.name}/templates/")
        folder, _, name = template.removeprefix(f"{CHART.name}/").rpartition("/")
        base = BASE_DIRS[folder]
        body = "\n---\n".join(docs).replace(KEY_STAND_IN, KEY_PLACEHOLDER)
        body = body.replace(
            "app.kubernetes.io/managed-by: Helm", "app.kubernetes.io/managed-by: kustomize"
        )
        files[MANIFESTS / base / name] = _header(source) + body + "\n"
        per_dir[base].append(name)
    generated = "# Generated by `python -m chart_tools.generate`; edit the chart, not this file.\n"
    for base, names in per_dir.items():
        files[MANIFESTS / base / "kustomization.yaml"] = _kustomization(generated, sorted(names))
    tenant_comment = (
        generated
        + "# The tenant's namespaced part, installable by the namespace's installer identity:\n"
        "#   kubectl apply -k manifests/tenant   (or an overlay of it, manifests/overlays/tenant)\n"
    )
    owner_comment = (
        generated + "# The cluster owner's part, applied by a cluster administrator:\n"
        "#   kubectl apply -k manifests/owner-all   (or manifests/overlays/owner)\n"
    )
    files[MANIFESTS / "tenant" / "kustomization.yaml"] = _kustomization(
        tenant_comment, list(PART_BASES["tenant"])
    )
    files[MANIFESTS / "owner-all" / "kustomization.yaml"] = _kustomization(
        owner_comment, list(PART_BASES["owner-all"])
    )
    return files


def stale(files: Mapping[Path, str]) -> list[Path]:
    """The generated files whose content differs, and old generated files no template makes."""
    out = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    # Two template folders may share a base (crds/ and owner/): each base once.
    for base in dict.fromkeys(BASE_DIRS.values()):
        for path in sorted((MANIFESTS / base).glob("*.yaml")):
            if path not in files:
                out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chart_tools.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if not args.check:
        for path, text in core_files().items():
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
    files = expected_files()
    outdated = stale(files)
    if args.check:
        for path in outdated:
            print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
        return 1 if outdated else 0
    for path in outdated:
        if path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path])
        else:
            path.unlink()
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
