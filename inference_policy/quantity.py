"""Kubernetes resource quantities, the small subset the profile and the plan speak.

The core may not import the Kubernetes client, and it needs exact integer arithmetic on byte
counts anyway (a profile that says 79Gi means 84,825,604,096 bytes, not a float near it), so the
binary-suffix quantities are parsed and rendered here.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

KI = 1024
MI = 1024**2
GI = 1024**3
TI = 1024**4

_BINARY = {"Ki": KI, "Mi": MI, "Gi": GI, "Ti": TI}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_WHOLE_BINARY = re.compile(r"(?P<n>[1-9][0-9]{0,15})(?P<unit>Gi|Mi|Ki)")
_QUANTITY = re.compile(r"(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>Ki|Mi|Gi|Ti|m|k|M|G|T|)")


class QuantityError(ValueError):
    """A quantity string outside the accepted form."""


def parse_whole_binary(text: str) -> int:
    """Parse a whole number of Gi, Mi or Ki into bytes; fractions are refused."""
    match = _WHOLE_BINARY.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"{text!r} is not a whole number of Gi, Mi or Ki (for example 79Gi; no fractions)"
        )
    return int(match["n"]) * _BINARY[match["unit"]]


def parse_bytes(text: str) -> int:
    """Parse a memory quantity (binary or decimal suffix) into bytes, rounding up."""
    match = _QUANTITY.fullmatch(text)
    if match is None or match["unit"] == "m":
        raise QuantityError(f"{text!r} is not a memory quantity such as 8Gi or 512Mi")
    try:
        number = Decimal(match["n"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{text!r} is not a number") from exc
    unit = match["unit"]
    scale = _BINARY.get(unit) or _DECIMAL[unit]
    value = number * scale
    whole = int(value)
    return whole if whole == value else whole + 1


def parse_millicores(text: str) -> int:
    """Parse a CPU quantity ("2", "500m", "0.5") into millicores, rounding up."""
    match = _QUANTITY.fullmatch(text)
    if match is None or match["unit"] not in ("", "m"):
        raise QuantityError(f"{text!r} is not a CPU quantity such as 2 or 500m")
    number = Decimal(match["n"])
    value = number if match["unit"] == "m" else number * 1000
    whole = int(value)
    return whole if whole == value else whole + 1


def ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def gib_ceil(num_bytes: int) -> int:
    """Whole GiB needed to hold num_bytes."""
    return ceil_div(num_bytes, GI)


def format_gib(num_bytes: int) -> str:
    """Render bytes as whole Gi, rounded up: planning never rounds memory down."""
    return f"{gib_ceil(num_bytes)}Gi"


def format_bytes(num_bytes: int) -> str:
    """Render an exact byte count in the largest binary unit that divides it."""
    for unit, scale in (("Ti", TI), ("Gi", GI), ("Mi", MI), ("Ki", KI)):
        if num_bytes % scale == 0 and num_bytes >= scale:
            return f"{num_bytes // scale}{unit}"
    return str(num_bytes)


def format_millicores(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"
