"""The servers read a Pod's (or any object's) metadata, spec and status through the one view
(`inference_policy.base.pod_view`), never by hand.

A hand-written `pod.get("metadata") or {}` decides on its own what a field of the wrong shape
means, and the tenant writes its Pods: the one read that forgets raises in a server, or reads a
field the tenant-input inventory does not list. This guard parses the source of every server
package and the policy edge and fails on any read of a `"metadata"`, `"spec"` or `"status"` key
(`x.get("metadata")`, `x["metadata"]`) outside the allow-list below, each entry of which says why
that read is not one the view can do. Writes (`patch["metadata"] = ...`, and
`kept["metadata"]["labels"] = ...`) build objects and are not reads.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("webhook", "extender", "allocation_controller", "serving", "tmi_cli", "policy_io")
KEYS = frozenset(("metadata", "spec", "status"))

# (file, function, key) -> why the read is by hand. The function is the innermost def around it.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("webhook/admission.py", "_check_pod", "metadata"): (
        "the review's shape check: it must tell a field of the wrong shape from an absent one, "
        "to refuse the Pod naming the field (the view reads both as absent)"
    ),
    ("webhook/admission.py", "_check_pod", "spec"): "the review's shape check, as above",
    ("serving/informer.py", "_trim", "metadata"): (
        "drops managedFields from the stored object in place: a write into the metadata dict"
    ),
    ("serving/quota.py", "usage_part", "metadata"): (
        "builds the kept copy of a Pod: its metadata is kept only when it is an object at all"
    ),
    ("extender/verbs.py", "unencodable", "metadata"): (
        "encodes the NodeList's metadata exactly as the scheduler sent it, to find the value "
        "that cannot be echoed back"
    ),
    ("webhook/app.py", "_log_review", "status"): "the AdmissionResponse's status, no object's",
    ("tmi_cli/evidence.py", "status_of", "status"): "the evidence report's verdict, no object's",
    ("tmi_cli/report_evidence.py", "_timeline", "status"): "an allocation's verdict in the report",
    ("tmi_cli/report_evidence.py", "_memory", "status"): "an allocation's verdict in the report",
    ("tmi_cli/report_evidence.py", "evidence_page", "status"): "the report's verdict, no object's",
    ("allocation_controller/reconciler.py", "_says", "status"): "a condition's status field",
    ("allocation_controller/reconciler.py", "reconcile_departed", "status"): (
        "a condition's status field"
    ),
    ("allocation_controller/reconciler.py", "_write", "status"): "a condition's status field",
    ("allocation_controller/reconciler.py", "_record", "status"): "a condition's status field",
}


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Reads(ast.NodeVisitor):
    """Every read of one of KEYS: `.get(key ...)` and `[key]` in a load, by enclosing def."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str, int]] = []
        self._defs: list[str] = ["<module>"]
        self._written: set[int] = set()

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._defs.append(node.name)
        self.generic_visit(node)
        self._defs.pop()

    visit_FunctionDef = _def
    visit_AsyncFunctionDef = _def

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            # `x["metadata"]["labels"] = ...` writes through `x["metadata"]`.
            self._written.add(id(node.value))
        key = _key(node.slice)
        if key in KEYS and isinstance(node.ctx, ast.Load) and id(node) not in self._written:
            self.found.append((self._defs[-1], key, node.lineno))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            key = _key(node.args[0])
            if key in KEYS:
                self.found.append((self._defs[-1], key, node.lineno))
        self.generic_visit(node)


def raw_reads(source: str) -> list[tuple[str, str, int]]:
    """(function, key, line) of each hand-written read of an object's metadata, spec or
    status in `source`."""
    reads = _Reads()
    reads.visit(ast.parse(source))
    return reads.found


def _sources() -> Iterator[tuple[str, str]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_the_servers_read_objects_only_through_the_view() -> None:
    unlisted = [
        f"{path}:{line} {function}: {key!r}"
        for path, source in _sources()
        for function, key, line in raw_reads(source)
        if (path, function, key) not in ALLOWED
    ]
    assert unlisted == [], (
        "read through inference_policy.base.pod_view (PodView, ObjectView) instead, or allow "
        "the read below with the reason the view cannot do it:\n" + "\n".join(unlisted)
    )


def test_every_allowed_read_is_still_there() -> None:
    """An entry whose read is gone is taken out, so the list says only what is true."""
    present = {
        (path, function, key)
        for path, source in _sources()
        for function, key, _ in raw_reads(source)
    }
    assert sorted(set(ALLOWED) - present) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('def f(pod):\n    return (pod.get("metadata") or {}).get("name")\n', [("f", "metadata")]),
        ('def f(pod):\n    return pod["metadata"]["name"]\n', [("f", "metadata")]),
        ("def f(lease):\n    return lease.get('spec', {})\n", [("f", "spec")]),
        ('async def g(pod):\n    return pod["status"]\n', [("g", "status")]),
        ('patch = {}\npatch["metadata"] = {"resourceVersion": "1"}\n', []),
        ('def f(out, labels):\n    out["metadata"]["labels"] = labels\n', []),
        ("def f(pod):\n    return PodView(pod).name\n", []),
        ('def f(document):\n    return document.get("data")\n', []),
    ],
)
def test_the_guard_sees_a_read_and_lets_a_write_be(
    source: str, found: list[tuple[str, str]]
) -> None:
    assert [(function, key) for function, key, _ in raw_reads(source)] == found
