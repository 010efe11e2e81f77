"""The servers' log format: one JSON object per line, whatever the record carries.

We test these aspects: the fixed keys and their formats, structured fields from `extra=`,
exceptions and stack traces, non-ASCII text, that a message or traceback with newlines stays one
line, that a field orjson refuses (deep nesting, a lone surrogate, an odd key) still gives a
line instead of an error, and that installing twice leaves one handler.
"""

from __future__ import annotations

import io
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from serving.logs import JsonFormatter, install


def record(
    msg: str = "review answered",
    *args: Any,
    levelno: int = logging.INFO,
    exc_info: Any = None,
    **extra: Any,
) -> logging.LogRecord:
    made = logging.LogRecord("webhook.app", levelno, __file__, 1, msg, args or None, exc_info)
    made.__dict__.update(extra)
    return made


def line(made: logging.LogRecord) -> dict[str, Any]:
    text = JsonFormatter().format(made)
    assert "\n" not in text and "\r" not in text
    document: dict[str, Any] = orjson.loads(text)
    return document


def test_fixed_keys_and_rfc3339_utc_timestamp() -> None:
    made = record("%s of %d", "one", 2)
    made.created = datetime(2026, 11, 29, 12, 0, 5, 123456, tzinfo=UTC).timestamp()
    document = line(made)
    assert document == {
        "ts": "2026-11-29T12:00:05.123456Z",
        "level": "INFO",
        "logger": "webhook.app",
        "msg": "one of 2",
    }
    assert datetime.fromisoformat(document["ts"]) == datetime.fromtimestamp(made.created, UTC)


def test_the_second_is_recomputed_when_it_changes() -> None:
    formatter = JsonFormatter()
    first, second = record(), record()
    first.created = datetime(2026, 11, 29, 12, 0, 5, tzinfo=UTC).timestamp()
    second.created = datetime(2026, 11, 29, 12, 0, 6, 500000, tzinfo=UTC).timestamp()
    assert orjson.loads(formatter.format(first))["ts"] == "2026-11-29T12:00:05.000000Z"
    assert orjson.loads(formatter.format(second))["ts"] == "2026-11-29T12:00:06.500000Z"


def test_structured_fields_from_extra_are_top_level_keys() -> None:
    logger = logging.getLogger("tests.logs.extra")
    captured: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign, assignment]
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(
            "review answered",
            extra={"uid": "u-1", "namespace": "kamiwaza", "pod": "tmi-1", "status": 403,
                   "codes": {"arch": 2}, "binding": None},
        )  # fmt: skip
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    document = line(captured[0])
    assert document["level"] == "WARNING"
    assert document["logger"] == "tests.logs.extra"
    assert {k: document[k] for k in ("uid", "namespace", "pod", "status", "codes", "binding")} == {
        "uid": "u-1",
        "namespace": "kamiwaza",
        "pod": "tmi-1",
        "status": 403,
        "codes": {"arch": 2},
        "binding": None,
    }
    # Nothing of the record's own bookkeeping leaks into the line.
    assert not {"args", "levelno", "pathname", "lineno", "thread", "process"} & set(document)


def test_a_field_cannot_replace_a_fixed_key() -> None:
    document = line(record(ts="forged", level="forged", logger="forged"))
    assert document["level"] == "INFO" and document["logger"] == "webhook.app"
    assert document["ts"] != "forged"


def test_exception_is_one_escaped_line_with_the_traceback() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        failure = sys.exc_info()
    made = record("plan failed", levelno=logging.ERROR, exc_info=failure, code="internal")
    document = line(made)
    assert document["code"] == "internal"
    assert document["exc"].startswith("Traceback (most recent call last):\n")
    assert document["exc"].endswith("ValueError: bad\nvalue")


def test_stack_info_is_kept() -> None:
    made = record(stack_info="Stack (most recent call last):\n  here")
    assert line(made)["stack"] == "Stack (most recent call last):\n  here"


def test_non_ascii_is_written_as_utf8_text() -> None:
    text = JsonFormatter().format(record("Pod für Ünïcode 模型 ✓", pod="tmi-ü"))
    assert "Pod für Ünïcode 模型 ✓" in text
    assert orjson.loads(text)["pod"] == "tmi-ü"


def test_a_message_with_newlines_and_control_characters_stays_one_line() -> None:
    document = line(record("first\nsecond\r\nthird\x1b[31m\u2028", detail="a\nb"))
    assert document["msg"] == "first\nsecond\r\nthird\x1b[31m\u2028"
    assert document["detail"] == "a\nb"


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [_deep(300), "lone \ud800 surrogate", {("tuple", "key"): 1}, object()],
    ids=["deep", "surrogate", "tuple-key", "object"],
)
def test_a_field_orjson_refuses_still_gives_one_line(value: Any) -> None:
    document = line(record("kept", field=value, uid="u-1"))
    assert document["msg"] == "kept" and document["uid"] == "u-1"
    assert isinstance(document["field"], str | dict)


def test_a_surrogate_in_the_message_is_escaped_not_fatal() -> None:
    assert line(record("odd \udcff byte"))["msg"] == "odd \\udcff byte"


# The root logger is restored after each test (tests/conftest.py).
def test_install_replaces_the_root_handlers_and_sets_the_level() -> None:
    first = io.StringIO()
    install("WARNING", first)
    second = io.StringIO()
    handler = install("DEBUG", second)
    root = logging.getLogger()
    assert root.handlers == [handler]
    assert root.level == logging.DEBUG
    logging.getLogger("tests.logs.install").debug("hello %s", "there", extra={"node": "n1"})
    assert first.getvalue() == ""
    [text] = second.getvalue().splitlines()
    document = orjson.loads(text)
    assert (document["msg"], document["node"], document["level"]) == (
        "hello there",
        "n1",
        "DEBUG",
    )
