"""Reading the owner's documents from files or standard input, strictly and with a size cap, and
writing the owner's outputs so that a failed command leaves no file behind.

A document is JSON, or YAML when its text does not start as JSON does (`kubectl get cm -o
yaml` prints YAML): both are held to JSON's data model, with duplicate keys refused, YAML's
aliases and tags refused (an alias can make a small file a huge document) and its timestamps
kept as the strings they are in JSON.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from inference_policy.base import strictjson

MAX_FILE_BYTES = 4 * 1024 * 1024
# As deep as strict JSON reads (`inference_policy.base.strictjson`).
MAX_DEPTH = strictjson.MAX_DEPTH


class InputError(ValueError):
    """A file that cannot be read or decoded; the message names the file."""


def read_bytes(path: str, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    try:
        if path == "-":
            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with Path(path).open("rb") as handle:
                data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} {path} is larger than {max_bytes} bytes")
    return data


def read_json(path: str, what: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The document in `path` ("-": standard input): JSON, or YAML held to JSON's data."""
    data = read_bytes(path, what, max_bytes)
    if data.lstrip()[:1] not in (b"{", b"[") and data.strip():
        return _read_yaml(data, f"{what} {path}")
    try:
        return strictjson.loads(data, max_bytes=max_bytes, what=f"{what} {path}")
    except strictjson.StrictJSONError as exc:
        raise InputError(str(exc)) from None


class _StrictLoader(yaml.SafeLoader):
    """YAML with JSON's data model only."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.constructor.ConstructorError(
                None, None, "aliases are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is not a string", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# A timestamp stays the string JSON would carry; no other implicit type is added.
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _read_yaml(data: bytes, what: str) -> Any:
    try:
        documents = list(yaml.load_all(data, Loader=_StrictLoader))
    except RecursionError:
        raise InputError(f"{what} is nested too deeply") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{what} is neither JSON nor YAML that can be read: {exc}") from None
    if len(documents) != 1:
        raise InputError(f"{what} holds {len(documents)} YAML documents; one is expected")
    problem = _not_json(documents[0], "", 0)
    if problem:
        raise InputError(f"{what}: {problem}")
    return documents[0]


def _not_json(value: Any, where: str, depth: int) -> str | None:
    """Where a YAML value leaves JSON's data model (a set, bytes, a NaN, deep nesting)."""
    if depth > MAX_DEPTH:
        return f"{where or 'the document'} is nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _not_json(item, f"{where}.{key}" if where else str(key), depth + 1)
            if found:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _not_json(item, f"{where}[{index}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where or 'the document'} is {value}, which JSON cannot carry"
    if value is None or isinstance(value, str | bool | int | float):
        return None
    return f"{where or 'the document'} is a YAML {type(value).__name__}, which JSON cannot carry"


def write_atomic(path: str, data: bytes, what: str) -> None:
    """Replace `path` with `data` in one rename, so a reader never sees half of it and a
    failure leaves the old file (or none) rather than an empty one."""
    target = Path(path)
    try:
        fd, temporary = tempfile.mkstemp(dir=target.parent or ".", prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o644)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise InputError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
