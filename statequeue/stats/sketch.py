"""A fixed-memory quantile sketch: log-spaced buckets with a relative error bound.

It is DDSketch's idea (Masson, Rim, Lee, VLDB 2019) in its simplest form: a
value ``x > 0`` goes to bucket ``ceil(log(x) / log(gamma))`` with
``gamma = (1 + alpha) / (1 - alpha)``, and a bucket is read back as the value
``2 * gamma**k / (gamma + 1)``, which is within ``alpha`` (relative) of every
value the bucket holds. A quantile read from the bucket that holds the rank
is therefore within ``alpha`` of the exact quantile of the values added.

Memory depends on the range of the values, not on how many: with ``alpha``
1% and durations from 1 microsecond to 11 days (the range kept; values
outside it are clamped, and the exact min and max are tracked apart) it is
at most ~1,400 buckets, whether 10 or 10 million values were added.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import mul

ALPHA = 0.01
"""Relative error of every quantile the sketch returns (1%)."""
MIN_VALUE = 1e-6
"""Values at or below this (zero durations) share one bucket, read back as 0."""
MAX_VALUE = 1e6


class QuantileSketch:
    """Counts of values in log-spaced buckets; quantiles within ``alpha``."""

    __slots__ = ("_inv_log_gamma", "alpha", "buckets", "count", "gamma", "max", "min", "total")

    def __init__(self, alpha: float = ALPHA) -> None:
        if not 0 < alpha < 1:
            raise ValueError("alpha must be between 0 and 1")
        self.alpha = alpha
        self.gamma = (1 + alpha) / (1 - alpha)
        self._inv_log_gamma = 1 / math.log(self.gamma)
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def key(self, value: float) -> int:
        """The bucket of ``value`` (the zero bucket is the smallest key)."""
        if value <= MIN_VALUE:
            return self._zero_key()
        return math.ceil(math.log(min(value, MAX_VALUE)) * self._inv_log_gamma)

    def _zero_key(self) -> int:
        return math.ceil(math.log(MIN_VALUE) * self._inv_log_gamma) - 1

    def add(self, value: float) -> None:
        """Count one value."""
        key = self.key(value)
        buckets = self.buckets
        buckets[key] = buckets.get(key, 0) + 1
        self.count += 1
        self.total += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def add_many(self, values: Sequence[float]) -> None:
        """Count every value in ``values`` (one C-level count per bucket, not
        a Python step per value beyond finding its bucket)."""
        if not values:
            return
        inv, log, ceil = self._inv_log_gamma, math.log, math.ceil
        low, high = min(values), max(values)
        keys: Iterable[int]
        if low > MIN_VALUE and high < MAX_VALUE:  # the usual case: map() runs in C
            keys = map(ceil, map(mul, map(log, values), repeat(inv)))
        else:
            zero = self._zero_key()
            keys = [
                ceil(log(v if v < MAX_VALUE else MAX_VALUE) * inv) if v > MIN_VALUE else zero
                for v in values
            ]
        buckets = self.buckets
        for key, n in Counter(keys).items():
            buckets[key] = buckets.get(key, 0) + n
        self.count += len(values)
        self.total += sum(values)
        self.min = min(self.min, low)
        self.max = max(self.max, high)

    def merge(self, other: QuantileSketch) -> None:
        """Add every value ``other`` counted (both must have the same ``alpha``)."""
        if other.alpha != self.alpha:
            raise ValueError("cannot merge sketches with different alpha")
        for key, n in other.buckets.items():
            self.buckets[key] = self.buckets.get(key, 0) + n
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def value_of(self, key: int) -> float:
        """The value bucket ``key`` stands for (within ``alpha`` of all it holds)."""
        if key <= self._zero_key():
            return 0.0
        return 2 * self.gamma**key / (self.gamma + 1)

    def quantile(self, q: float) -> float | None:
        """The value of nearest rank ``ceil(q * count)``, within ``alpha``
        (relative) of the exact one; clamped to the exact min and max. None
        when empty."""
        if not self.count:
            return None
        if not 0 <= q <= 1:
            raise ValueError("q must be between 0 and 1")
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen >= rank:
                return min(max(self.value_of(key), self.min), self.max)
        return self.max  # not reached: the counts add up to ``count``

    def iter_bucket_ranges(self) -> Iterator[tuple[float, float, int]]:
        """(value, largest value it holds, count) of each non-empty bucket,
        smallest first; 0, 0 for the zero bucket."""
        zero = self._zero_key()
        for key in sorted(self.buckets):
            top = 0.0 if key <= zero else self.gamma**key
            yield self.value_of(key), top, self.buckets[key]

    def iter_buckets(self) -> Iterator[tuple[float, int]]:
        """(value, count) of each non-empty bucket, smallest first."""
        for key in sorted(self.buckets):
            yield self.value_of(key), self.buckets[key]
