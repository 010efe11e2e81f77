"""The one quantity grammar (inference_policy.base.quantity) against the Kubernetes client's parser.

The core may not import the client, so the grammar is written out there; these properties hold
it to `kubernetes.utils.parse_quantity` on every quantity the Kubernetes grammar can produce
(signs, fractions, exponents, every SI and binary suffix), and check that anything the core
accepts the client accepts with the same value (the client is looser: it takes whitespace,
underscores and `Infinity`, which the API server never stores).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse

from inference_policy.base.quantity import (
    MAX_MAGNITUDE,
    QuantityError,
    parse_bytes,
    parse_millicores,
    parse_quantity,
    parse_whole_binary,
    resource_units,
    same_quantity,
)

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
digits = st.text("0123456789", min_size=1, max_size=8)


@st.composite
def quantities(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(digits)
    shape = draw(st.sampled_from(["int", "frac", "trailing-dot", "leading-dot"]))
    if shape == "frac":
        number = f"{whole}.{draw(digits)}"
    elif shape == "trailing-dot":
        number = f"{whole}."
    elif shape == "leading-dot":
        number = f".{draw(digits)}"
    else:
        number = whole
    if draw(st.booleans()):
        exponent = draw(st.integers(min_value=-30, max_value=12))
        marker = draw(st.sampled_from(["e", "E"]))
        sign_e = draw(st.sampled_from(["", "+"])) if exponent >= 0 else ""
        return f"{sign}{number}{marker}{sign_e}{exponent}"
    return f"{sign}{number}{draw(st.sampled_from(SUFFIXES))}"


@settings(max_examples=2000, deadline=None)
@given(quantities())
def test_every_grammar_quantity_parses_as_the_client_parses_it(text: str) -> None:
    expected = client_parse(text)
    if abs(expected) > MAX_MAGNITUDE:
        with pytest.raises(QuantityError, match="out of range"):
            parse_quantity(text)
        return
    assert parse_quantity(text) == expected


@settings(max_examples=3000, deadline=None)
@given(st.text("0123456789.+-eEnumkMGTPEi KB_x", max_size=10))
def test_what_the_core_accepts_the_client_accepts_with_the_same_value(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert client_parse(text) == value


@pytest.mark.parametrize(
    "text",
    ["", " 1", "1 ", "1_000", "Infinity", "NaN", "1Gb", "1ki", "1e", "1e+", "--1", "1.2.3", "e3"],
)
def test_what_the_grammar_refuses(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("value", [True, None, 1.5, [], {}])
def test_only_strings_and_integers_are_quantities(value: Any) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(value)


def test_huge_exponents_are_refused_before_any_arithmetic() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e999999999")
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("9" * 40)


@pytest.mark.parametrize(
    ("name", "text", "units"),
    [
        ("cpu", "1", 1000),
        ("cpu", "0.0001", 1),
        ("cpu", "100u", 1),
        ("memory", "1Ki", 1024),
        ("memory", "1500m", 2),
        ("memory", "1e-9", 1),
        ("nvidia.com/gpu", "+2", 2),
        ("kamiwaza.ai/vram-gb-gpu-0", "20", 20),
    ],
)
def test_resource_units_round_up_in_the_schedulers_unit(name: str, text: str, units: int) -> None:
    assert resource_units(name, text) == units


def test_negative_resources_are_refused() -> None:
    with pytest.raises(QuantityError, match="negative"):
        resource_units("memory", "-1Gi")
    with pytest.raises(QuantityError):
        parse_bytes("-1")
    with pytest.raises(QuantityError):
        parse_millicores("-500m")


@pytest.mark.parametrize("text", ["-1", "-500m", "8 Gi", "1e999", ""])
def test_bytes_and_millicores_refuse_with_the_form_they_take(text: str) -> None:
    # What a refused deployment request quotes back: the form asked for, not the grammar's detail.
    with pytest.raises(QuantityError) as memory:
        parse_bytes(text)
    assert str(memory.value) == f"{text!r} is not a memory quantity such as 8Gi or 512Mi"
    with pytest.raises(QuantityError) as cpu:
        parse_millicores(text)
    assert str(cpu.value) == f"{text!r} is not a CPU quantity such as 2 or 500m"


def test_profile_quantities_stay_whole_binary() -> None:
    assert parse_whole_binary("79Gi") == 79 * 1024**3
    for text in ("79.5Gi", "80G", "0Gi", "1e3"):
        with pytest.raises(QuantityError, match="whole number of Gi"):
            parse_whole_binary(text)


@pytest.mark.parametrize(
    ("left", "right", "same"),
    [("1", "1000m", True), ("1Gi", "1024Mi", True), ("1e3", "1k", True), ("1G", "1Gi", False)],
)
def test_same_quantity(left: str, right: str, same: bool) -> None:
    assert same_quantity(left, right) is same
    assert (client_parse(left) == client_parse(right)) is same


def test_exact_values_not_floats() -> None:
    assert parse_quantity("0.1") * 3 == Decimal("0.3")


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities())
def test_remembered_units_are_the_units_found_afresh(name: str, text: str) -> None:
    """`resource_units` remembers what it found by name and text; asked twice, or after a full
    memo starts over, it answers as working it out again does, and a refusal is never kept."""
    from inference_policy.base import quantity

    def afresh() -> int | str:
        try:
            units = parse_quantity(text) * (1000 if name == "cpu" else 1)
            if units < 0:
                return "refused"
            return int(units) + (1 if units > int(units) else 0)
        except QuantityError:
            return "refused"

    def remembered() -> int | str:
        try:
            return resource_units(name, text)
        except QuantityError:
            return "refused"

    expected = afresh()
    assert remembered() == expected
    assert remembered() == expected
    if expected == "refused":
        assert (name, text) not in quantity._UNITS
    else:
        assert quantity._UNITS[name, text] == expected


def test_the_units_memo_is_bounded() -> None:
    from inference_policy.base import quantity

    # The module's own bound, not a patched one: the memo is bounded as it ships.
    bound = quantity._MAX_UNITS
    quantity._UNITS.clear()
    for n in range(bound + 20):
        assert resource_units("memory", f"{n}Ki") == n * 1024
        assert len(quantity._UNITS) <= bound
    # Full, it started over rather than refusing to remember.
    assert 0 < len(quantity._UNITS) <= 21
