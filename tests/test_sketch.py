"""The quantile sketch `stats` uses: within its stated error, in fixed memory."""

from __future__ import annotations

import math
import random

import pytest

from statequeue.stats.sketch import ALPHA, QuantileSketch


def _exact(values: list[float], q: float) -> float:
    """The nearest-rank quantile: the sketch's definition."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@pytest.mark.parametrize(
    "draw",
    [
        lambda r: r.lognormvariate(0, 2),  # durations: heavy tail, many decades
        lambda r: r.uniform(0.5, 1.5),  # narrow
        lambda r: r.expovariate(1 / 30),
    ],
    ids=["lognormal", "uniform", "exponential"],
)
def test_quantiles_are_within_the_stated_relative_error(draw: object) -> None:
    rng = random.Random(15)
    values = [draw(rng) for _ in range(20_000)]  # type: ignore[operator]
    sketch = QuantileSketch()
    for v in values:
        sketch.add(v)
    for q in (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0):
        exact = _exact(values, q)
        got = sketch.quantile(q)
        assert got is not None
        assert abs(got - exact) <= ALPHA * exact + 1e-12, (q, got, exact)
    assert sketch.count == len(values)
    assert sketch.max == max(values) and sketch.min == min(values)


def test_memory_depends_on_the_range_not_the_count() -> None:
    sketch = QuantileSketch()
    rng = random.Random(1)
    for _ in range(200_000):
        sketch.add(10 ** rng.uniform(-6, 6))  # a microsecond to 11 days
    # log(1e12) / log((1 + a) / (1 - a)) buckets at most, plus the zero bucket.
    bound = math.ceil(math.log(1e12) / math.log((1 + ALPHA) / (1 - ALPHA))) + 2
    assert len(sketch.buckets) <= bound < 1500


def test_zero_durations_and_an_empty_sketch() -> None:
    sketch = QuantileSketch()
    assert sketch.quantile(0.5) is None
    for _ in range(3):
        sketch.add(0.0)
    sketch.add(2.0)
    assert sketch.quantile(0.5) == 0.0
    assert sketch.quantile(1.0) == pytest.approx(2.0, rel=ALPHA)


def test_merged_sketches_answer_as_one() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(1, 1) for _ in range(5000)]
    a, b, whole = QuantileSketch(), QuantileSketch(), QuantileSketch()
    for i, v in enumerate(values):
        (a if i % 2 else b).add(v)
        whole.add(v)
    a.merge(b)
    assert a.buckets == whole.buckets
    assert a.quantile(0.9) == whole.quantile(0.9)
