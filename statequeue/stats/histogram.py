"""The duration histogram `stats` shows: a quantile sketch's counts in a
few bins with round edges."""

from __future__ import annotations

from bisect import bisect_right

from statequeue.stats.sketch import QuantileSketch

_NICE = (1.0, 2.0, 5.0)
MAX_BINS = 12


def histogram(sketch: QuantileSketch) -> tuple[tuple[float, float, int], ...]:
    """The sketch's counts in at most ``MAX_BINS`` bins with round edges
    (1-2-5 steps, or powers of ten for a wide range), plus a first bin from 0
    when some durations were 0. Bins are ``[from, to)``. A bucket is binned
    by the largest value it can hold, so a duration at or past an edge is
    never counted below it (a `sleep 5` or a 5 s timeout lands in 5 s-10 s);
    one up to 1% below an edge may be counted in the bin above."""
    if not sketch.count:
        return ()
    found = list(sketch.iter_bucket_ranges())
    positive = [top for value, top, _ in found if value > 0]
    edges = _edges(min(positive), max(positive[-1], sketch.max)) if positive else []
    if not positive or found[0][0] == 0:
        edges = [0.0, *(edges or [1e-6])]
    counts = [0] * (len(edges) - 1)
    for _, top, n in found:
        # gamma**key can come out a hair under the round value it stands for.
        i = min(max(bisect_right(edges, top * _ROUNDING) - 1, 0), len(counts) - 1)
        counts[i] += n
    return tuple((edges[i], edges[i + 1], n) for i, n in enumerate(counts))


_ROUNDING = 1 + 1e-12


def _edges(lo: float, hi: float) -> list[float]:
    for steps in (_NICE, (1.0,), None):
        edges = _series(lo, hi, steps)
        if len(edges) - 1 <= MAX_BINS:
            return edges
    return [lo, hi]


def _series(lo: float, hi: float, steps: tuple[float, ...] | None) -> list[float]:
    """Round values from the last one <= ``lo`` to the first one > ``hi``."""
    if steps is None:  # every other power of ten
        values = [10.0**e for e in range(-6, 8, 2)]
    else:
        values = [m * 10.0**e for e in range(-6, 7) for m in steps]
    below = [v for v in values if v <= lo]
    start = below[-1] if below else values[0]
    edges = [v for v in values if start <= v <= hi]
    above = [v for v in values if v > hi]
    edges.append(above[0] if above else hi)
    return edges
