"""How a Python string is written as a CEL string literal, for every generated policy."""

from __future__ import annotations


def cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


__all__ = ["cel_string"]
