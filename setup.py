"""Builds tmi, and with TMI_COMPILE=1 compiles the modules every admission and placement runs
through with mypyc, as the image ships them.

Why: the webhook answers each review and the extender each scheduling cycle in Python on one
event loop, and after the algorithms were made lean the interpreter itself was most of a
review's cost. These modules are typed strictly (mypy strict) and hold no pydantic models, so
mypyc compiles them to C extensions from the same source; a review costs the webhook about 40%
less CPU in-process (BENCHMARKS.md, "The admission webhook"). The source stays the only truth:
the compiled modules are the same files, the development install runs them as Python, and
`make test-compiled` runs the unit, integration and fuzz tiers against the compiled build.

A module joins the list (pyproject.toml, `[tool.tmi] compiled`) only if it defines no class that
Python code subclasses or patches at run time (mypyc's classes are closed; a patched method is
silently not called), uses no `cached_property` (a compiled class computes it on every read),
takes what it has not checked yet as `Any` (a compiled function checks its annotated argument
types on entry, so a `str` parameter handed a number raises TypeError before its own check can
refuse it properly), and nothing assigns its Final constants from outside.
A class made for every review or scheduling cycle is a plain class whose `__init__` assigns
`Final` attributes (read-only when compiled, and to mypy in the source), not a dataclass: a
dataclass's generated methods
stay interpreted, and constructing one from compiled code cost 0.44 µs against 0.03 µs for the
plain class (mypyc 1.x, this machine); `tests/unit/test_compiled.py` holds the listed modules
to it.
Pydantic models, the dataclass `PolicyState` (mypyc leaves its `field(init=False)` defaults
unset) and the servers' aiohttp edges stay Python.

A compiled build needs mypy, setuptools and the runtime dependencies in the build environment
(mypyc type-checks what it compiles), so it is made without build isolation from an
environment synced with the dev extra:

    TMI_COMPILE=1 uv build --wheel --no-build-isolation --python .venv/bin/python -o build/wheel
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
# The list lives in pyproject.toml ([tool.tmi] compiled), where the tests read it too.
COMPILED: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["tmi"][
    "compiled"
]


def _extensions() -> list[object]:
    if os.environ.get("TMI_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify  # noqa: PLC0415 - only a compiled build has it
    except ImportError as exc:
        raise SystemExit(
            "TMI_COMPILE=1 needs mypy (mypyc) and tmi's dependencies in the build environment: "
            "build with --no-build-isolation from an environment synced with --extra dev"
        ) from exc
    return list(mypycify(COMPILED, opt_level="3"))


setup(ext_modules=_extensions())
