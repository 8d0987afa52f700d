"""Folds finished attempts into the report's figures (``report_model``).

The timeline needs every attempt's start, end and runner, so unlike `stats`
(whose summary is bounded) this keeps one row per attempt, in typed arrays
(about 33 bytes an attempt: 33 MB for a million), and derives everything at
``build`` once the run's span is known: throughput buckets, log-spaced
duration bins, exact quantiles, and a downsampled timeline that keeps the
outliers. Each step is a C-level pass or one comprehension per column, never
an object per attempt.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import compress
from typing import Any

from statequeue.stats.attempts import Attempt, AttemptBatch, within_limits
from statequeue.stats.figures import MAX_GROUPS, OTHER, normalise_reason
from statequeue.stats.report_model import (
    DONE,
    FAILED,
    HELD,
    INTERRUPTED,
    KIND_NAMES,
    RETRIED,
    AttemptFigures,
    Bar,
    DurationHistogram,
    FailureGroup,
    ItemRow,
    Throughput,
    Timeline,
)

TIMELINE_LIMIT = 3000
"""Past this many attempts the timeline is downsampled."""
TIMELINE_OUTLIERS = 300
"""The slowest attempts the timeline always keeps."""
TIMELINE_UNSUCCESSFUL = 700
"""Unsuccessful attempts (failed, retried, interrupted, held) it keeps, at most."""
MAX_SLOTS = 64
"""Lanes one runner gets at most; past them an attempt shares the lane that freed first."""
TOP_ROWS = 10
EXAMPLES = 3
INTERRUPTED_KEPT = 50
THROUGHPUT_BUCKETS = 100
_NICE_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)
_STATE_KIND = {"done": DONE, "failed": FAILED, "pending": RETRIED, "held": HELD}
_UNKNOWN = -1.0
"""The duration of an attempt whose record gives none."""


class ReportFold:
    """Keeps every finished attempt's row; ``build`` gives ``AttemptFigures``."""

    def __init__(self, *, cutoff: float | None = None) -> None:
        self.cutoff = cutoff
        self.end = array("d")
        self.dur = array("d")
        self.item = array("q")
        self.attempt = array("l")
        self.runner = array("l")
        self.kind = array("b")
        self.kinds = [0] * len(KIND_NAMES)
        self.runner_ids: dict[str, int] = {}
        self.hosts: dict[str, str] = {}
        self.reasons: dict[str, list[Any]] = {}  # reason -> [count, first, last, ids]
        self.retried: dict[int, int] = {}  # item id -> its highest attempt (>= 2)
        self.interrupted: list[tuple[float, int, int]] = []
        self.interrupted_total = 0
        self.undated = 0

    def add_all(self, batches: Iterable[AttemptBatch]) -> None:
        for batch in batches:
            self.add_batch(batch)

    def add_batch(self, b: AttemptBatch) -> None:
        b = within_limits(b)
        if self.cutoff is not None:
            b = _ended_since(b, self.cutoff)
        if not b.item_id:
            return
        crashed = {(a.item_id, a.attempt) for a in b.failures if a.interrupted}
        kinds = [
            DONE if ok else _kind_of(state, (i, n), crashed)
            for ok, state, i, n in zip(b.ok, b.state, b.item_id, b.attempt, strict=True)
        ]
        for k, count in Counter(kinds).items():
            self.kinds[k] += count
        for a in b.failures:
            self._add_failure(a)
        if max(b.attempt) >= 2:
            for i, n in zip(b.item_id, b.attempt, strict=True):
                if n >= 2 and n > self.retried.get(i, 0):
                    self.retried[i] = n
        self._add_rows(b, kinds)

    def _add_rows(self, b: AttemptBatch, kinds: list[int]) -> None:
        ends, keep = b.ended_at, None
        if None in ends:  # an attempt with no end time has no place in time
            keep = [e is not None for e in ends]
            self.undated += keep.count(False)

        def column(values: Sequence[Any]) -> Iterable[Any]:
            return values if keep is None else compress(values, keep)

        ids = self.runner_ids
        for runner, host in zip(b.runner, b.host, strict=True):
            if host and runner and runner not in self.hosts:
                self.hosts[runner] = host
        self.end.extend(column(ends))
        self.dur.extend(_UNKNOWN if d is None else d for d in column(b.duration))
        self.item.extend(column(b.item_id))
        self.attempt.extend(column(b.attempt))
        self.runner.extend(ids.setdefault(r or "", len(ids)) for r in column(b.runner))
        self.kind.extend(column(kinds))

    def _add_failure(self, a: Attempt) -> None:
        reason = normalise_reason(a)
        group = self.reasons.get(reason)
        if group is None:
            if len(self.reasons) >= MAX_GROUPS:
                reason = OTHER
                group = self.reasons.get(reason)
            if group is None:
                group = self.reasons[reason] = [0, None, None, []]
        group[0] += 1
        at = a.ended_at
        if at is not None:
            group[1] = at if group[1] is None else min(group[1], at)
            group[2] = at if group[2] is None else max(group[2], at)
        ids: list[int] = group[3]
        if a.item_id not in ids:
            ids.append(a.item_id)
            ids.sort()
            del ids[EXAMPLES:]
        if a.interrupted:
            self.interrupted_total += 1
            self.interrupted.append((at or 0.0, a.item_id, a.attempt))
            if len(self.interrupted) > 4 * INTERRUPTED_KEPT:  # keep the latest ones
                self.interrupted = heapq.nlargest(INTERRUPTED_KEPT, self.interrupted)

    def build(self) -> AttemptFigures:
        n = len(self.end)
        starts = array(
            "d", (e - d if d > 0 else e for e, d in zip(self.end, self.dur, strict=True))
        )
        first = min(starts) if n else None
        last = max(self.end) if n else None
        names = {i: r for r, i in self.runner_ids.items()}
        per_runner = Counter(self.runner)
        runners = tuple(
            (names[i], self.hosts.get(names[i], ""), count)
            for i, count in sorted(per_runner.items(), key=lambda kv: (-kv[1], names[kv[0]]))
        )
        return AttemptFigures(
            attempts=sum(self.kinds),
            first_start=first,
            last_end=last,
            kinds=tuple(self.kinds),
            runners=runners,
            throughput=self._throughput(first, last),
            timeline=self._timeline(starts, names),
            histogram=self._histogram(),
            failures=self._failures(),
            slowest=self._slowest(),
            most_retried=tuple(
                ItemRow(-neg_id, n, float(n))
                for n, neg_id in heapq.nlargest(
                    TOP_ROWS, ((n, -i) for i, n in self.retried.items())
                )
            ),
            interrupted=tuple(
                ItemRow(i, n, at) for at, i, n in heapq.nlargest(INTERRUPTED_KEPT, self.interrupted)
            ),
            interrupted_total=self.interrupted_total,
        )

    def _throughput(self, first: float | None, last: float | None) -> Throughput | None:
        if first is None or last is None:
            return None
        lo = math.floor(first)
        width = float(_nice_width((last - lo) / THROUGHPUT_BUCKETS))
        buckets = int((last - lo) // width) + 1
        found = Counter(
            int((e - lo) // width) * 8 + k for e, k in zip(self.end, self.kind, strict=True)
        )
        rows = [[0] * buckets for _ in KIND_NAMES]
        for key, count in found.items():
            rows[key % 8][min(key // 8, buckets - 1)] += count
        return Throughput(float(lo), width, tuple(tuple(r) for r in rows))

    def _histogram(self) -> DurationHistogram:
        done = sorted(compress(self.dur, (k == DONE for k in self.kind)))
        done = done[_first_known(done) :]
        known = [d for d in self.dur if d > 0]
        if not known:
            return DurationHistogram((), (), (), _quantiles(done))
        low = math.floor(math.log10(min(known)))
        high = max(math.ceil(math.log10(max(known))), low + 1)
        steps = max(1, min(10, 40 // (high - low)))
        edges = tuple(10.0 ** (low + j / steps) for j in range((high - low) * steps + 1))
        bins = len(edges) - 1
        found = Counter(
            _bin_of(d, low, steps, bins) * 2 + (k != DONE)
            for d, k in zip(self.dur, self.kind, strict=True)
            if d >= 0
        )
        counts = [[0] * bins, [0] * bins]
        for key, count in found.items():
            counts[key % 2][key // 2] += count
        return DurationHistogram(edges, tuple(counts[0]), tuple(counts[1]), _quantiles(done))

    def _failures(self) -> tuple[FailureGroup, ...]:
        groups = (
            FailureGroup(reason, n, tuple(ids), first, last)
            for reason, (n, first, last, ids) in self.reasons.items()
        )
        return tuple(sorted(groups, key=lambda g: (-g.count, g.reason)))

    def _slowest(self) -> tuple[ItemRow, ...]:
        top = heapq.nlargest(TOP_ROWS, range(len(self.dur)), key=self.dur.__getitem__)
        return tuple(
            ItemRow(self.item[i], self.attempt[i], self.dur[i], state=KIND_NAMES[self.kind[i]])
            for i in top
            if self.dur[i] >= 0
        )

    def _timeline(self, starts: array[float], names: dict[int, str]) -> Timeline:
        n = len(self.end)
        shown = sorted(_sampled(self.dur, self.kind), key=starts.__getitem__)
        lanes: list[str] = []
        free: dict[int, list[tuple[float, int]]] = {}  # runner -> heap of (free at, lane)
        bars = []
        for i in shown:
            runner = self.runner[i]
            heap = free.setdefault(runner, [])
            if heap and (heap[0][0] <= starts[i] or len(heap) >= MAX_SLOTS):
                lane = heapq.heappop(heap)[1]
            else:
                lane = len(lanes)
                lanes.append(f"{names[runner] or '?'} #{len(heap) + 1}")
            heapq.heappush(heap, (self.end[i], lane))
            bars.append(
                Bar(lane, starts[i], self.end[i], self.item[i], self.attempt[i], self.kind[i])
            )
        return Timeline(tuple(lanes), tuple(bars), n, len(bars))


def _kind_of(state: str, key: tuple[int, int], crashed: set[tuple[int, int]]) -> int:
    if key in crashed:
        return INTERRUPTED
    return _STATE_KIND.get(state, FAILED)


def _sampled(dur: array[float], kind: array[int]) -> Iterable[int]:
    """Indices of the attempts the timeline shows: all of them up to
    ``TIMELINE_LIMIT``; past it the slowest, the unsuccessful ones (up to a
    cap) and an even stride through the rest."""
    n = len(dur)
    if n <= TIMELINE_LIMIT:
        return range(n)
    keep = set(heapq.nlargest(TIMELINE_OUTLIERS, range(n), key=dur.__getitem__))
    unsuccessful = list(compress(range(n), kind))
    step = max(1, len(unsuccessful) // TIMELINE_UNSUCCESSFUL)
    keep.update(unsuccessful[::step][:TIMELINE_UNSUCCESSFUL])
    rest = TIMELINE_LIMIT - len(keep)
    if rest > 0:
        keep.update(range(0, n, math.ceil(n / rest)))
    return keep


def _nice_width(seconds: float) -> int:
    for width in _NICE_SECONDS:
        if width >= seconds:
            return width
    return math.ceil(seconds / 86400) * 86400


def _bin_of(d: float, low: int, steps: int, bins: int) -> int:
    if d <= 0:
        return 0
    return min(max(int((math.log10(d) - low) * steps), 0), bins - 1)


def _first_known(values: list[float]) -> int:
    """The index of the first value that is not ``_UNKNOWN`` in sorted ``values``."""
    for i, d in enumerate(values):
        if d >= 0:
            return i
    return len(values)


def _quantiles(ordered: list[float]) -> dict[str, float | None]:
    """Nearest-rank p50, p90, p99 of sorted ``ordered``."""
    n = len(ordered)
    return {
        f"p{p}": ordered[max(1, math.ceil(p / 100 * n)) - 1] if n else None for p in (50, 90, 99)
    }


def _ended_since(b: AttemptBatch, cutoff: float) -> AttemptBatch:
    keep = [at is not None and at >= cutoff for at in b.ended_at]
    if all(keep):
        return b
    failures = [a for a in b.failures if a.ended_at is not None and a.ended_at >= cutoff]
    columns: list[Any] = [list(compress(column, keep)) for column in b[:-1]]
    return AttemptBatch._make([*columns, failures])
