"""The caches' one eviction rule: bounded in entries, started over when full."""

from __future__ import annotations

from inference_policy.base.bounded import keep


def test_a_table_keeps_entries_up_to_its_bound_then_starts_over() -> None:
    table: dict[str, int] = {}
    for index in range(3):
        assert keep(table, f"k{index}", index, 3) == index
    assert table == {"k0": 0, "k1": 1, "k2": 2}
    # Full: the next entry empties it first, so the table never holds more than the bound.
    assert keep(table, "k3", 3, 3) == 3
    assert table == {"k3": 3}
