"""Which build of the hot modules a test run exercises: the Python source, or mypyc's compiled
modules as the image ships them (setup.py).

`make test` runs every tier on the source and then, as `make test-compiled`, the unit,
integration and fuzz tiers against `build/compiled` with TMI_EXPECT_COMPILED=1. Each run proves
which build it ran: a stale compiled module left beside the source would otherwise shadow an
edit, and a compiled run that quietly imported the source would prove nothing.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPILED: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["tmi"][
    "compiled"
]
EXPECT_COMPILED = os.environ.get("TMI_EXPECT_COMPILED") == "1"
PRODUCTS = ("inference_policy", "policy_io", "serving", "webhook", "extender")


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def test_every_listed_module_is_a_product_source_file() -> None:
    assert len(set(COMPILED)) == len(COMPILED)  # no repeats
    for path in COMPILED:
        assert (ROOT / path).is_file(), path
        assert path.split("/", 1)[0] in PRODUCTS, path


def test_no_listed_module_uses_what_a_compiled_module_does_differently() -> None:
    for path in COMPILED:
        text = (ROOT / path).read_text()
        # pydantic builds its models' behaviour at class creation; mypyc compiles classes closed.
        assert "BaseModel" not in text, path
        # A compiled class's cached_property computes again on every read.
        assert "cached_property" not in text, path


# The dataclasses a listed module may keep: none is made on the common path of a review or a
# scheduling cycle, and each needs what only the dataclass gives it.
KEPT_DATACLASSES = {
    # Sorted and compared by value; made only for a Pod that reaches for an accelerator.
    "inference_policy/access.py:Reach",
    # Made only for a refused Pod.
    "inference_policy/engine_pod.py:PodRefusal",
    # Made when the request histogram changes, not per cycle.
    "inference_policy/fragmentation.py:Workload",
    # The controller's verdicts, one per reconcile, compared by value.
    "inference_policy/grant.py:Verdict",
    "inference_policy/grant.py:Lapse",
    "inference_policy/grant.py:Evaluation",
    # Made once per Node revision.
    "inference_policy/nodes.py:NodeFacts",
}


def _dataclasses(path: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Name) and target.id == "dataclass":
                    found.add(f"{path}:{node.name}")
    return found


def test_classes_made_per_review_are_plain_classes() -> None:
    # A dataclass's generated __init__ stays interpreted in the compiled build (setup.py): one
    # made for every review or cycle costs 0.4 µs where a plain class with Final attributes
    # costs 0.03 µs.
    found = set().union(*(_dataclasses(path) for path in COMPILED))
    assert found == KEPT_DATACLASSES


@pytest.mark.skipif(not EXPECT_COMPILED, reason="a compiled run's check of its build")
def test_the_plain_classes_attributes_are_read_only_when_compiled() -> None:
    # Final attributes of a compiled class have no setter (in the source, mypy holds them).
    from extender.view import _Candidates
    from inference_policy.nodes import Verdict
    from inference_policy.placement import Demand
    from inference_policy.planner import Decision
    from inference_policy.sizing import Estimate
    from webhook.profile_source import Planned

    made: list[tuple[object, str]] = [
        (Estimate(1, 2, 3, 1), "weights"),
        (Decision(200), "status"),
        (Planned(None, None), "decision"),
        (Verdict(True), "fits"),
        (Demand("cpu", "amd64", None, {}, (), (), "key"), "requests"),
        (_Candidates(True, [], [], [], None), "names"),
    ]
    for instance, attribute in made:
        with pytest.raises(AttributeError):
            setattr(instance, attribute, None)


@pytest.mark.skipif(not EXPECT_COMPILED, reason="a compiled run's check of its build")
@pytest.mark.parametrize("path", COMPILED)
def test_the_compiled_build_is_of_this_source(path: str) -> None:
    # The wheel carries each compiled module's source beside it: a build made before an edit is
    # stale, and would test code that no longer exists.
    spec = importlib.util.find_spec(_module(path))
    assert spec is not None and spec.origin is not None
    built = Path(spec.origin).with_name(Path(path).name)
    assert built.read_bytes() == (ROOT / path).read_bytes(), f"{built} is stale: make compiled"


def _product_modules() -> list[str]:
    out = []
    for package in PRODUCTS:
        for path in sorted((ROOT / package).rglob("*.py")):
            out.append(str(path.relative_to(ROOT)))
    return out


@pytest.mark.parametrize("path", _product_modules())
def test_the_run_uses_the_build_it_says(path: str) -> None:
    # Found, not imported: every product module, so a module compiled by a stale build (dropped
    # from the list since) fails here as a listed module run from source does.
    spec = importlib.util.find_spec(_module(path))
    assert spec is not None and spec.origin is not None
    compiled = spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert compiled == (EXPECT_COMPILED and path in COMPILED), spec.origin


def test_a_server_process_the_tests_start_runs_the_same_build() -> None:
    # Tests start servers as `python -P -m webhook` from the checkout (localcluster, the process
    # tests): they must import the build this run exercises, not the working directory's source.
    probe = "import webhook.admission as m; print(m.__file__)"
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    origin = done.stdout.strip()
    assert origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) == EXPECT_COMPILED, origin


def test_the_harness_runs_from_the_checkout() -> None:
    # localcluster finds the chart, manifests, examples and tools/k8sbin beside its package: a
    # copy in the compiled build would look for them there (and `make bench` failed on it).
    spec = importlib.util.find_spec("localcluster")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve() == ROOT / "localcluster" / "__init__.py", spec.origin
    from localcluster.chart import CHART

    assert (CHART / "Chart.yaml").is_file(), CHART
