"""The tenant-input inventory (`inference_policy.tools.tenant_inputs`) and the threat model's table
of it say the same, and every name the inventory uses is real.

The table in `docs/threat-model.md` ("What the tenant can write, and what the owner's parts make
of it") is the inventory rendered (`tenant_inputs.table()`): every data row is in the document
and every row of the document is data. Each reader it names is a function (or method) of that
file, or a Kubernetes component; each test it names is an end-to-end test defined in that file;
no row is trusted; an open row says so first; a refused row names what refuses it. What the owner
parts read of a Pod is held to the inventory by
`tests/integration/serving/test_tenant_inputs_read.py`.
"""

from __future__ import annotations

import ast
import difflib
import re
from functools import cache
from pathlib import Path

import pytest

from inference_policy.tools.tenant_inputs import (
    INVENTORY,
    NEXT_ISSUE,
    TABLE_HEADER,
    TREATMENTS,
    counts,
    covers,
    listed,
    pod_rows,
    segments,
    table,
)

ROOT = Path(__file__).resolve().parents[4]
DOC = ROOT / "docs" / "threat-model.md"
SECTION = "## What the tenant can write, and what the owner's parts make of it"
COMPONENTS = frozenset(("kube-apiserver", "kube-scheduler"))
# Rows no end-to-end test proves yet, each said in its row.
UNPROVED = frozenset(
    (
        "engine-labelled Pods: their number and size",
        "the recipe catalogs (`gpuRecipeCatalogConfigMap`, `cpuRecipeCatalogConfigMap`)",
    )
)
REFUSERS = ("kamiwaza-tmi-", "kamiwaza-tenant-pod-guard", "kube-apiserver", "RBAC")


def doc_rows() -> list[str]:
    """The table lines of the section, header included."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [line for line in body.splitlines() if line.startswith("|")]


def test_the_threat_models_table_is_the_inventory() -> None:
    have, want = doc_rows(), table()
    missing = [row for row in want if row not in have]
    extra = [row for row in have if row not in want]
    diff = "\n".join(difflib.unified_diff(have, want, "docs/threat-model.md", "inventory", n=0))
    assert not missing and not extra, (
        f"{len(missing)} row(s) of the inventory are not in the document and {len(extra)} of "
        f"the document are not in the inventory; paste tenant_inputs.table():\n{diff}"
    )
    assert have == want, "same rows, another order:\n" + diff


@cache
def _defined(path: str) -> frozenset[str]:
    """Every function and `Class.method` the file defines."""
    tree = ast.parse((ROOT / path).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return frozenset(names)


@pytest.mark.parametrize("entry", INVENTORY, ids=lambda e: e.paths[0])
def test_every_reader_and_test_it_names_is_there(entry: object) -> None:
    from inference_policy.tools.tenant_inputs import TenantInput

    assert isinstance(entry, TenantInput)
    for reader in entry.readers:
        if reader in COMPONENTS:
            continue
        path, _, name = reader.partition(":")
        assert (ROOT / path).is_file(), reader
        assert name in _defined(path), f"{reader}: no such function in {path}"
    for test in entry.tests:
        path, _, name = test.partition("::")
        assert re.match(r"tests/e2e/[a-z]+/test_", path), test
        assert (ROOT / path).is_file(), test
        assert name.split("[")[0] in _defined(path), f"{test}: no such test"


def test_every_row_is_treated_and_none_is_trusted() -> None:
    for entry in INVENTORY:
        text = " ".join((entry.writer, entry.how)).lower()
        assert "trusted" not in text.replace("trusts", ""), entry.paths
        assert entry.treatment in TREATMENTS, entry.paths
        if entry.treatment == "open":
            assert entry.how.startswith("open: "), entry.paths
        else:
            assert not entry.how.startswith("open"), entry.paths
        if entry.treatment == "refused":
            assert any(name in entry.how for name in REFUSERS), entry.paths
        if not entry.tests:
            assert entry.paths[0] in UNPROVED, f"{entry.paths}: name its end-to-end test"


def test_steering_other_tenants_is_refused_and_what_is_left_is_open() -> None:
    """Preemption by a system class, a Pod naming its node and pod affinity past the namespace
    are refused; what a tenant's Pods take of a shared node (tolerations, cpu and memory) is
    the next issue's, and the inventory says so rather than anything else."""
    for path in ("spec.priorityClassName", "spec.affinity", "spec.nodeName"):
        rows = [e for e in pod_rows() if path in e.paths]
        assert rows and all(row.treatment == "refused" for row in rows), path
    for path in ("spec.tolerations", "spec.initContainers[].restartPolicy"):
        (row,) = [e for e in pod_rows() if path in e.paths]
        assert row.treatment == "open" and row.how.startswith(NEXT_ISSUE), path


def test_the_table_has_a_row_for_each_entry_and_counts_add_up() -> None:
    assert table()[: len(TABLE_HEADER)] == list(TABLE_HEADER)
    assert len(table()) == len(TABLE_HEADER) + len(INVENTORY)
    assert sum(counts().values()) == len(INVENTORY)
    assert all("\n" not in row for row in table())


def test_pod_paths_are_paths_of_a_pod() -> None:
    for entry in pod_rows():
        for path in entry.paths:
            assert segments(path)[0] in ("apiVersion", "kind", "metadata", "spec", "status"), path


@pytest.mark.parametrize(
    ("listed_path", "read", "covered"),
    [
        ("spec.containers[].env", "spec.containers[].env[].name", True),
        ("spec.containers[].env", "spec.containers[].envFrom", False),
        ("spec.containers[].env", "spec.containers", False),
        ("metadata.annotations[cdi.k8s.io/*]", "metadata.annotations[cdi.k8s.io/gpu]", True),
        ("metadata.annotations[cdi.k8s.io/*]", "metadata.annotations[kamiwaza.ai/plan]", False),
        ("metadata.annotations[*]", "metadata.annotations[*]", True),
        ("metadata.annotations[*]", "metadata.annotations[example.com/x]", False),
        ("metadata.labels[<other>]", "metadata.labels[app]", False),
        ("metadata.labels[<other>]", "metadata.labels[<other>]", True),
        ("status.phase", "status.phase", True),
        ("status.phase", "status", False),
    ],
)
def test_a_listed_path_covers_itself_and_what_is_under_it(
    listed_path: str, read: str, covered: bool
) -> None:
    assert covers(listed_path, read) is covered


def test_an_object_read_counts_as_listed_only_for_what_it_holds() -> None:
    assert not listed("spec")
    assert listed("spec", container=True)
    assert not listed("spec.fictional", container=True)
    assert segments("metadata.annotations[kamiwaza.ai/plan].x") == (
        "metadata",
        "annotations",
        "[kamiwaza.ai/plan]",
        "x",
    )
