"""Turning pydantic's validation errors into one precise sentence that names the field.

Owners and tenants read these messages in a terminal or an API response, so the location is
written the way they would point at it (`profiles[1].bindings[0].capacity.usableMemory`), not
as pydantic's tuple with discriminator tags in it.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from inference_policy.base.quantity import UNSIGNED_PATTERN

_TAGS = frozenset({"cpu", "extended-resource", "vram-plugin", "scheduler", "accounted"})


def field_path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TAGS:
            # Discriminated unions add the chosen tag to the location; readers never wrote it.
            continue
        else:
            out += f".{part}" if out else part
    return out or "(document)"


def describe(exc: ValidationError, limit: int = 3) -> str:
    """One line per distinct problem (at most `limit`), each naming its field."""
    parts: list[str] = []
    for err in exc.errors(include_url=False):
        where = field_path(err["loc"])
        kind = err["type"]
        pattern = (err.get("ctx") or {}).get("pattern")
        if kind == "string_pattern_mismatch" and pattern == UNSIGNED_PATTERN:
            text = f"{where}: {err['input']!r} is not a quantity (for example 8Gi, 500m or 1e3)"
        elif kind == "extra_forbidden":
            text = f"{where}: unknown field"
        elif kind == "missing":
            text = f"{where}: required field is missing"
        else:
            message = str(err["msg"])
            message = message.removeprefix("Value error, ")
            text = f"{where}: {message}"
        if text not in parts:
            parts.append(text)
        if len(parts) >= limit:
            break
    return "; ".join(parts)
