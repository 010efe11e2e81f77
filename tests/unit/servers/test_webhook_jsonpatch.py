"""The webhook's JSON Patch generator, checked against the `jsonpatch` library as the applier.

Whatever the edits and the document, applying `edits_patch(document, edits)` with an RFC 6902
implementation that is not ours must give the document with every edit made; a document that
already holds the edits needs no operation.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from inference_policy.admission.engine_pod import Edit
from webhook.jsonpatch import edits_patch, escape

KEYS = st.sampled_from(["a", "b", "a/b", "~", "~1", "x~0y", "", "kamiwaza.ai/plan"])
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
DOCUMENTS = st.dictionaries(KEYS, JSON, max_size=4)
PATHS = st.lists(KEYS, min_size=1, max_size=3).map(tuple)
EDITS = st.builds(Edit, PATHS, JSON, st.booleans())


@given(JSON, JSON)
def test_a_value_becomes_the_target(source: Any, target: Any) -> None:
    document = {"root": source}
    ops = edits_patch(document, [Edit(("root",), target)])
    assert _typed(jsonpatch.apply_patch(document, ops)) == _typed({"root": target})


@given(DOCUMENTS, st.lists(EDITS, max_size=4, unique_by=lambda edit: edit.path[0]))
def test_applying_the_patch_makes_every_edit(document: Any, edits: list[Edit]) -> None:
    # Edits under distinct top-level keys, as a plan's edits meet only at objects a Pod has.
    document = _walkable(document, edits)
    ops = edits_patch(document, edits)
    assert _typed(jsonpatch.apply_patch(document, ops)) == _typed(_made(document, edits))


@given(DOCUMENTS, st.lists(EDITS, max_size=4, unique_by=lambda edit: edit.path[0]))
def test_a_document_holding_the_edits_needs_no_operation(document: Any, edits: list[Edit]) -> None:
    done = _made(_walkable(document, edits), edits)
    assert edits_patch(done, edits) == []


def test_escaping_follows_rfc_6901() -> None:
    assert escape("kamiwaza.ai/plan") == "kamiwaza.ai~1plan"
    assert escape("~/") == "~0~1"
    document: dict[str, Any] = {"metadata": {"annotations": {}}}
    [op] = edits_patch(document, [Edit(("metadata", "annotations", "a/b~c"), "v")])
    assert op == {"op": "add", "path": "/metadata/annotations/a~1b~0c", "value": "v"}
    assert jsonpatch.apply_patch(document, [op]) == {"metadata": {"annotations": {"a/b~c": "v"}}}


def test_pod_changes_are_small_and_precise() -> None:
    before = {"metadata": {}, "spec": {"containers": [{"name": "e", "image": "a"}, {"name": "s"}]}}
    edits = [
        Edit(("metadata", "annotations", "kamiwaza.ai/plan"), "{}"),
        Edit(("spec", "containers"), [{"name": "e", "image": "b"}, {"name": "s"}]),
        Edit(("spec", "x"), 1),
    ]
    assert edits_patch(before, edits) == [
        {"op": "add", "path": "/metadata/annotations", "value": {"kamiwaza.ai/plan": "{}"}},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "b"},
        {"op": "add", "path": "/spec/x", "value": 1},
    ]


def test_removing_an_absent_field_needs_no_operation() -> None:
    assert edits_patch({"spec": {}}, [Edit(("spec", "runtimeClassName"), remove=True)]) == []
    assert edits_patch({}, [Edit(("spec", "runtimeClassName"), remove=True)]) == []
    assert edits_patch(
        {"spec": {"runtimeClassName": "x"}}, [Edit(("spec", "runtimeClassName"), remove=True)]
    ) == [{"op": "remove", "path": "/spec/runtimeClassName"}]


def test_booleans_are_not_numbers() -> None:
    assert edits_patch({"a": 1}, [Edit(("a",), True)]) == [
        {"op": "replace", "path": "/a", "value": True}
    ]
    assert edits_patch({"a": 1}, [Edit(("a",), 1.0)]) == []


def _walkable(document: dict[str, Any], edits: list[Edit]) -> dict[str, Any]:
    """The document with every value on an edit's way that is neither an object nor null made
    an empty object: the generator is given paths through objects, as a Pod's are."""
    out = copy.deepcopy(document)
    for edit in edits:
        parent: Any = out
        for token in edit.path[:-1]:
            child = parent.get(token)
            if child is None:
                break
            if not isinstance(child, dict):
                child = parent[token] = {}
            parent = child
    return out


def _made(document: dict[str, Any], edits: list[Edit]) -> dict[str, Any]:
    """The document with the edits made, by plain assignment: the expected result."""
    out = copy.deepcopy(document)
    for edit in edits:
        parent: Any = out
        for token in edit.path[:-1]:
            if not isinstance(parent.get(token), dict):
                if edit.remove:
                    break
                parent[token] = {}
            parent = parent[token]
        else:
            if edit.remove:
                parent.pop(edit.path[-1], None)
            else:
                parent[edit.path[-1]] = copy.deepcopy(edit.value)
    return out


def _typed(value: Any) -> Any:
    # Compare JSON values with bool distinct from int, as JSON does.
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, bool):
        return ("bool", value)
    return value
