"""Strict JSON decoding for everything that crosses a trust boundary.

The standard library accepts duplicate keys (last wins), NaN and Infinity, a byte-order mark
after decoding, lone surrogates and unbounded nesting. Each of those lets two readers of the
same bytes see different documents, which is exactly what a signed profile must rule out, so
every external document is decoded here before any other check looks at it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

DEFAULT_MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
# A lone surrogate can only arrive as a \u escape (strict UTF-8 decoding refuses encoded ones),
# and nesting cannot be deeper than the number of brackets: when neither can be present, the
# walk over the decoded value is skipped. Most documents are small and flat, so this keeps the
# admission path from visiting every value twice.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class StrictJSONError(ValueError):
    """The bytes are not one strict JSON document; the message says why."""


def _reject_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not allowed in JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Built in C; a key listed twice leaves the dict shorter than the list, and only then is
    # the list walked to name the first key that repeats.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJSONError(f"duplicate key {key!r}")
            seen.add(key)
    return out


def _check_depth_and_strings(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise StrictJSONError(f"nesting deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_string(key)
            _check_depth_and_strings(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_depth_and_strings(item, depth + 1)
    elif isinstance(value, str):
        _check_string(value)
    elif isinstance(value, float) and value != value:  # pragma: no cover - parse_constant stops NaN
        raise StrictJSONError("NaN is not allowed in JSON")


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StrictJSONError("string holds a lone surrogate") from exc


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise StrictJSONError(f"number {text} overflows a double")
    return value


# One decoder, made once: `json.loads` with hooks builds a decoder and its scanner per call,
# which costs a quarter of decoding a deployment request.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates,
    parse_constant=_reject_constant,
    parse_float=_parse_float,
)


def loads(data: bytes | str, *, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "document") -> Any:
    """Decode one strict JSON document or raise StrictJSONError naming the problem."""
    try:
        raw = data.encode("utf-8") if isinstance(data, str) else data
    except UnicodeEncodeError as exc:
        # Text that no UTF-8 bytes could carry: a lone surrogate, as bytes would be refused.
        raise StrictJSONError(f"{what} holds a lone surrogate at character {exc.start}") from None
    if len(raw) > max_bytes:
        raise StrictJSONError(f"{what} is {len(raw)} bytes, more than the limit of {max_bytes}")
    if raw.startswith(b"\xef\xbb\xbf"):
        raise StrictJSONError(f"{what} starts with a byte-order mark")
    fast = _fast(raw)
    if fast is not _SLOW:
        return fast
    return _strict(data, raw, what)


def _strict(data: bytes | str, raw: bytes, what: str) -> Any:
    """The strict decoder proper, for `raw` (`data` as UTF-8) that passed the size and
    byte-order-mark checks."""
    if isinstance(data, str):
        # It encoded, so it is exactly what decoding those bytes would give back.
        text = data
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJSONError(f"{what} is not UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        value = _DECODER.decode(text)
    except StrictJSONError as exc:
        raise StrictJSONError(f"{what} is not strict JSON: {exc}") from None
    except RecursionError:
        raise StrictJSONError(f"{what} nests too deeply") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(
            f"{what} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH and (
        b"\\u" not in raw or not _SURROGATE_ESCAPE.search(raw)
    ):
        return value
    try:
        _check_depth_and_strings(value)
    except StrictJSONError as exc:
        raise StrictJSONError(f"{what} is not strict JSON: {exc}") from None
    return value


_SLOW: Any = object()


def _fast(raw: bytes) -> Any:
    """The value the strict decoder would read from `raw`, decoded by orjson in C; or `_SLOW`
    when that cannot be shown, and the strict decoder decides (and names what is wrong).
    Admission decodes a tenant's request on every review: Python's scanner with the
    duplicate-key hook costs about five microseconds, this about two.

    orjson reads some documents otherwise than the strict decoder: it keeps the last member of
    a repeated key, turns an integer past 64 bits into a float, and has its own float parser.
    Each of those changes the value's compact encoding `D`, so the value is taken only when `D`
    and the input are the same bytes once JSON's whitespace is taken out of both. Then every
    token of the input is the token of `D`: each string is the very bytes orjson writes for the
    string it read there (an escape orjson would not write, even `\u0020`, leaves bytes that
    differ), each number the shortest digits of the double or the integer orjson holds (an
    integer past 64 bits would show as a float), and each object has the members of `D`, none
    repeated. Whitespace cannot join or split tokens of a document orjson accepted. So the
    input reads as `D` does, as the value, under any correct decoder. Nesting is bounded by the
    number of brackets, at most MAX_DEPTH.
    """
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        return _SLOW
    try:
        value = orjson.loads(raw)
        compact = orjson.dumps(value)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return _SLOW
    if compact == raw:
        return value
    # orjson writes whitespace only as spaces inside strings (it escapes tabs and line breaks):
    # without one, `compact` is already its own stripped form.
    if b" " in compact:
        compact = compact.translate(None, _WHITESPACE)
    return value if raw.translate(None, _WHITESPACE) == compact else _SLOW


_WHITESPACE = b" \t\n\r"


def dumps_compact(value: Any) -> str:
    """Compact JSON text for a value this package produced (a plan): no spaces, UTF-8 kept,
    NaN refused, so the same value is always the same text."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except orjson.JSONEncodeError as exc:
        raise StrictJSONError(f"cannot encode: {exc}") from None
