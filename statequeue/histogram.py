"""The duration histogram `stats` shows: a quantile sketch's counts in a
few bins with round edges."""

from __future__ import annotations

from bisect import bisect_right

from statequeue.sketch import QuantileSketch

_NICE = (1.0, 2.0, 5.0)
MAX_BINS = 12


def histogram(sketch: QuantileSketch) -> tuple[tuple[float, float, int], ...]:
    """The sketch's counts in at most ``MAX_BINS`` bins with round edges
    (1-2-5 steps, or powers of ten for a wide range), plus a first bin from 0
    when some durations were 0. A value is binned by its bucket's value, so a
    count near an edge may be off by that 1%."""
    if not sketch.count:
        return ()
    found = list(sketch.iter_buckets())
    positive = [value for value, _ in found if value > 0]
    edges = _edges(min(positive), max(positive[-1], sketch.max)) if positive else []
    if not positive or found[0][0] == 0:
        edges = [0.0, *(edges or [1e-6])]
    counts = [0] * (len(edges) - 1)
    for value, n in found:
        i = min(max(bisect_right(edges, value) - 1, 0), len(counts) - 1)
        counts[i] += n
    return tuple((edges[i], edges[i + 1], n) for i, n in enumerate(counts))


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
