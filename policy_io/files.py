"""Reading the owner's JSON documents from files or standard input, strictly and with a size cap."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from inference_policy import strictjson

MAX_FILE_BYTES = 4 * 1024 * 1024


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
    data = read_bytes(path, what, max_bytes)
    try:
        return strictjson.loads(data, max_bytes=max_bytes, what=f"{what} {path}")
    except strictjson.StrictJSONError as exc:
        raise InputError(str(exc)) from None
