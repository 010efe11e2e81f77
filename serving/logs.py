"""One log format for every server: a JSON object per line on standard error.

The servers' logs are read by machines first (a log pipeline that indexes by Pod, uid or code)
and by people second, so each record is one JSON object with the same four keys everywhere
(`ts` in RFC 3339 UTC, `level`, `logger`, `msg`) plus whatever structured fields the call passed
with `extra=` (`uid`, `namespace`, `pod`, `code`, `binding`, `node`, `verdict`, ...), and `exc`
with the traceback when there is one. The message stays constant per kind of event and the
variable parts go into fields, so a line is found by its fields rather than by parsing prose.

A line is always one line: orjson escapes every control character, a traceback included. The
formatter never raises on a field it cannot encode (a deep structure, a lone surrogate, a key
that is not a string): a log call must not turn into a failed request, so such a record is
written again with every field as text.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

import orjson

# What a LogRecord carries by itself; everything else on a record came in through `extra=`.
_BARE_RECORD = logging.LogRecord("", logging.INFO, "", 0, "", None, None)
_RECORD_ATTRIBUTES = frozenset(vars(_BARE_RECORD)) | {"message", "asctime", "taskName"}
_FIXED = ("ts", "level", "logger", "msg", "exc", "stack")
_SKIPPED = _RECORD_ATTRIBUTES | frozenset(_FIXED)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        # Most records of a busy server fall in the same second; the date part is reused.
        self._second = -1
        self._second_text = ""

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int((created - second) * 1_000_000):06d}Z"

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _SKIPPED and not key.startswith("_"):
                document[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            document["exc"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(document, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except orjson.JSONEncodeError:
            return orjson.dumps({key: _text(value) for key, value in document.items()}).decode()


def _text(value: Any) -> Any:
    # The fallback for a record orjson refused: every field becomes text that is valid UTF-8.
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        text = value
    else:
        try:
            text = repr(value)
        except RecursionError:
            text = f"<{type(value).__name__} nested too deeply to print>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def install(level: str | int, stream: IO[str] | None = None) -> logging.Handler:
    """Send every logger's records to `stream` (standard error) as JSON lines, at `level`.

    Replaces whatever handlers the root logger had, so calling it twice leaves one handler.
    Returns the handler (tests capture through it).
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return handler
