"""Pods that record every key path read of them, for the guard that holds the owner parts to the
tenant-input inventory (`inference_policy.tools.tenant_inputs`).

`recorded(pod, reads)` wraps a decoded Pod: each mapping becomes a `RecordingDict` and each list
a `RecordingList`, at construction, so whatever a reader holds on to keeps recording. A read is
recorded as its path (`spec.containers[].env`, `metadata.annotations[kamiwaza.ai/plan]`, list
indices as `[]`) and its kind:

* `value`: a key's value that is not an object or a list (by `get`, `[]` or `in`), or the
  elements of a list of plain values;
* `container`: an object or a list handed out, or its size asked (`len`, truth): reading it is
  not reading what it holds, which is recorded on its own;
* `absent`: a key asked for that the object does not have;
* `keys`: every key of an object enumerated (`keys`, iteration), as `path[*]`; `items` and
  `values` record each key's read besides.

The copying helper the owner parts use is passed through while recording (`passing_through`):
`pod_view.as_mapping` (returns a dict as it is and copies any other mapping: `dict(subclass)`
would copy without a read), so what is read of its result afterwards is recorded under the path
it came from. The Pod view itself (`inference_policy.base.pod_view`) copies nothing: it hands out
the recording mappings and lists as they are.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from inference_policy.base import pod_view

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
Kind = str


class Reads:
    """Every path read, with the kinds of read (`value`, `container`, `keys`)."""

    def __init__(self) -> None:
        self.paths: dict[str, set[Kind]] = {}

    def add(self, path: str, kind: Kind) -> None:
        self.paths.setdefault(path, set()).add(kind)

    def __iter__(self) -> Iterator[tuple[str, set[Kind]]]:
        return iter(sorted(self.paths.items()))


def child(path: str, key: object) -> str:
    if isinstance(key, str) and IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key}]"


def recorded(value: Any, reads: Reads, path: str = "") -> Any:
    """`value` (a decoded JSON document) wrapped so that reads of it are recorded in `reads`."""
    if isinstance(value, dict):
        return RecordingDict(value, reads, path)
    if isinstance(value, list):
        return RecordingList(value, reads, path)
    return value


def _kind(value: Any) -> Kind:
    return "container" if isinstance(value, dict | list) else "value"


class RecordingDict(dict[str, Any]):
    def __init__(self, data: dict[str, Any], reads: Reads, path: str) -> None:
        super().__init__({k: recorded(v, reads, child(path, k)) for k, v in data.items()})
        self.reads = reads
        self.path = path

    def _read(self, key: object, value: Any) -> Any:
        self.reads.add(child(self.path, key), _kind(value))
        return value

    def __getitem__(self, key: str) -> Any:
        return self._read(key, super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        if super().__contains__(key):
            return self._read(key, super().__getitem__(key))
        self.reads.add(child(self.path, key), "absent")
        return default

    def __contains__(self, key: object) -> bool:
        present = super().__contains__(key)
        value = super().__getitem__(key) if isinstance(key, str) and present else None
        self.reads.add(child(self.path, key), _kind(value) if present else "absent")
        return present

    def __iter__(self) -> Iterator[str]:
        self.reads.add(f"{self.path}[*]", "keys")
        return super().__iter__()

    def keys(self) -> Any:
        self.reads.add(f"{self.path}[*]", "keys")
        return super().keys()

    def items(self) -> Any:
        self.reads.add(f"{self.path}[*]", "keys")
        for key, value in super().items():
            self._read(key, value)
        return super().items()

    def values(self) -> Any:
        self.reads.add(f"{self.path}[*]", "keys")
        for key, value in super().items():
            self._read(key, value)
        return super().values()

    def __len__(self) -> int:
        self.reads.add(self.path, "container")
        return super().__len__()


class RecordingList(list[Any]):
    def __init__(self, data: Iterable[Any], reads: Reads, path: str) -> None:
        super().__init__(recorded(v, reads, f"{path}[]") for v in data)
        self.reads = reads
        self.path = path

    def _read(self) -> None:
        plain = any(not isinstance(v, dict | list) for v in list.__iter__(self))
        self.reads.add(self.path, "value" if plain else "container")

    def __iter__(self) -> Iterator[Any]:
        self._read()
        return super().__iter__()

    def __getitem__(self, index: Any) -> Any:
        self._read()
        return super().__getitem__(index)

    def __len__(self) -> int:
        self.reads.add(self.path, "container")
        return super().__len__()


def _through_as_mapping(value: Any) -> dict[str, Any]:
    if isinstance(value, RecordingDict):
        return value
    return original_as_mapping(value)


original_as_mapping = pod_view.as_mapping
PACKAGES = ("inference_policy", "extender", "allocation_controller")


@contextlib.contextmanager
def passing_through(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`as_mapping` hands a recording mapping back as it is, in every module of the owner parts
    that holds it."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(PACKAGES):
            continue
        if getattr(module, "as_mapping", None) is original_as_mapping:
            monkeypatch.setattr(module, "as_mapping", _through_as_mapping)
    yield


__all__ = ["Reads", "RecordingDict", "RecordingList", "passing_through", "recorded"]
