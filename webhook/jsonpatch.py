"""An RFC 6902 JSON Patch generator: the difference between the Pod we got and the Pod we want.

The core says which fields a plan governs and what they must hold (`engine_pod.plan_edits`);
the patch is the difference at exactly those fields, so it can never disagree with what was
decided, a Pod already in the planned shape (a reinvoked webhook, a Pod re-created from an
admitted template) yields an empty patch, and nothing else of the Pod is walked.

Mappings are diffed key by key. Lists of the same length are diffed item by item, which keeps the
common case (one field of one container) to a one-line patch; lists whose length changed are
replaced whole, which is always correct and avoids index shifting between operations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference_policy.base.bounded import keep

Operation = dict[str, Any]


def escape(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901): `~` first, then `/`."""
    return token.replace("~", "~0").replace("/", "~1")


def edits_patch(document: Mapping[str, Any], edits: Sequence[Any]) -> list[Operation]:
    """The operations that make each edit (an object with `path`, `value` and `remove`) hold in
    `document`; parents that do not exist yet are added whole."""
    ops: list[Operation] = []
    for edit in edits:
        tokens = edit.path
        pointers = _POINTERS.get(tokens) or _pointers(tokens)
        parent: Any = document
        last = len(tokens) - 1
        depth = 0
        while depth < last:
            token = tokens[depth]
            child = _child(parent, token)
            if child is _MISSING or child is None:
                if not edit.remove:
                    value: Any = edit.value
                    for inner in reversed(tokens[depth + 1 :]):
                        value = {inner: value}
                    ops.append(
                        {
                            "op": "add" if child is _MISSING else "replace",
                            "path": pointers[depth],
                            "value": value,
                        }
                    )
                break
            parent = child
            depth += 1
        else:
            current = _child(parent, tokens[last])
            if edit.remove:
                if current is not _MISSING:
                    ops.append({"op": "remove", "path": pointers[last]})
            elif current is _MISSING:
                ops.append({"op": "add", "path": pointers[last], "value": edit.value})
            else:
                _diff(current, edit.value, pointers[last], ops)
    return ops


# The pointer of every prefix of an edit's path, by path: the paths a plan sets are a handful of
# constants (and one per container index), so each is escaped once rather than per review.
_POINTERS: dict[tuple[str | int, ...], tuple[str, ...]] = {}
_MAX_POINTERS = 512


def _pointers(tokens: tuple[str | int, ...]) -> tuple[str, ...]:
    path = ""
    prefixes = []
    for token in tokens:
        path += "/" + escape(str(token))
        prefixes.append(path)
    return keep(_POINTERS, tokens, tuple(prefixes), _MAX_POINTERS)


_MISSING: Any = object()
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _same_kind(a: Any, b: Any) -> bool:
    # bool is an int subclass in Python but not in JSON: True must not equal 1 here.
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return True
    return type(a) is type(b)


def _token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1") if ("~" in key or "/" in key) else key


def _diff(source: Any, target: Any, path: str, ops: list[Operation]) -> None:
    # Subtrees the target shares with the source (by identity) are skipped without a look:
    # the webhook builds its target by copying only what it changes, so this stays small.
    if source is target:
        return
    kind = type(source)
    if kind is type(target) and kind in _SCALARS:
        # Two scalars of one JSON type (bool is its own type here, so True never equals 1).
        if source != target:
            ops.append({"op": "replace", "path": path, "value": target})
        return
    if isinstance(source, dict) and isinstance(target, dict):
        _diff_dicts(source, target, path, ops)
        return
    if _is_mapping(source) and _is_mapping(target):
        # Not what a review decodes to: walked as dicts of the same values.
        _diff_dicts(dict(source), dict(target), path, ops)
        return
    if _is_list(source) and _is_list(target) and len(source) == len(target):
        for index, (old, new) in enumerate(zip(source, target, strict=True)):
            if old is not new:
                _diff(old, new, f"{path}/{index}", ops)
        return
    if _same_kind(source, target) and source == target:
        return
    ops.append({"op": "replace", "path": path, "value": target})


def _diff_dicts(
    source: dict[str, Any], target: dict[str, Any], path: str, ops: list[Operation]
) -> None:
    """`_diff` of two mappings, key by key."""
    for key in source:
        if key not in target:
            ops.append({"op": "remove", "path": path + "/" + _token(key)})
    for key, value in target.items():
        old = source.get(key, _MISSING)
        if old is value:
            continue
        child = path + "/" + _token(key)
        if old is _MISSING:
            ops.append({"op": "add", "path": child, "value": value})
        else:
            _diff(old, value, child, ops)


def _child(parent: Any, token: str | int) -> Any:
    """The value at `token` under `parent` (an object or a list), `_MISSING` if absent."""
    if isinstance(parent, dict):
        return parent.get(token, _MISSING)
    if type(parent) is list:
        return parent[token]  # type: ignore[index]
    return parent.get(token, _MISSING)


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def _is_list(value: Any) -> bool:
    if type(value) is list:
        return True
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)
