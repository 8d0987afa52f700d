"""Finishes over time in fixed memory: throughput buckets over a run's span,
and the recent rate that an ETA is computed from.

Both take finish times in any order (the archive is in completion order, a
carried-over attempt may be older than the journal around it), and both
keep a bounded number of counters however many finishes they see.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import truediv
from typing import TYPE_CHECKING, Protocol, cast

from statequeue.core.recent_rate import rate_span
from statequeue.core.records import Record
from statequeue.stats.attempts import AttemptBatch, attempts_of, batches_of

if TYPE_CHECKING:
    from statequeue.stats.figures import StatsBuilder

MAX_BUCKETS = 120
"""At most this many throughput buckets: wider ones (merged in pairs) for longer runs."""
FIRST_BUCKET_SECONDS = 60.0
RATE_WINDOW_SECONDS = 600.0
"""The ETA's rate is the finishes of the last 10 minutes (since the work they
count began, when that is shorter)."""


@dataclass(frozen=True)
class ThroughputView:
    """Finishes per bucket, oldest first, from ``start`` (epoch seconds)."""

    start: float | None
    bucket_seconds: float
    counts: tuple[int, ...]

    def per_minute(self) -> list[float]:
        scale = 60.0 / self.bucket_seconds
        return [n * scale for n in self.counts]


class Throughput:
    """Finishes counted in buckets of ``width`` seconds; when the span needs
    more than ``MAX_BUCKETS``, the width doubles and neighbours merge."""

    def __init__(self, width: float = FIRST_BUCKET_SECONDS, limit: int = MAX_BUCKETS) -> None:
        self.width = width
        self.limit = limit
        self.counts: dict[int, int] = {}
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, at: float) -> None:
        key = math.floor(at / self.width)
        lo, hi = self.lo, self.hi
        if lo is None or hi is None:
            self.lo = self.hi = key
        elif key < lo:
            self.lo = key
        elif key > hi:
            self.hi = key
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        if self.hi - self.lo >= self.limit:  # type: ignore[operator]
            self._coarsen()

    def add_many(self, times: Sequence[float]) -> None:
        if not times:
            return
        found = Counter(map(math.floor, map(truediv, times, repeat(self.width))))
        lo, hi = min(found), max(found)
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        counts = self.counts
        for key, n in found.items():
            counts[key] = counts.get(key, 0) + n
        if self.hi - self.lo >= self.limit:
            self._coarsen()

    def merge(self, other: Throughput) -> None:
        """Add ``other``'s counts. Widths are the first one doubled some times,
        and a key at twice the width is ``key // 2``, so both go to the wider
        one and then coarsen as one pass over every finish would have."""
        if other.lo is None or other.hi is None:
            return
        counts, lo, hi = other.counts, other.lo, other.hi
        while self.width < other.width:
            self._halve()
        factor = round(self.width / other.width)
        if factor > 1:
            merged: dict[int, int] = {}
            for key, n in counts.items():
                merged[key // factor] = merged.get(key // factor, 0) + n
            counts, lo, hi = merged, lo // factor, hi // factor
        for key, n in counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        self._coarsen()

    def _halve(self) -> None:
        merged: dict[int, int] = {}
        for key, n in self.counts.items():
            merged[key // 2] = merged.get(key // 2, 0) + n
        self.counts = merged
        self.width *= 2
        if self.lo is not None and self.hi is not None:
            self.lo //= 2
            self.hi //= 2

    def _coarsen(self) -> None:
        # Keys are floor(at / width): floor(key / 2) is the key at twice the width.
        while self.lo is not None and self.hi is not None and self.hi - self.lo >= self.limit:
            self._halve()

    def view(self) -> ThroughputView:
        if self.lo is None or self.hi is None:
            return ThroughputView(None, self.width, ())
        counts = tuple(self.counts.get(k, 0) for k in range(self.lo, self.hi + 1))
        return ThroughputView(self.lo * self.width, self.width, counts)


class RecentRate:
    """Finishes per second over the last ``window`` seconds, from per-second
    counts (at most ``window`` of them are kept), measured since the work
    they count began (``core.recent_rate``): beside each second's count, the
    earliest start (end less duration) of the attempts that finished in it."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self.seconds: dict[int, int] = {}
        self.began: dict[int, float] = {}
        """Per finish second within a window of the newest (``_prune_began``):
        the earliest start of the attempts finished in it."""
        self.first: float | None = None
        self.newest = -math.inf

    def add(self, at: float, duration: float | None = None) -> None:
        self.add_many([at], [duration])

    def add_many(
        self, times: Sequence[float], durations: Sequence[float | None] | None = None
    ) -> None:
        """Fold finishes at ``times``, their attempts' ``durations`` beside them
        (None: unknown, the attempt counts as begun when it ended)."""
        if not times:
            return
        first = min(times)
        if self.first is None or first < self.first:
            self.first = first
        seconds = self.seconds
        for second, n in Counter(map(math.floor, times)).items():
            seconds[second] = seconds.get(second, 0) + n
        self.newest = max(self.newest, math.floor(max(times)))
        # Starts only for what a window ending at the newest can hold (C-level
        # filter: an archive's old finishes cost no Python step each).
        self._prune_began()
        cut = float(math.ceil(self.newest - self.window))  # floor(at) >= newest - window
        pairs = zip(times, durations if durations is not None else repeat(None), strict=False)
        for at, dur in compress(pairs, map(cut.__le__, times)):
            began = at - dur if dur is not None and dur > 0 else at
            second = math.floor(at)
            known = self.began.get(second)
            if known is None or began < known:
                self.began[second] = began
        if len(seconds) > 2 * self.window:
            self._prune(self.newest)

    def merge(self, other: RecentRate) -> None:
        """Add ``other``'s per-second counts (what folding its finishes here would keep)."""
        if other.first is None:
            return
        if self.first is None or other.first < self.first:
            self.first = other.first
        seconds = self.seconds
        for second, n in other.seconds.items():
            seconds[second] = seconds.get(second, 0) + n
        for second, began in other.began.items():
            known = self.began.get(second)
            if known is None or began < known:
                self.began[second] = began
        self.newest = max(self.newest, other.newest)
        self._prune_began()
        if len(seconds) > 2 * self.window:
            self._prune(self.newest)

    def _prune_began(self) -> None:
        """Keep the starts of the seconds within a window of the newest, all of
        them and only them (whatever the order finishes were folded or merged in)."""
        cut = self.newest - self.window
        for second in [s for s in self.began if s < cut]:
            del self.began[second]

    def _prune(self, now: float) -> None:
        oldest = math.floor(now) - self.window
        for second in [s for s in self.seconds if s <= oldest]:
            del self.seconds[second]
            self.began.pop(second, None)

    def count(self, now: float) -> int:
        """Finishes in the window that ends at ``now`` (whole seconds)."""
        oldest = math.floor(now) - self.window
        return sum(n for s, n in self.seconds.items() if oldest < s <= now)

    def span(self, now: float) -> float:
        """The seconds the rate is measured over (``core.recent_rate.rate_span``):
        the window, or the time since the work finished in it began when that is
        shorter (the earliest start among its attempts, not the first finish).
        What a rate line names: a 3 s run was not measured "over the last 10m00s".
        With no finish in the window: since the first finish, as before any."""
        if self.first is None:
            return self.window
        oldest = math.floor(now) - self.window
        began = min(
            (self.began.get(s, float(s)) for s in self.seconds if oldest < s <= now),
            default=self.first,
        )
        return rate_span(max(began, now - self.window), now, self.window)

    def rate(self, now: float) -> float | None:
        """Finishes per second over ``span(now)``; None before any finish."""
        if self.first is None:
            return None
        return self.count(now) / self.span(now)


