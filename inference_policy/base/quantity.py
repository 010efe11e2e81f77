"""Kubernetes resource quantities: the one grammar every component reads them with.

The core may not import the Kubernetes client, and it needs exact arithmetic anyway (a profile
that says 79Gi means 84,825,604,096 bytes, not a float near it; `1000m` must equal `1`), so the
whole quantity syntax of `k8s.io/apimachinery/pkg/api/resource` is parsed here, once:

    quantity        ::= signedNumber suffix
    suffix          ::= binarySI | decimalExponent | decimalSI
    binarySI        ::= Ki | Mi | Gi | Ti | Pi | Ei
    decimalSI       ::= n | u | m | "" | k | M | G | T | P | E
    decimalExponent ::= "e" signedNumber | "E" signedNumber
    signedNumber    ::= number | sign number
    number          ::= digits | digits "." digits | digits "." | "." digits

The planner, the placement ledger, the grant check and the profile schema all read quantities
through `parse_quantity`; the stricter forms a signed profile uses (whole Gi) and the units each
consumer counts in (bytes, millicores) are thin layers over it. The property tests check it
against `kubernetes.utils.parse_quantity` on generated quantities.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from inference_policy.base.bounded import keep

KI = 1024
MI = 1024**2
GI = 1024**3
TI = 1024**4

SUFFIXES: dict[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# The API server keeps quantities as int64 scaled values; anything past this is not a resource
# amount any real object carries, and refusing it keeps exact arithmetic cheap (1e999999 would
# otherwise become a million-digit integer).
MAX_MAGNITUDE = Decimal(2**63 - 1)
MAX_TEXT = 64
_GRAMMAR = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)"
    r"|[eE](?P<exponent>[+-]?[0-9]+))?"
)
# The same grammar without a sign, as a plain pattern a schema can check (a plan's quantities
# are amounts granted, never negative, and are range-checked when converted to units).
UNSIGNED_PATTERN = (
    r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_WHOLE_BINARY = re.compile(r"[1-9][0-9]{0,15}(?:Gi|Mi|Ki)")


class QuantityError(ValueError):
    """A quantity outside the Kubernetes grammar or range; the message names the text."""


def parse_quantity(text: Any) -> Decimal:
    """The exact value of a Kubernetes quantity (a string, or an int as YAML may give one)."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise QuantityError(f"{text!r} is not a quantity (a string such as 8Gi, 500m or 1e3)")
    raw = str(text)
    if len(raw) > MAX_TEXT:
        raise QuantityError(f"{raw[:MAX_TEXT]!r}… is not a quantity: longer than {MAX_TEXT}")
    match = _GRAMMAR.fullmatch(raw)
    if match is None:
        raise QuantityError(f"{raw!r} is not a quantity (for example 8Gi, 500m or 1e3)")
    try:
        number = Decimal(match["number"])
        exponent = match["exponent"]
        if exponent is not None:
            if len(exponent.lstrip("+-")) > 3:
                raise QuantityError(f"{raw!r} is out of range")
            value = number.scaleb(int(exponent))
        else:
            value = number * SUFFIXES[match["suffix"] or ""]
    except InvalidOperation:  # pragma: no cover - the grammar admits only decimals
        raise QuantityError(f"{raw!r} is not a number") from None
    if abs(value) > MAX_MAGNITUDE:
        raise QuantityError(f"{raw!r} is out of range")
    return value


def ceil_units(value: Decimal) -> int:
    """Whole units, rounded up: a share of a byte or a millicore is still a whole one."""
    whole = int(value)
    return whole + 1 if value > whole else whole


# Units already found, by resource name and quantity text: the extender reads every Pod's
# requests on each watch event and each scheduling call, and a cluster's Pods spell their
# quantities in a handful of ways. Pure and bounded (started over when full).
_UNITS: dict[tuple[str, str], int] = {}
_MAX_UNITS = 4096


def resource_units(name: str, text: Any, *, example: str | None = None) -> int:
    """A non-negative resource amount in the unit the scheduler counts it in: millicores for
    `cpu`, whole base units (bytes, devices, GB) for anything else, rounded up. A quantity that
    is not one, or is negative, is refused with `parse_quantity`'s reason, or with only "is not
    a <example>" when an example is given (`parse_bytes`, `parse_millicores`)."""
    if type(text) is str and example is None:
        key = (name, text)
        found = _UNITS.get(key)
        if found is None:
            found = keep(_UNITS, key, _resource_units(name, text, example), _MAX_UNITS)
        return found
    return _resource_units(name, text, example)


def _resource_units(name: str, text: Any, example: str | None) -> int:
    try:
        value = parse_quantity(text)
        if value < 0:
            raise QuantityError(f"{name}: {text!r} is negative")
    except QuantityError:
        if example is None:
            raise
        raise QuantityError(f"{text!r} is not a {example}") from None
    return ceil_units(value * 1000 if name == "cpu" else value)


def same_quantity(a: Any, b: Any) -> bool:
    """Equal as quantities (`1Gi` and `1024Mi`, `1` and `1000m`); unreadable values compare as
    written, since the API server stores quantities in its canonical spelling, not ours."""
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return bool(a == b)


def parse_whole_binary(text: Any) -> int:
    """A whole number of Gi, Mi or Ki in bytes; the profile's form, fractions refused."""
    if not isinstance(text, str) or _WHOLE_BINARY.fullmatch(text) is None:
        raise QuantityError(
            f"{text!r} is not a whole number of Gi, Mi or Ki (for example 79Gi; no fractions)"
        )
    return int(parse_quantity(text))


def parse_bytes(text: Any) -> int:
    """A memory quantity in bytes, rounded up; zero or more, never a fraction of a byte."""
    return resource_units("memory", text, example="memory quantity such as 8Gi or 512Mi")


def parse_millicores(text: Any) -> int:
    """A CPU quantity ("2", "500m", "0.5") in millicores, rounded up."""
    return resource_units("cpu", text, example="CPU quantity such as 2 or 500m")


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


def format_units(name: str, value: int) -> str:
    """A resource amount as people read it in a reason: `500m` cpu, `8Gi` memory, `2` GPUs."""
    if name == "cpu":
        return format_millicores(value)
    if name in {"memory", "ephemeral-storage"}:
        return format_bytes(value)
    return str(value)
