"""Research, not a product benchmark (see bench/research/README.md).

What a packer that may place (or move) every request at will can do: whether a multiset of
requests fits a set of bins, the largest prefix of an arrival sequence that fits, and bounds
where deciding it exactly is too costly.

The placement benchmarks judge online policies against these: `bench_placement.py`'s offline
optimum and `bench_churn.py`'s repack oracle (which repacks every running request at every
event) both rest on them. Exact for power-of-two sizes and capacities (largest first) and, by
branch and bound, for small instances; otherwise first-fit-decreasing (a packing that exists)
brackets the answer with the Martello-Toth L2 lower bound on the bins needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def pow2_feasible(sizes: Sequence[int], bins: Sequence[int]) -> bool:
    """Exact when every size and capacity is a power of two: largest first, anywhere with room."""
    return pow2_gpus(sorted(sizes, reverse=True), bins) == sum(sizes)


def pow2_gpus(sizes_desc: Sequence[int], bins: Sequence[int]) -> int:
    """The capacity placed by putting each size (largest first) anywhere with room."""
    free = sorted(bins, reverse=True)
    placed = 0
    for size in sizes_desc:
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                placed += size
                break
    return placed


def ffd_feasible(sizes: Sequence[int], capacity: int, count: int) -> bool:
    """Whether first-fit-decreasing packs `sizes` into `count` bins of `capacity` (if it does,
    a packing exists; if not, one may still)."""
    free: list[int] = []
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                break
        else:
            if len(free) == count or size > capacity:
                return False
            free.append(capacity - size)
    return True


def ffd_placed(sizes: Sequence[int], capacity: int, count: int) -> int:
    """The capacity first-fit-decreasing places in `count` bins, skipping what does not fit."""
    free = [capacity] * count
    placed = 0
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if room >= size:
                free[i] = room - size
                placed += size
                break
    return placed


def l2_bins(sizes: Sequence[int], capacity: int) -> int:
    """Martello-Toth L2: a lower bound on the identical bins needed to hold `sizes`."""
    best = math.ceil(sum(sizes) / capacity)
    candidates = {0} | {s for s in sizes if s <= capacity // 2}
    for alpha in candidates:
        j1 = [s for s in sizes if s > capacity - alpha]
        j2 = [s for s in sizes if capacity - alpha >= s > capacity / 2]
        j3 = [s for s in sizes if capacity / 2 >= s >= alpha]
        spare = len(j2) * capacity - sum(j2)
        bound = len(j1) + len(j2) + max(0, math.ceil((sum(j3) - spare) / capacity))
        best = max(best, bound)
    return best


def exact_feasible(sizes: Sequence[int], capacity: int, count: int) -> bool:
    """Branch and bound: can `sizes` go into `count` bins of `capacity`?"""
    order = sorted(sizes, reverse=True)
    if sum(order) > capacity * count or (order and order[0] > capacity):
        return False
    free = [capacity] * count

    def place(k: int) -> bool:
        if k == len(order):
            return True
        size = order[k]
        tried: set[int] = set()
        for i in range(count):
            room = free[i]
            if room < size or room in tried:
                continue
            tried.add(room)  # bins with the same room are interchangeable
            free[i] = room - size
            if place(k + 1):
                return True
            free[i] = room
        return False

    return place(0)


def largest_prefix(n: int, feasible: Callable[[int], bool]) -> int:
    """The largest k <= n with `feasible(k)`, by bisection: `feasible` must hold for every k up
    to the answer and for none beyond it."""
    low, high = 0, n
    while low < high:
        mid = (low + high + 1) // 2
        if feasible(mid):
            low = mid
        else:
            high = mid - 1
    return low


def fitting_prefix(sizes: Sequence[int], feasible: Callable[[Sequence[int]], bool]) -> int:
    """How many of `sizes`, in order, fit together by `feasible`."""
    return largest_prefix(len(sizes), lambda k: feasible(sizes[:k]))


__all__ = [
    "exact_feasible",
    "ffd_feasible",
    "ffd_placed",
    "fitting_prefix",
    "l2_bins",
    "largest_prefix",
    "pow2_feasible",
    "pow2_gpus",
]
