"""Research, not a product benchmark (see bench/research/README.md).

The repack oracle of the churn replay: one class as a scheduler sees it that may move every
running request at every arrival and departure.

Placement only decides where a request runs, so what such a repacker can admit, and the least
capacity any layout of the running requests strands, are what no placement policy could beat
(`bench_churn.py`'s docstring says where each is exact and where only bracketed). The replay asks
`Floor.fits` in place of a layout for the oracle's own admissions, and follows
`least_stranded` and `repacked` under every policy's run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from churn_trace import gpu_units
from packing import ffd_feasible, l2_bins

from inference_policy.placing.nodes import NodeFacts

Counts = dict[tuple[str, int], int]  # a class's running requests: (resource, size) -> how many


class Floor:
    """One class as a perfect repacker sees it: every running request may move at every event,
    so only the multiset of running requests matters, not where they run.

    `fits`: can the running requests and one more be packed at all? Exact for whole GPUs and
    MIG slices; for VRAM shares True or False where a test decides it (few enough requests,
    first-fit-decreasing succeeds, or the Martello-Toth L2 bound excludes it) and None where
    none does. `least_stranded`: a lower bound on the stranded measure of every layout of the
    running requests, so also of the repacker's own.
    """

    def __init__(
        self, cls: str, nodes: Sequence[NodeFacts], mix: Sequence[tuple[str, int, float]]
    ) -> None:
        self.cls = cls
        self.mix = list(mix)
        self.resources = tuple(sorted({r for r, _, _ in mix}))
        self.caps = {r: [n.allocatable.get(r, 0) for n in nodes] for r in self.resources}
        self.totals = {r: sum(c) for r, c in self.caps.items()}
        self.memo: dict[tuple[tuple[tuple[str, int], int], ...], tuple[float, float]] = {}
        self.built: dict[tuple[tuple[tuple[str, int], int], ...], tuple[float, float] | None] = {}
        largest = max(max(c) for c in self.caps.values())
        # P(size > f) of the class's request mix, for f = 0..largest (one resource classes).
        self.above = [sum(p for _, q, p in mix if q > f) for f in range(largest + 1)]
        self.nested: dict[int, int] = {}
        if cls == "whole":
            # Sizes and capacities are powers of two: requests of size s or more fit only on
            # nodes of capacity s or more, and placing the largest first never wastes room
            # (every free amount stays a multiple of the next size down), so these nested sums
            # are necessary and sufficient for a packing to exist.
            sizes = {q for _, q, _ in mix}
            (resource,) = self.resources
            if any(v & (v - 1) for v in sizes | set(self.caps[resource]) if v):
                raise ValueError("whole-GPU repacking is exact for powers of two only")
            self.nested = {s: sum(c for c in self.caps[resource] if c >= s) for s in sizes}
            # The least stranded measure of any split of F free GPUs into nodes of at most
            # `largest`: node sizes and the items on them relaxed away.
            self.split = [0.0] * (self.totals[resource] + 1)
            for x in range(1, len(self.split)):
                self.split[x] = min(
                    p * self.above[p] + self.split[x - p] for p in range(1, min(x, largest) + 1)
                )
        elif len(set(self.caps[self.resources[0]])) != 1 or (
            cls == "mig" and any(len(set(c)) != 1 for c in self.caps.values())
        ):
            raise ValueError("VRAM buckets and MIG nodes must be alike")

    def fits(self, running: Counts, resource: str, qty: int) -> bool | None:
        if self.cls == "mig":
            held = sum(q * n for (r, q), n in running.items() if r == resource)
            return held + qty <= self.totals[resource]
        if self.cls == "whole":
            for s, room in self.nested.items():
                held = sum(q * n for (_, q), n in running.items() if q >= s)
                if held + (qty if qty >= s else 0) > room:
                    return False
            return True
        bucket, count = self.caps[resource][0], len(self.caps[resource])
        sizes = [q for (_, q), n in running.items() for _ in range(n)] + [qty]
        if qty > bucket or sum(sizes) > bucket * count or l2_bins(sizes, bucket) > count:
            return False
        if len(sizes) <= count or ffd_feasible(sizes, bucket, count):
            return True
        return None

    def least_stranded(self, running: Counts) -> tuple[float, float]:
        """(units, GPUs) that every layout of `running` strands at least."""
        key = tuple(sorted((k, n) for k, n in running.items() if n))
        hit = self.memo.get(key)
        if hit is None:
            if self.cls == "mig":
                hit = self._mig(running)
            elif self.cls == "whole":
                (resource,) = self.resources
                free = self.totals[resource] - sum(q * n for (_, q), n in running.items())
                hit = (self.split[free], self.split[free])
            else:
                hit = self._vram(running)
            self.memo[key] = hit
        return hit

    def repacked(self, running: Counts) -> tuple[float, float] | None:
        """(units, GPUs) stranded by a layout of `running` that a repacker can build, or None
        when none was found: an upper end for the least stranded measure, exact for MIG."""
        key = tuple(sorted((k, n) for k, n in running.items() if n))
        if key in self.built:
            return self.built[key]
        (resource, *_) = self.resources
        caps = sorted(self.caps[resource], reverse=True)
        frees: list[int] | None = None
        if self.cls == "mig":
            hit: tuple[float, float] | None = self.least_stranded(running)
        elif self.cls == "whole":
            # Largest first, node after node: with powers of two every node but the last used
            # is filled exactly.
            left = {q: n for (_, q), n in running.items() if n}
            frees = []
            for cap in caps:
                room = cap
                for q in sorted(left, reverse=True):
                    take = min(left[q], room // q)
                    left[q] -= take
                    room -= take * q
                frees.append(room)
            if any(left.values()):
                frees = None
        else:
            frees = self._least_fragmenting(running, caps) or self._first_fit_decreasing(
                running, caps
            )
        if self.cls != "mig":
            if frees is None:
                hit = None
            else:
                units = sum(f * self.above[f] for f in frees)
                hit = (units, gpu_units(resource, units))
        self.built[key] = hit
        return hit

    def _least_fragmenting(self, running: Counts, caps: Sequence[int]) -> list[int] | None:
        # Largest first, each where the stranded measure rises least (FGD offline, with the
        # whole trace's mix), the least leftover among equals; buckets alike, so by free amount.
        free = {caps[0]: len(caps)}
        sizes = sorted(((q, n) for (_, q), n in running.items() if n), reverse=True)
        for q, n in sizes:
            for _ in range(n):
                options = [f for f, c in free.items() if c and f >= q]
                if not options:
                    return None
                f = min(
                    options,
                    key=lambda f: ((f - q) * self.above[f - q] - f * self.above[f], f - q),
                )
                free[f] -= 1
                free[f - q] = free.get(f - q, 0) + 1
        return [f for f, c in free.items() for _ in range(c)]

    def _first_fit_decreasing(self, running: Counts, caps: Sequence[int]) -> list[int] | None:
        frees = list(caps)
        for q in sorted((q for (_, q), n in running.items() for _ in range(n)), reverse=True):
            i = next((i for i, f in enumerate(frees) if f >= q), -1)
            if i < 0:
                return None
            frees[i] -= q
        return frees

    def _vram(self, running: Counts) -> tuple[float, float]:
        # A share over half the bucket has a bucket of its own; the gap it leaves is stranded
        # unless requests no larger than the gap fill it. A gap of f GB strands at least
        # f * P(size > gap) (P(size > f) only grows as f shrinks), and filling the smallest,
        # costliest gaps first from the requests that fit them is the most any layout can fill
        # (a request that fits a gap fits every larger one), even with requests split.
        (resource,) = self.resources
        bucket = self.caps[resource][0]
        gaps = sorted(
            bucket - q for (_, q), n in running.items() if 2 * q > bucket for _ in range(n)
        )
        small = sorted((q, q * n) for (_, q), n in running.items() if 2 * q <= bucket and n)
        units = 0.0
        pool = 0
        i = 0
        for gap in gaps:
            while i < len(small) and small[i][0] <= gap:
                pool += small[i][1]
                i += 1
            fill = min(gap, pool)
            pool -= fill
            units += (gap - fill) * self.above[gap]
        return units, gpu_units(resource, units)

    def _mig(self, running: Counts) -> tuple[float, float]:
        # Nodes are alike, so a layout is which shapes each node has run out of (a node out of
        # none, or out of all, strands nothing) and how the rest of each shape's slices spread.
        # For each multiset of such patterns the rest goes first to the nodes whose missing
        # shapes are likeliest requested (their free slices are the costly ones), up to one
        # slice short of full; the least over all multisets is exact.
        shapes = self.resources
        per = [self.caps[r][0] for r in shapes]
        prob = [sum(p for r, _, p in self.mix if r == s) for s in shapes]
        weight = [gpu_units(s, 1) for s in shapes]
        used = [sum(q * n for (r, q), n in running.items() if r == s) for s in shapes]
        count = len(self.caps[shapes[0]])
        patterns = range(1 << len(shapes))
        missing = [sum(prob[k] for k in range(len(shapes)) if m >> k & 1) for m in patterns]
        best_units = best_gpus = math.inf
        for layout in itertools.combinations_with_replacement(patterns, count):
            units = gpus = 0.0
            for k, cap in enumerate(per):
                out = sum(1 for m in layout if m >> k & 1)
                rest = used[k] - out * cap
                if rest < 0 or rest > (count - out) * (cap - 1):
                    break
                for miss in sorted((missing[m] for m in layout if not m >> k & 1), reverse=True):
                    take = min(rest, cap - 1)
                    rest -= take
                    units += (cap - take) * miss
                    gpus += (cap - take) * miss * weight[k]
            else:
                best_units, best_gpus = min(best_units, units), min(best_gpus, gpus)
        return best_units, best_gpus


__all__ = ["Counts", "Floor"]
