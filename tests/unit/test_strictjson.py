"""Strict JSON: every ambiguity a second parser could read differently is refused."""

from __future__ import annotations

import pytest

from inference_policy.strictjson import StrictJSONError, loads


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
