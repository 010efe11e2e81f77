"""Strict JSON: every ambiguity a second parser could read differently is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_policy.base import strictjson
from inference_policy.base.strictjson import StrictJSONError, loads


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b'{"a":1,"a":2}', "duplicate key 'a'"),
        (b'{"x":{"b":1,"b":1}}', "duplicate key 'b'"),
        (b'{"a":NaN}', "NaN is not allowed"),
        (b'{"a":Infinity}', "Infinity is not allowed"),
        (b'{"a":-Infinity}', "-Infinity is not allowed"),
        (b'{"a":1e400}', "overflows"),
        (b'\xef\xbb\xbf{"a":1}', "byte-order mark"),
        (b'{"a":"\\ud800"}', "lone surrogate"),
        (b'{"a":1} x', "Extra data"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100 + b"]" * 100, "nest"),
        (b"", "Expecting value"),
    ],
)
def test_refused(data: bytes, fragment: str) -> None:
    with pytest.raises(StrictJSONError) as err:
        loads(data)
    assert fragment in str(err.value)


def test_size_cap_names_the_document() -> None:
    with pytest.raises(StrictJSONError, match="request is 12 bytes, more than the limit of 10"):
        loads(b'{"a":"1234"}', max_bytes=10, what="request")


def test_accepts_plain_json() -> None:
    assert loads('{"a":[1,2.5,"x",null,true]}') == {"a": [1, 2.5, "x", None, True]}


def test_surrogate_pair_escape_is_accepted() -> None:
    assert loads(b'{"a":"\\ud83d\\ude00"}') == {"a": "\U0001f600"}


def test_depth_limit_is_exact() -> None:
    assert loads(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(StrictJSONError, match="nesting deeper than 64"):
        loads(b"[" * 66 + b"]" * 66)


@pytest.mark.parametrize("text", ['{"a":"\ud800"}', '{"\udfff":1}'])
def test_text_holding_a_lone_surrogate_is_refused_by_name(text: str) -> None:
    # Text (not bytes) cannot be refused by the UTF-8 decoder: encoding it is where it fails.
    with pytest.raises(StrictJSONError, match="request holds a lone surrogate at character"):
        loads(text, what="request")


# -- the fast path ------------------------------------------------------------------------------
#
# `loads` takes orjson's value when it can show the strict decoder would read the same one, and
# otherwise decodes strictly. These check that it never takes a value the strict decoder would
# refuse or read differently, on the documents most likely to split them.


def _both(data: bytes) -> tuple[Any, Any]:
    """(the fast path's value or None, the strict decoder's value or its error)."""
    fast = strictjson._fast(data)
    try:
        strict: Any = strictjson._strict(data, data, "document")
    except StrictJSONError as exc:
        strict = exc
    return (None if fast is strictjson._SLOW else fast), strict


def _same(a: Any, b: Any) -> bool:
    # Equal, with the same types throughout (1 == 1.0 == True in Python, not in JSON) and the
    # same key order.
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _agree(data: bytes) -> Any:
    """Assert the fast path takes nothing the strict decoder would refuse or read otherwise,
    and that `loads` answers as the strict decoder does; the fast value or None."""
    fast, strict = _both(data)
    if fast is not None:
        assert not isinstance(strict, Exception), (data, strict)
        assert _same(fast, strict), data
    try:
        value: Any = loads(data)
    except StrictJSONError as exc:
        value = exc
    if isinstance(strict, Exception):
        assert isinstance(value, StrictJSONError) and str(value) == str(strict)
    else:
        assert _same(value, strict)
    return fast


@pytest.mark.parametrize(
    "data",
    [
        b'{"a":1,"a":2}',
        b'{"a": 1, "a": 1}',
        b'{"a":" ","a":" "}',
        b'{"a":"x:y","a":"z"}',
        b'{"a":{"b":1},"a":{"b":1}}',
        b'{"x":{"b":1,"c":2,"b":1}}',
        b'{"a":"\\u003a","a":1}',
        b'{"a":1,"a":1,"b":"\\u003a"}',
        b'{"a":"\\u0020"}',
        b'{"a":"\\ud800"}',
        b'{"a":123456789012345678901234567890}',
        b'{"a":-9223372036854775809}',
        b'{"a":18446744073709551616}',
        b'{"a":1e400}',
        b'{"a":1.5}',
        b'{"a":[1,2.0]}',
        b'{"a":[1E2]}',
        b'{"a": -0.0}',
        b'{"a":0.1000000000000000055511151231257827}',
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"a":1} x',
        b'{"a":"\x01"}',
        b'{"a":"\xff"}',
        b'{"a":' + b"[" * 63 + b"]" * 63 + b"}",
        b'{"a":' + b"[" * 64 + b"]" * 64 + b"}",
        b'{"a":' + b"[" * 70 + b"]" * 70 + b"}",
        b'{"a":' + b'{"a":' * 70 + b"1" + b"}" * 70 + b"}",
    ],
)
def test_the_fast_path_takes_nothing_the_strict_decoder_would_refuse_or_read_otherwise(
    data: bytes,
) -> None:
    _agree(data)


@pytest.mark.parametrize(
    "value",
    [
        {"engine": "llamacpp", "model": {"name": "Qwen/Qwen2.5-7B: q4", "weightsBytes": 4 * 10**9}},
        {"a": [1, 2.5, -3, 'x"y\n', None, True, {}], "b": 1e16, "c": "\u00e9 \u2028"},
    ],
)
@pytest.mark.parametrize(
    "encode",
    [
        lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False),
        lambda v: json.dumps(v, ensure_ascii=False),
        lambda v: json.dumps(v, indent=2, ensure_ascii=False),
    ],
    ids=["compact", "python-default", "indented"],
)
def test_the_fast_path_is_taken_for_json_as_common_encoders_write_it(
    value: dict[str, Any], encode: Any
) -> None:
    assert _agree(encode(value).encode()) is not None


_keys = st.sampled_from(["a", "b", "a:b", "a b", "é", "x/y", ""])
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from('ab :,"\\é\x00/'), max_size=5),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        # Pairs, not dicts: keys may repeat, as a hostile document's do.
        st.lists(st.tuples(_keys, inner), max_size=4).map(tuple),
    ),
    max_leaves=12,
)


def _encode(value: Any, space: str) -> str:
    if isinstance(value, tuple):
        members = (f"{json.dumps(k)}:{space}{_encode(v, space)}" for k, v in value)
        return "{" + f",{space}".join(members) + "}"
    if isinstance(value, list):
        return "[" + f",{space}".join(_encode(x, space) for x in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_keys, _values), max_size=5).map(tuple), st.sampled_from(["", " ", "\n"]))
def test_the_fast_path_agrees_with_the_strict_decoder_on_generated_documents(
    pairs: tuple[tuple[str, Any], ...], space: str
) -> None:
    _agree(_encode(pairs, space).encode())