def finished_of(b: AttemptBatch) -> tuple[list[float], list[float | None]]:
    """When the attempts of ``b`` that finished their item ended (all but those
    a retry follows: the item is pending again), what rates and ETAs count,
    and the durations of those attempts beside them."""
    if "pending" not in b.state and None not in b.ended_at:
        return cast(list[float], list(b.ended_at)), list(b.duration)  # no None: checked in C
    rows = zip(b.ended_at, b.state, b.duration, strict=True)
    kept = [(at, dur) for at, state, dur in rows if at is not None and state != "pending"]
    return [at for at, _ in kept], [dur for _, dur in kept]


class EventSource(Protocol):
    """What ``LiveRate`` reads from a store. Declared here, not taken from
    ``store.base.Store`` (which has it): stats/ sits below store/."""

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        """Records written since ``cursor`` (None: from the start) and the new cursor."""
        ...

    def stats_summary(self) -> StatsBuilder | None:
        """The store's `stats` summary, when it keeps one (else None)."""
        ...


class LiveRate:
    """The recent rate of a queue that is running: what `status --watch` shows,
    the same figure `stats` gives at that moment.

    A store that keeps a summary of every finished attempt (the journal
    store's ``stats_summary``: cached, extended by the records since) gives
    it from that summary, the very one `stats` builds on: a compaction, which
    moves finished items to the archive, changes nothing. Other stores fold
    their new events (``read_events``), each update only what was written
    since the last."""

    MAX_PAGES = 50  # per update: a long backlog is caught up over several

    def __init__(self, store: EventSource, window: float = RATE_WINDOW_SECONDS) -> None:
        self.store = store
        self.recent = RecentRate(window)
        self.cursor: object | None = None

    def update(self) -> None:
        summary = self.store.stats_summary()
        if summary is not None:  # as Queue.stats does, without --since
            self.recent = summary.recent
            return
        for _ in range(self.MAX_PAGES):
            records, self.cursor = self.store.read_events(self.cursor)
            if not records:
                return
            # Only the attempts' own records: after a compaction the events
            # start again from the snapshot, whose items carry earlier attempts.
            ended = [r for r in records if r.get("t") in ("end", "intr")]
            for batch in batches_of(attempts_of(ended)):
                self.recent.add_many(*finished_of(batch))

    def rate(self, now: float) -> float | None:
        """Items finished per second over the window, as ``Stats.rate``."""
        return self.recent.rate(now)
