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
import operator
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import compress, pairwise
from typing import Any, cast

from statequeue.stats.attempts import Attempt, AttemptBatch, ended_since, within_limits
from statequeue.stats.figures import MAX_GROUPS, OTHER, QUANTILES, normalise_reason
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
from statequeue.stats.sketch import QuantileSketch

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

    def __init__(self, *, cutoff: float | None = None, now: float | None = None) -> None:
        self.cutoff = cutoff
        self.now = now
        """The report's time: attempts in flight (no end known) run to it (None: the build's)."""
        self.end = array("d")
        self.dur = array("d")
        self.item = array("q")
        self.attempt = array("i")
        self.runner = array("i")
        self.kind = array("b")
        self.kinds = [0] * len(KIND_NAMES)
        self.runner_ids: dict[str, int] = {}
        self.hosts: dict[str, str] = {}
        self.reasons: dict[str, list[Any]] = {}  # reason -> [count, first, last, ids]
        self.retried: dict[int, int] = {}  # item id -> its highest attempt (>= 2)
        self.interrupted: list[tuple[float, int, int, float]] = []  # (end, id, attempt, start)
        self.crash_start: dict[tuple[int, int], float] = {}
        """(id, attempt) -> start of each interrupted attempt whose start is known."""
        self.interrupted_total = 0
        self.in_flight: list[tuple[float, int, int, str]] = []  # (start, id, attempt, runner)
        self.in_flight_total = 0
        self.in_flight_held: set[int] = set()  # still run by processes of a dead runner
        self.undated = 0
        self.done_sketch = QuantileSketch()
        self.other_sketch = QuantileSketch()
        """Durations of done and of other attempts, as `stats` sketches them."""

    def add_all(self, batches: Iterable[AttemptBatch]) -> None:
        for batch in batches:
            self.add_batch(batch)

    def add_batch(self, b: AttemptBatch) -> None:
        b = within_limits(b)
        if self.cutoff is not None:
            b = ended_since(b, self.cutoff)
        if not b.item_id:
            return
        kinds = self._kinds(b)
        for a in b.failures:
            self._add_failure(a)
        if max(b.attempt) >= 2:
            retried = self.retried
            for i, n in [(i, n) for i, n in zip(b.item_id, b.attempt, strict=True) if n >= 2]:
                if n > retried.get(i, 0):
                    retried[i] = n
        self._add_rows(b, kinds)

    def _kinds(self, b: AttemptBatch) -> bytearray:
        """Each attempt's kind: done unless not ok (few: a Python step each)."""
        kinds = bytearray(len(b.ok))  # DONE is 0
        crashed = {(a.item_id, a.attempt) for a in b.failures if a.interrupted}
        unsuccessful = 0
        for pos in compress(range(len(b.ok)), map(operator.not_, b.ok)):
            unsuccessful += 1
            key = (b.item_id[pos], b.attempt[pos])
            kind = INTERRUPTED if key in crashed else _STATE_KIND.get(b.state[pos], FAILED)
            kinds[pos] = kind
            self.kinds[kind] += 1
        self.kinds[DONE] += len(kinds) - unsuccessful
        return kinds

    def _add_rows(self, b: AttemptBatch, kinds: bytearray) -> None:
        ends, keep = b.ended_at, None
        if None in ends:  # an attempt with no end time has no place in time
            keep = [e is not None for e in ends]
            self.undated += keep.count(False)

        def column(values: Sequence[Any]) -> Iterable[Any]:
            return values if keep is None else compress(values, keep)

        named = set(compress(b.runner, b.host)) - self.hosts.keys()  # runners new here
        for runner in named:
            if runner:  # its first row that names a host (C-level searches)
                at = b.runner.index(runner)
                while not b.host[at]:
                    at = b.runner.index(runner, at + 1)
                self.hosts[runner] = str(b.host[at])
        ids = self.runner_ids
        runners = [r or "" for r in b.runner] if None in b.runner else b.runner
        for runner in set(runners):
            ids.setdefault(runner or "", len(ids))
        durations = cast(Sequence[float], b.duration)  # no None: checked in C
        if None in b.duration:
            durations = [_UNKNOWN if d is None else d for d in b.duration]
        done = list(compress(durations, map(operator.not_, kinds)))
        other = list(compress(durations, kinds))
        for sketch, values in ((self.done_sketch, done), (self.other_sketch, other)):
            sketch.add_many(values if _UNKNOWN not in values else [d for d in values if d >= 0])
        self.end.extend(column(ends))
        self.dur.extend(column(durations))
        self.item.extend(column(b.item_id))
        self.attempt.extend(column(b.attempt))
        self.runner.extend(map(ids.__getitem__, column(runners)))
        self.kind.extend(column(kinds))

    def add_in_flight(
        self,
        item_id: int,
        attempt: int,
        runner: str,
        started_at: float | None,
        host: str = "",
        *,
        held: bool = False,
    ) -> None:
        """An attempt in flight when its runner died, not recovered yet (no
        attempt ended it): shown apart, and in the timeline from its start to
        the report's time (``now``); its runner (on ``host``) counts it.
        ``held``: processes of the attempt still run and hold its claim
        (``Status.held_by_dead_runner``): its state is shown as orphaned."""
        self.in_flight_total += 1
        if held:
            self.in_flight_held.add(item_id)
        if host and runner:
            self.hosts.setdefault(runner, host)
        if started_at is not None and attempt > 0:
            self.in_flight.append((started_at, item_id, attempt, runner))

    def _in_flight_state(self, item_id: int) -> str:
        """The state column of an attempt in flight: as `list` says it."""
        return "orphaned" if item_id in self.in_flight_held else "running"

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
            started = math.nan if a.started_at is None else a.started_at
            if a.started_at is not None and (at is None or a.started_at <= at):
                self.crash_start[(a.item_id, a.attempt)] = a.started_at
            self.interrupted.append((at or 0.0, a.item_id, a.attempt, started))
            if len(self.interrupted) > 4 * INTERRUPTED_KEPT:  # keep the latest ones
                self.interrupted = heapq.nlargest(INTERRUPTED_KEPT, self.interrupted)

    def build(self) -> AttemptFigures:
        n = len(self.end)
        first = last = None
        if n:
            # An unknown duration (-1) gives a start after its end: never the
            # minimum once the ends themselves are counted.
            first = min(min(map(operator.sub, self.end, self.dur)), min(self.end))
            if self.crash_start:  # an interrupted attempt runs from its start
                first = min(first, min(self.crash_start.values()))
            last = max(self.end)
        recovered = {(i, at) for _, i, at, _ in self.interrupted}
        # Recovered meanwhile (between `status` and the attempts read): an attempt now.
        flying = sorted((x for x in self.in_flight if (x[1], x[2]) not in recovered), reverse=True)
        if flying:
            # Not ended: each runs on as far as the report knows, to its time
            # (the wall time and the timeline cover them up to now).
            now = time.time() if self.now is None else self.now
            first = min(first if first is not None else math.inf, flying[-1][0])
            last = max(last if last is not None else -math.inf, flying[0][0], now)
        gone = {x[1] for x in self.in_flight} - {x[1] for x in flying}  # recovered meanwhile
        for _, _, _, runner in flying:
            self.runner_ids.setdefault(runner, len(self.runner_ids))
        names = {i: r for r, i in self.runner_ids.items()}
        per_runner = Counter(self.runner)
        per_runner.update(self.runner_ids[runner] for _, _, _, runner in flying)
        runners = tuple(
            (names[i], self.hosts.get(names[i], ""), count)
            for i, count in sorted(per_runner.items(), key=lambda kv: (-kv[1], names[kv[0]]))
        )
        unsuccessful = list(compress(range(n), self.kind))  # few: kind 0 is done
        return AttemptFigures(
            attempts=sum(self.kinds),
            first_start=first,
            last_end=last,
            kinds=tuple(self.kinds),
            runners=runners,
            throughput=self._throughput(first, last, unsuccessful),
            timeline=self._timeline(names, unsuccessful, flying, last),
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
                ItemRow(i, n, at, started=None if math.isnan(start) else start)
                for at, i, n, start in heapq.nlargest(INTERRUPTED_KEPT, self.interrupted)
            ),
            interrupted_total=self.interrupted_total,
            retried_total=len(self.retried),
            in_flight=tuple(
                ItemRow(i, at, start, state=self._in_flight_state(i))
                for start, i, at, _ in flying[:TOP_ROWS]
            ),
            in_flight_total=self.in_flight_total - (len(self.in_flight) - len(flying)),
            in_flight_held=len(self.in_flight_held - gone),
        )

    def _throughput(
        self, first: float | None, last: float | None, unsuccessful: list[int]
    ) -> Throughput | None:
        """Ends per bucket and kind, counted by bisecting each kind's sorted
        end times at the bucket edges (runs end nearly in order: cheap sorts)."""
        if first is None or last is None:
            return None
        lo = math.floor(first)
        width = float(_nice_width((last - lo) / THROUGHPUT_BUCKETS))
        buckets = int((last - lo) // width) + 1
        ends: list[list[float]] = [[] for _ in KIND_NAMES]
        ends[DONE] = sorted(compress(self.end, map(operator.not_, self.kind)))
        for i in unsuccessful:
            ends[self.kind[i]].append(self.end[i])
        edges = [lo + j * width for j in range(1, buckets)]
        rows = []
        for times in ends:
            times.sort()
            cuts = [0, *(bisect_left(times, edge) for edge in edges), len(times)]
            rows.append(tuple(b - a for a, b in pairwise(cuts)))
        return Throughput(float(lo), width, tuple(rows))

    def _histogram(self) -> DurationHistogram:
        """The two sketches' buckets in log-spaced bins with round edges."""
        done, other = self.done_sketch, self.other_sketch
        sketches = [x for x in (done, other) if x.count]
        quantiles = {f"p{round(q * 100)}": done.quantile(q) for q in QUANTILES}
        tops = [top for x in sketches for _, top, _ in x.iter_bucket_ranges() if top > 0]
        if not tops:
            return DurationHistogram((), (), (), quantiles)
        low = math.floor(math.log10(min(tops) / done.gamma))
        high = max(math.ceil(math.log10(max(x.max for x in sketches))), low + 1)
        steps = max(1, min(10, 40 // (high - low)))
        edges = tuple(10.0 ** (low + j / steps) for j in range((high - low) * steps + 1))
        counts = []
        for sketch in (done, other):
            bins = [0] * (len(edges) - 1)
            for value, _, n in sketch.iter_bucket_ranges():
                bins[min(max(bisect_right(edges, value) - 1, 0), len(bins) - 1)] += n
            counts.append(tuple(bins))
        return DurationHistogram(edges, counts[0], counts[1], quantiles)

    def _failures(self) -> tuple[FailureGroup, ...]:
        groups = (
            FailureGroup(reason, n, tuple(ids), first, last)
            for reason, (n, first, last, ids) in self.reasons.items()
        )
        return tuple(sorted(groups, key=lambda g: (-g.count, g.reason)))

    def _slowest(self) -> tuple[ItemRow, ...]:
        top = sorted(_longest(self.dur, TOP_ROWS), key=lambda i: (-self.dur[i], self.item[i]))
        return tuple(
            ItemRow(self.item[i], self.attempt[i], self.dur[i], state=KIND_NAMES[self.kind[i]])
            for i in top[:TOP_ROWS]
        )

    def _timeline(
        self,
        names: dict[int, str],
        unsuccessful: list[int],
        flying: list[tuple[float, int, int, str]],
        last: float | None,
    ) -> Timeline:
        """Bars of the sampled attempts, and of those in flight (``flying``:
        start, id, attempt, runner) from their start to ``last`` (the
        report's time): each its own slot of its runner, as they overlap."""
        n = len(self.end)
        end, dur, crash_start = self.end, self.dur, self.crash_start
        sampled = _sampled(dur, unsuccessful)
        kept = len(unsuccessful) if n <= TIMELINE_LIMIT else len(set(unsuccessful) & set(sampled))
        # (start, end, item, attempt, runner, kind, in flight) of each bar; an
        # interrupted attempt (no duration) from its start record's time
        rows = [
            (
                crash_start.get((self.item[i], self.attempt[i]), end[i])
                if self.kind[i] == INTERRUPTED
                else end[i] - max(dur[i], 0.0),
                end[i],
                self.item[i],
                self.attempt[i],
                self.runner[i],
                self.kind[i],
                False,
            )
            for i in sampled
        ]
        till = last if last is not None else 0.0
        rows += [
            (start, max(till, start), i, at, self.runner_ids[runner], INTERRUPTED, True)
            for start, i, at, runner in flying
        ]
        rows.sort(key=operator.itemgetter(0, 2, 3))  # ties (one batch's starts): by item
        lanes: list[tuple[str, int]] = []  # (runner, slot) of each lane, as first used
        free: dict[int, list[tuple[float, int]]] = {}  # runner -> heap of (free at, lane)
        placed = []
        for r in rows:
            start, stop, runner = r[0], r[1], r[4]
            heap = free.setdefault(runner, [])
            if heap and (heap[0][0] <= start or len(heap) >= MAX_SLOTS):
                lane = heapq.heappop(heap)[1]
            else:
                lane = len(lanes)
                lanes.append((names[runner] or "?", len(heap) + 1))
            heapq.heappush(heap, (stop, lane))
            placed.append((lane, r))
        order = sorted(range(len(lanes)), key=lanes.__getitem__)  # a runner's lanes together
        row = {lane: n for n, lane in enumerate(order)}
        bars = tuple(Bar(row[lane], *r[:4], kind=r[5], in_flight=r[6]) for lane, r in placed)
        names_shown = tuple(f"{lanes[lane][0]} #{lanes[lane][1]}" for lane in order)
        return Timeline(names_shown, bars, n + len(flying), len(bars), len(unsuccessful), kept)


def _sampled(dur: array[float], unsuccessful: list[int]) -> Iterable[int]:
    """Indices of the attempts the timeline shows: all of them up to
    ``TIMELINE_LIMIT``; past it the slowest, the unsuccessful ones (up to a
    cap) and an even stride through the rest."""
    n = len(dur)
    if n <= TIMELINE_LIMIT:
        return range(n)
    keep = set(_longest(dur, TIMELINE_OUTLIERS))
    step = max(1, len(unsuccessful) // TIMELINE_UNSUCCESSFUL)
    keep.update(unsuccessful[::step][:TIMELINE_UNSUCCESSFUL])
    rest = TIMELINE_LIMIT - len(keep)
    if rest > 0:
        keep.update(range(0, n, math.ceil(n / rest)))
    return keep


def _longest(dur: array[float], count: int) -> list[int]:
    """Indices of the ``count`` longest known durations, found by C-level
    passes: the threshold from the values, then the indices above it and
    those at it (when many tie, e.g. timeouts, an even spread of them)."""
    top = [d for d in heapq.nlargest(count, dur) if d >= 0]
    if not top:
        return []
    threshold = top[-1]
    found = list(compress(range(len(dur)), map(threshold.__lt__, dur)))
    tied = list(compress(range(len(dur)), map(threshold.__eq__, dur)))
    room = count - len(found)
    if room > 0:
        found += tied[:: math.ceil(len(tied) / room)]
    return found


def _nice_width(seconds: float) -> int:
    for width in _NICE_SECONDS:
        if width >= seconds:
            return width
    return math.ceil(seconds / 86400) * 86400
