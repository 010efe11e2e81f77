"""The one eviction rule of the caches the hot paths keep: a table bounded in entries, which
starts over when full.

Every such cache holds what was derived from inputs that change by revision (a profile, a
catalog, a plan's text, a Node), so its entries go stale together. Emptying a full table costs
nothing per lookup (a least-recently-used order would be kept up on every lookup of every
review and scheduling cycle), keeps each operation O(1) amortised, and a burst of identical
requests refills it at once. Each cache's bound is written beside it. The extender's memory of
earlier scheduling cycles is the one exception: few entries, each costly to rebuild, so it keeps
them in least-recently-used order (`extender.view.ClusterView.cycle`).
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def keep(table: dict[K, V], key: K, value: V, limit: int) -> V:
    """Put `value` in `table` under `key` and return it; a table already holding `limit`
    entries is emptied first."""
    if len(table) >= limit:
        table.clear()
    table[key] = value
    return value
