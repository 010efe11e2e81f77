"""Lenient reads of decoded JSON for the evidence: Pods from the API and reports posted from a
host arrive as untyped documents, and a field of the wrong type must read as absent, never
raise, so that one odd object does not cost the whole host's evidence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["as_map", "as_text"]


def as_map(value: Any) -> Mapping[str, Any]:
    """`value` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_text(value: Any) -> str:
    """`value` when it is a string, else the empty string."""
    return value if isinstance(value, str) else ""
