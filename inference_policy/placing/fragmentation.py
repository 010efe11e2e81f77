"""Expected fragmentation of a node's free capacity under the workload's request distribution.

Best fit looks only at the Pod being placed; it cannot tell a leftover that the next requests
will use from one that will sit idle. Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent" (USENIX ATC '23), measure the second
kind directly: the free capacity of a node that a request drawn from the workload cannot use,
in expectation over the workload's request sizes, and place each Pod where that expectation
grows least (FGD). This module is that measure for the extender's resources, and the decayed
histogram of seen requests it is taken against, so the score can be computed from what the
extender knows at run time. It is pure: the server feeds it the requests it sees, the
benchmarks feed it a trace.

For one resource (a device count, one VRAM bucket in GB, one MIG shape), a request of `size`
units can use a node's `free` units only if `size <= free`; otherwise all of them are
fragments to it (FGD's rule for a task the node cannot host; a partly free whole GPU never
arises here, because the device plugins hand out integral units). So the expected fragment is

    F(free) = free * P(size > free)

and placing a Pod of `want` units on a node changes it by `F(free - want) - F(free)`. MIG shapes
are separate resources: a slice serves requests for its own shape only, so each shape has its
own distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A request seen this many requests ago weighs half as much as the newest one: long enough to
# smooth one burst of identical deployments, short enough to follow a change of models.
DEFAULT_HALF_LIFE = 500
# Weights grow instead of old ones shrinking (one multiplication per request); rescale before
# floats lose precision.
_RESCALE_AT = 1e100
# Sizes whose decayed weight is below this share of their resource's total are forgotten.
_NEGLIGIBLE = 1e-4

Sizes = tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Workload:
    """The request distribution per resource: (size, probability) pairs, ascending by size,
    the probabilities of one resource summing to 1."""

    sizes: Mapping[str, Sizes]

    def of(self, resource: str) -> Sizes | None:
        return self.sizes.get(resource) or None


def tail(sizes: Sizes, free: int) -> float:
    """P(size > free): the share of requests that cannot use `free` units."""
    return sum(p for size, p in sizes if size > free)


def expected_fragment(free: int, sizes: Sizes) -> float:
    """Free units a request drawn from `sizes` cannot use, in expectation (FGD's F_n(M))."""
    if free <= 0:
        return 0.0
    return free * tail(sizes, free)


def fragment_delta(free: int, want: int, sizes: Sizes) -> float:
    """How much placing `want` units on a node with `free` units raises its expected fragment
    (negative: the placement uses capacity that would otherwise be stranded)."""
    return expected_fragment(free - want, sizes) - expected_fragment(free, sizes)


class RequestMix:
    """An exponentially decayed histogram of the requests seen, per resource.

    Decay is per request, not per second, so the histogram is a pure function of the sequence
    it was fed (the server and the benchmark agree) and a quiet hour does not erase it.
    """

    def __init__(self, half_life: int = DEFAULT_HALF_LIFE) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self._growth = 2.0 ** (1.0 / half_life)
        self._increment = 1.0
        self._weights: dict[str, dict[int, float]] = {}
        self._cached: Workload | None = None
        self.seen = 0

    def observe(self, resource: str, quantity: int) -> None:
        if quantity <= 0:
            return
        self.seen += 1
        self._increment *= self._growth
        sizes = self._weights.setdefault(resource, {})
        sizes[quantity] = sizes.get(quantity, 0.0) + self._increment
        if self._increment > _RESCALE_AT:
            self._rescale()
        self._cached = None

    def _rescale(self) -> None:
        factor = 1.0 / self._increment
        self._increment = 1.0
        for resource, sizes in list(self._weights.items()):
            total = sum(sizes.values()) * factor
            kept = {q: w * factor for q, w in sizes.items() if w * factor > _NEGLIGIBLE * total}
            if kept:
                self._weights[resource] = kept
            else:
                del self._weights[resource]

    def workload(self) -> Workload:
        """The current distribution (cached until the next observation)."""
        if self._cached is None:
            out: dict[str, Sizes] = {}
            for resource, sizes in self._weights.items():
                total = sum(sizes.values())
                if total > 0:
                    out[resource] = tuple((q, sizes[q] / total) for q in sorted(sizes))
            self._cached = Workload(out)
        return self._cached


# Deltas closer than this are equal: they are sums of float probabilities.
_SAME = 1e-9


def fragmentation_scores(
    frees: Sequence[int | None], want: int, sizes: Sizes, max_score: int
) -> list[int] | None:
    """FGD within the 0..10 range, or None when every fitting node's delta is the same (best
    fit then decides alone).

    The nodes with the smallest rise in expected fragmentation score `max_score` (the one of them
    best fit prefers) and one less (the rest of them); every other fitting node scores from 1 to
    two less, linearly in its rise, so the extender's weight still separates good from poor
    placements, not only the best.
    """
    deltas: dict[int, float] = {}
    low = high = 0.0
    first = True
    for free in frees:
        if free is None or free < want or free in deltas:
            continue
        delta = fragment_delta(free, want, sizes)
        deltas[free] = delta
        if first:
            low = high = delta
            first = False
        elif delta < low:
            low = delta
        elif delta > high:
            high = delta
    if first or high - low <= _SAME:
        return None
    best_left = min(free - want for free, delta in deltas.items() if delta - low <= _SAME)
    span = high - low
    out: list[int] = []
    append = out.append
    for free in frees:
        if free is None or free < want:
            append(0)
            continue
        delta = deltas[free]
        if delta - low <= _SAME:
            append(max_score if free - want == best_left else max_score - 1)
        else:
            append(1 + min(max_score - 3, int((max_score - 2) * (high - delta) / span)))
    return out


__all__ = [
    "DEFAULT_HALF_LIFE",
    "RequestMix",
    "Sizes",
    "Workload",
    "expected_fragment",
    "fragment_delta",
    "fragmentation_scores",
    "tail",
]
