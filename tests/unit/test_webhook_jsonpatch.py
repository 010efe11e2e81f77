"""The JSON Patch generator: applying diff(a, b) to a gives b, for any JSON values."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.integration.webhookkit import apply_patch
from webhook.jsonpatch import diff, escape, pointer

KEYS = st.sampled_from(["a", "b", "a/b", "~", "~1", "x~0y", "", "kamiwaza.ai/plan"])
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


@given(JSON, JSON)
def test_diff_then_apply_gives_the_target(source: Any, target: Any) -> None:
    patched = apply_patch({"root": source}, diff({"root": source}, {"root": target}))
    assert _typed(patched) == _typed({"root": target})


@given(JSON)
def test_equal_documents_need_no_operation(document: Any) -> None:
    assert diff(document, document) == []


def test_escaping_follows_rfc_6901() -> None:
    assert escape("kamiwaza.ai/plan") == "kamiwaza.ai~1plan"
    assert escape("~/") == "~0~1"
    assert pointer("metadata", "annotations", "a/b~c") == "/metadata/annotations/a~1b~0c"


def test_pod_changes_are_small_and_precise() -> None:
    before = {"metadata": {}, "spec": {"containers": [{"name": "e", "image": "a"}, {"name": "s"}]}}
    after = {
        "metadata": {"annotations": {"kamiwaza.ai/plan": "{}"}},
        "spec": {"containers": [{"name": "e", "image": "b"}, {"name": "s"}], "x": 1},
    }
    assert diff(before, after) == [
        {"op": "add", "path": "/metadata/annotations", "value": {"kamiwaza.ai/plan": "{}"}},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "b"},
        {"op": "add", "path": "/spec/x", "value": 1},
    ]


def test_booleans_are_not_numbers() -> None:
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff({"a": 1}, {"a": 1.0}) == []


def _typed(value: Any) -> Any:
    # Compare JSON values with bool distinct from int, as JSON does.
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, bool):
        return ("bool", value)
    return value
