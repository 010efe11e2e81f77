"""The files a new allocation class touches, listed, and held to the list.

`inference_policy.allocation` is the seam a new class is added at: the profile, the planner,
placement and the node checks ask a binding's class (`binding.allocation`, `class_of`,
`class_of_resource`), never a resource name or a concrete class. So a new class is one module of
the package, registered in `CLASSES`, plus what the few files below say of the classes by their
own vocabulary: the resource names their devices are counted in (or the wire constants that hold
them), or a class object by name. A file outside the package that starts branching on a class's
resource names fails here: route the question through the class, or list the file with why.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from inference_policy.allocation import CLASSES, AllocationClass
from inference_policy.base import wire

ROOT = Path(__file__).resolve().parents[4]
PACKAGE = ROOT / "inference_policy" / "allocation"
# The owner parts' code; the harness (localcluster) and the tests are not part of a class.
SOURCES = (
    "inference_policy",
    "policy_io",
    "serving",
    "webhook",
    "extender",
    "allocation_controller",
    "tmi_cli",
)

# What a new class touches in the package: always its own module and the registry, and the
# `Guarantee` it gives when that is a new one.
IN_THE_PACKAGE = {
    "inference_policy/allocation/<the class>.py": "the class: its resource names, guarantee, "
    "rank, how a request fits and what GFD's labels must say",
    "inference_policy/allocation/__init__.py": "its instance in `CLASSES`",
    "inference_policy/allocation/base.py": "a new guarantee in `Guarantee`",
}
# The package's modules that are not classes: what every class answers, what a class reads of a
# binding, and the two accounts of hardware the classes' checks read.
NOT_A_CLASS = {"__init__", "base", "binding_facts", "gfd", "dra_facts"}
# Outside the package, the only files that know a class by its own vocabulary, and what each
# says of it: what a new class's resource names may have to be added to.
KNOWS_A_CLASS = {
    "inference_policy/base/wire.py": "the resource names on the wire",
    "inference_policy/trust/profile.py": "the resource names a binding of each shape may name",
    "inference_policy/evidence/observations.py": "the isolation a plan's resource grants, for "
    "the sharing evidence",
    "inference_policy/evidence/judging.py": "a MIG slice's profile, in the evidence report",
    "inference_policy/placing/quota.py": "accounted VRAM, which the owner's quota counts",
    "inference_policy/tools/doctor.py": "the GPU resources `tmi doctor` counts on a node",
    "inference_policy/tools/draft.py": "the whole-device binding `tmi draft` writes",
}


def _resource_names() -> tuple[set[str], set[str], set[str]]:
    """The classes' resource names (exact, and prefixes ending in "-"), and the wire constants
    holding one."""
    names = {name for cls in CLASSES for name in cls.resources}
    exact = {name for name in names if not name.endswith("-")}
    constants = {
        key for key, value in vars(wire).items() if isinstance(value, str) and value in names
    }
    return exact, names - exact, constants


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _knows_a_class(path: Path) -> list[str]:
    """What in `path`'s code names a class by its own vocabulary (docstrings aside)."""
    exact, prefixes, constants = _resource_names()
    class_objects = {
        name
        for name, value in vars(importlib.import_module("inference_policy.allocation")).items()
        if isinstance(value, AllocationClass)
    }
    class_modules = {p.stem for p in PACKAGE.glob("*.py")} - NOT_A_CLASS
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    why: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            text = node.value.replace("\\", "")  # a regular expression's escaped dots
            why.update(repr(name) for name in exact if text == name)
            why.update(repr(prefix) for prefix in prefixes if text.startswith(prefix))
        elif isinstance(node, ast.Name) and node.id in constants | class_objects:
            why.add(node.id)
        elif isinstance(node, ast.alias) and node.name in constants | class_objects:
            why.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            parent, _, leaf = node.module.rpartition(".")
            if parent == "inference_policy.allocation" and leaf in class_modules:
                why.add(f"imports {node.module}")
    return sorted(why)


def test_every_class_is_a_module_of_the_package_and_registered_once() -> None:
    registered = {id(cls): cls for cls in CLASSES}
    assert len(registered) == len(CLASSES)
    defined: dict[int, AllocationClass] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem in NOT_A_CLASS:
            continue
        module = importlib.import_module(f"inference_policy.allocation.{path.stem}")
        own = [
            value
            for value in vars(module).values()
            if isinstance(value, AllocationClass) and type(value).__module__ == module.__name__
        ]
        assert own, f"{path.name} defines no allocation class; list it in NOT_A_CLASS if it is none"
        defined.update((id(cls), cls) for cls in own)
    assert defined.keys() == registered.keys(), "a class defined is not in CLASSES, or the reverse"


def test_only_the_listed_files_know_a_class_by_its_own_vocabulary() -> None:
    found = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            if path.is_relative_to(PACKAGE):
                continue
            why = _knows_a_class(path)
            if why:
                found[path.relative_to(ROOT).as_posix()] = why
    unlisted = {name: why for name, why in found.items() if name not in KNOWS_A_CLASS}
    assert unlisted == {}, (
        "these files branch on a class's resource names or name a class: ask the binding's "
        "class instead (`binding.allocation`, `class_of_resource`), or list them in KNOWS_A_CLASS"
    )
    assert sorted(found) == sorted(KNOWS_A_CLASS), "a listed file no longer knows any class"


def test_the_listed_files_are_there() -> None:
    for name in [*KNOWS_A_CLASS, *IN_THE_PACKAGE]:
        if "<" not in name:
            assert (ROOT / name).is_file(), name
    for stem in NOT_A_CLASS:
        assert (PACKAGE / f"{stem}.py").is_file(), stem


# The binding models whose type says how their devices are handed out: whether a binding's
# devices come through a claim is its class's answer (`AllocationClass.claimed`,
# `room_published`), read through `profile.as_claimed` / `as_counted` where the model is needed.
DECIDED_BY_THE_CLASS = {"DraBinding"}
# The one file that may test a binding's model for that: the schema pairs classes with models.
TELLS_A_MODEL = {"inference_policy/trust/profile.py"}


def _isinstance_of_a_model(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if named & DECIDED_BY_THE_CLASS:
                return True
    return False


def test_only_the_profile_decides_a_claim_by_the_binding_s_model() -> None:
    found = {
        path.relative_to(ROOT).as_posix()
        for source in SOURCES
        for path in sorted((ROOT / source).rglob("*.py"))
        if _isinstance_of_a_model(path)
    }
    assert found == TELLS_A_MODEL, (
        "ask the binding's class whether its devices come through a claim "
        "(`binding.allocation.claimed`, `profile.as_claimed`), not the binding's model"
    )
