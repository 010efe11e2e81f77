"""Rewrite references to the core's old flat modules (`inference_policy.X`) to the parts they
now live in (`inference_policy.<part>.X`).

Why it exists: the core's modules moved into layered parts (inference_policy/__init__.py says
which), and a branch made before the move still imports and names them by their old paths. Run
over such a branch's files, this rewrites

* `from inference_policy.X import a, b` (a split or merged module's names each to its new home,
  a renamed name to its new name), and `from inference_policy import X`;
* `inference_policy.X` and `inference_policy.X.name` anywhere: strings, docstrings, docs;
* `inference_policy/X.py` and `inference_policy/X.py:name`, as the threat model's inventory
  and the docs write them.

A comment on a rewritten import line is kept on each line it becomes. It is idempotent: a new
path never matches an old one. Afterwards run `ruff check --fix` (import order) and `ruff
format`, and rewrap any docstring line the longer paths pushed past 100 columns.

    .venv/bin/python tools/core_paths.py [FILE ...]   (default: every file git tracks)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_PARTS = {
    "base": "wire quantity bounded errors strictjson cel_text access",
    "trust": "signing profile rollback seed_rules dra_claims",
    "planning": "planner gpu_plan request_rules request decision plan sizing catalog recipes "
    "recipe_inputs room",
    "placing": "placement ledger nodes spread fragmentation tenancy quota schedconfig",
    "admission": "engine_pod engine_admission device_gate access_cel shield_cel status_cel "
    "verdict_cel owner_objects_cel policy_cel dra_cel",
    "granting": "grant grant_findings grant_tenants stored_pod pod_demand owner_rights "
    "dra_allocation kept_pod",
    "tools": "capacity quota_replay doctor draft detection host_facts revisions_compare "
    "tenant_inputs tenant_input_names tenant_input_objects tenant_input_pod tenant_input_spec",
}
# Old module (under inference_policy) -> its new dotted path (under inference_policy).
MOVES: dict[str, str] = {
    **{module: f"{part}.{module}" for part, names in _PARTS.items() for module in names.split()},
    "gfd": "allocation.gfd",
    "dra": "allocation.dra_facts",
    "refusals": "base.codes",
    "verdict_codes": "base.codes",
    "allocation_reasons": "base.codes",
}
# The names of a split module that moved elsewhere than the module's new home.
SPLIT: dict[str, dict[str, str]] = {
    "room": {"figures_with": "placing.room_figures", "figures_of": "placing.room_figures"},
}
# The names a merge renamed: (old module, old name) -> new name.
RENAMED: dict[tuple[str, str], str] = {
    ("refusals", "DESCRIPTIONS"): "REFUSAL_DESCRIPTIONS",
    ("verdict_codes", "DESCRIPTIONS"): "VERDICT_DESCRIPTIONS",
    ("allocation_reasons", "REASONS"): "ALLOCATION_REASONS",
}

_OLD = "|".join(sorted(MOVES, key=len, reverse=True))
_FROM_MODULE = re.compile(
    rf"^(?P<indent>[ \t]*)from inference_policy\.(?P<old>{_OLD}) import "
    r"(?:\((?P<paren>[^)]*)\)(?P<after>[^\n]*)|(?P<flat>[^\n]*))",
    re.M,
)
_FROM_PACKAGE = re.compile(
    r"^(?P<indent>[ \t]*)from inference_policy import "
    r"(?:\((?P<paren>[^)]*)\)(?P<after>[^\n]*)|(?P<flat>[^\n]*))",
    re.M,
)
_DOTTED = re.compile(rf"\binference_policy\.(?P<old>{_OLD})(?!\w)(?:\.(?P<name>\w+))?")
_PATH = re.compile(rf"\binference_policy/(?P<old>{_OLD})\.py(?::(?P<name>\w+))?")


def target(old: str, name: str | None) -> tuple[str, str | None]:
    """Where `inference_policy.<old>` (and its `name`, if given) now is: the new dotted module
    path under inference_policy, and the name there."""
    new = MOVES[old]
    if name is None:
        return new, None
    return SPLIT.get(old, {}).get(name, new), RENAMED.get((old, name), name)


def _imported(match: re.Match[str]) -> tuple[list[tuple[str, str | None]], str]:
    """The names a from-import takes (each with its alias) and its trailing comment."""
    raw = match.group("paren")
    if raw is None:
        raw = match.group("flat")
    comments = re.findall(r"#[^\n]*", raw) + re.findall(r"#[^\n]*", match.group("after") or "")
    names = []
    for part in re.sub(r"#[^\n]*", "", raw).replace("\n", " ").split(","):
        words = part.split()
        if words:
            names.append((words[0], words[2] if len(words) == 3 else None))
    return names, ("  " + comments[0]) if comments else ""


def _lines(indent: str, groups: dict[str, list[str]], comment: str) -> str:
    return "\n".join(
        f"{indent}from {module} import {', '.join(names)}{comment}"
        for module, names in groups.items()
    )


def _from_module(match: re.Match[str]) -> str:
    old = match.group("old")
    names, comment = _imported(match)
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        new, new_name = target(old, name)
        groups.setdefault(f"inference_policy.{new}", []).append(
            f"{new_name} as {alias}" if alias else str(new_name)
        )
    return _lines(match.group("indent"), groups, comment)


def _from_package(match: re.Match[str]) -> str:
    names, comment = _imported(match)
    groups: dict[str, list[str]] = {}
    for name, alias in names:
        package, leaf, as_name = "inference_policy", name, alias
        if name in MOVES:
            package, _, leaf = f"inference_policy.{MOVES[name]}".rpartition(".")
            # A renamed module keeps its old name as an alias, so its uses stay right.
            as_name = alias or (name if leaf != name else None)
        groups.setdefault(package, []).append(f"{leaf} as {as_name}" if as_name else leaf)
    return _lines(match.group("indent"), groups, comment)


def _dotted(match: re.Match[str]) -> str:
    new, name = target(match.group("old"), match.group("name"))
    return f"inference_policy.{new}" + (f".{name}" if name else "")


def _path(match: re.Match[str]) -> str:
    new, name = target(match.group("old"), match.group("name"))
    return f"inference_policy/{new.replace('.', '/')}.py" + (f":{name}" if name else "")


def rewrite(text: str, python: bool) -> str:
    """`text` with every reference to an old module rewritten."""
    if python:
        text = _FROM_MODULE.sub(_from_module, text)
        text = _FROM_PACKAGE.sub(_from_package, text)
    return _PATH.sub(_path, _DOTTED.sub(_dotted, text))


def main(argv: list[str]) -> int:
    names = argv or subprocess.run(
        ["git", "ls-files", "-z"], check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, names):
        path = Path(name)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        new = rewrite(text, path.suffix == ".py")
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
