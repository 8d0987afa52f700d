"""What a run did, at a glance: `statequeue stats`, computed in one streaming pass.

``compute_stats`` folds a stream of finished attempts (``Store.iter_attempts``)
into a ``Stats``, in memory that does not grow with the number of attempts:

- durations (of done items' successful attempts) in a ``QuantileSketch``
  (quantiles within ``ALPHA`` = 1%, relative; count, min, max and mean exact);
- the slowest 5 in a bounded heap; throughput in at most 120 buckets; the
  recent rate in per-second counts over the last 10 minutes;
- failure reasons, runners and hosts in dicts capped at ``MAX_GROUPS`` (the
  rest are counted under "(other)"); a reason's example is its attempt with
  the lowest (item id, attempt), whatever order the attempts came in;
- items on their second attempt or later: one byte per item id, as the
  journal store's own state keeps.

Every part merges (``StatsBuilder.merge``): folding A then B gives what
folding A and B apart and merging gives, so a summary saved at a journal
position (``store/stats_cache.py``) plus the attempts after it is the
one-pass answer.
"""

from __future__ import annotations

import heapq
import math
import re
import signal
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import compress
from typing import Any, cast

from statequeue.stats.attempts import Attempt, AttemptBatch, batches_of, ended_since, within_limits
from statequeue.stats.histogram import histogram
from statequeue.stats.json_schema import STATS_SCHEMA, stats_json
from statequeue.stats.rates import (
    RATE_WINDOW_SECONDS,
    RecentRate,
    Throughput,
    ThroughputView,
    finished_of,
)
from statequeue.stats.sketch import ALPHA, QuantileSketch

SLOWEST = 5
MAX_GROUPS = 1000
"""Distinct failure reasons, runners or hosts kept; more are counted as "(other)"."""
OTHER = "(other)"
QUANTILES = (0.5, 0.9, 0.99)
_REASON_WIDTH = 80


@dataclass(frozen=True)
class Durations:
    count: int
    min: float | None
    max: float | None
    mean: float | None
    quantiles: dict[str, float | None]
    """"p50", "p90", "p99": within ``error`` (relative) of the exact nearest-rank value."""
    error: float
    histogram: tuple[tuple[float, float, int], ...]
    """(from, to, count) bins: durations >= from and < to (the last bin includes its end)."""


@dataclass(frozen=True)
class ReasonGroup:
    reason: str
    count: int
    example_id: int
    example_attempt: int


@dataclass(frozen=True)
class Slow:
    item_id: int
    attempt: int
    duration: float


@dataclass(frozen=True)
class Group:
    """Attempts finished by one runner (or on one host), and how many failed."""

    name: str
    host: str
    attempts: int
    failed: int

    @property
    def failure_rate(self) -> float:
        return self.failed / self.attempts if self.attempts else 0.0


@dataclass(frozen=True)
class Stats:
    """The figures `statequeue stats` shows."""

    queue: str
    now: float
    since: float | None
    counts: dict[str, int]
    attempts: int
    durations: Durations
    throughput: ThroughputView
    rate_window: float
    recent_finishes: int
    rate: float | None
    """Items finished per second over ``rate_window`` (or since the first finish)."""
    failed_attempts: int
    reasons: tuple[ReasonGroup, ...]
    retried_items: int
    """Items that ran a second attempt or later (within ``since``)."""
    held: tuple[int, ...]
    slowest: tuple[Slow, ...]
    runners: tuple[Group, ...]
    hosts: tuple[Group, ...]
    deferred: int = 0
    """Deferrals (attempts that asked to be tried later) the store still records."""
    runner_active: bool | None = None
    """Whether a runner (a `run`, a ``work()`` loop) is active on the queue now;
    None when not known (figures of attempts alone). No ETA without one."""
    paused: bool = False
    """Whether the queue is paused (no new item starts until `resume`): no ETA then."""

    @property
    def left(self) -> int:
        return self.counts.get("pending", 0) + self.counts.get("running", 0)

    @property
    def eta(self) -> float | None:
        """Seconds until the pending and running items finish, at ``rate``;
        None when unknown, while no runner is active (nothing will finish)
        or while the queue is paused (as `status` says)."""
        if not self.left or not self.rate or self.runner_active is False or self.paused:
            return None
        return self.left / self.rate

    def to_json(self) -> dict[str, Any]:
        return stats_json(self)


def normalise_reason(a: Attempt) -> str:
    """A failed attempt's reason, grouped: "exit code 1", "timed out",
    "killed by SIGKILL", "interrupted", or the library's reason text."""
    reason = a.reason
    if a.interrupted or reason.startswith("interrupted"):
        return "interrupted"
    if a.timed_out or reason.startswith("timed out"):
        return "timed out"
    if a.signal is not None:
        return f"killed by {signal_name(a.signal)}"
    if a.exit_code is not None and a.exit_code != 0:
        return f"exit code {a.exit_code}"
    if reason.startswith("cannot start command"):
        return "cannot start command"
    first = reason.strip().split("\n", 1)[0]
    return reason_pattern(first[:_REASON_WIDTH]) or "failed (no reason given)"


_QUOTED = re.compile(r"""'[^']*'|"[^"]*"|`[^`]*`""")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:[.,:]\d+)*(?![A-Za-z_])|\b0x[0-9a-fA-F]+\b")


def reason_pattern(reason: str) -> str:
    """``reason`` with its numbers as ``N`` and its quoted values as ``'…'``, so
    that "model refused prompt 17" and "... prompt 18" fall in one group (each
    group keeps an example item)."""
    return _NUMBER.sub("N", _QUOTED.sub("'…'", reason))


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class StatsBuilder:
    """Folds attempts one at a time; ``build`` gives the ``Stats``."""

    def __init__(self, *, now: float, since: float | None = None) -> None:
        self.now = now
        self.since = since
        self.cutoff = None if since is None else now - since
        self.attempts = 0
        self.sketch = QuantileSketch()
        self.slowest: list[tuple[float, int, int]] = []  # (duration, -id, attempt)
        self.throughput = Throughput()
        self.recent = RecentRate()
        self.failed = 0
        self.reasons: dict[str, list[int]] = {}  # reason -> [count, id, attempt]
        self.retried = bytearray()
        self.runners: dict[str, list[Any]] = {}  # runner -> [attempts, failed, host]

    def add_all(self, batches: Iterable[AttemptBatch]) -> None:
        for batch in batches:
            self.add_batch(batch)

    def add_batch(self, b: AttemptBatch) -> None:
        """Fold a batch of attempts in, each column with C-level passes."""
        b = within_limits(b)
        if self.cutoff is not None:
            b = ended_since(b, self.cutoff)
        if not b.item_id:
            return
        self.attempts += len(b.item_id)
        self._add_done(b)
        for a in b.failures:
            self._add_failure(a)
        finished, durations = finished_of(b)
        self.throughput.add_many(finished)
        self.recent.add_many(finished, durations)
        if max(b.attempt) >= 2:
            retried = [i for i, n in zip(b.item_id, b.attempt, strict=True) if n >= 2]
            for item_id in retried:
                self._mark_retried(item_id)
        self._add_runners(b)

    def _add_done(self, b: AttemptBatch) -> None:
        durations = cast(list[float], list(compress(b.duration, b.ok)))
        if None in durations:  # a duration the record does not give (checked in C)
            durations = [d for d in durations if d is not None]
        self.sketch.add_many(durations)
        top = heapq.nlargest(SLOWEST, durations)
        floor = self.slowest[0][0] if len(self.slowest) == SLOWEST else -math.inf
        for entry in _slowest_rows(b, [d for d in set(top) if d >= floor]):
            if len(self.slowest) < SLOWEST:
                heapq.heappush(self.slowest, entry)
            elif entry > self.slowest[0]:
                heapq.heapreplace(self.slowest, entry)

    def _add_failure(self, a: Attempt) -> None:
        self.failed += 1
        reason = normalise_reason(a)
        self._reason_group(reason, 1, a.item_id, a.attempt)

    def _reason_group(self, reason: str, count: int, item_id: int, attempt: int) -> None:
        group = self.reasons.get(reason)
        if group is None:
            if len(self.reasons) >= MAX_GROUPS:
                reason = OTHER
                group = self.reasons.get(reason)
            if group is None:
                group = self.reasons[reason] = [0, item_id, attempt]
        group[0] += count
        # The lowest (id, attempt) is the example: the same in any fold order.
        if (item_id, attempt) < (group[1], group[2]):
            group[1], group[2] = item_id, attempt

    def _mark_retried(self, item_id: int) -> None:
        marks = self.retried
        if item_id >= len(marks):
            marks.extend(bytes(max(item_id + 1 - len(marks), len(marks))))
        marks[item_id] = 1

    def _add_runners(self, b: AttemptBatch) -> None:
        failed = Counter(a.runner for a in b.failures)
        hosts = dict(zip(compress(b.runner, b.host), compress(b.host, b.host), strict=True))
        for runner, n in Counter(b.runner).items():
            self._runner_group(runner or "", str(hosts.get(runner) or ""), n, failed[runner or ""])

    def _runner_group(self, runner: str, host: str, attempts: int, failed: int) -> None:
        group = self.runners.get(runner)
        if group is None:
            if len(self.runners) >= MAX_GROUPS:
                runner = OTHER
                group = self.runners.get(runner)
            if group is None:
                group = self.runners[runner] = [0, 0, ""]
        group[0] += attempts
        group[1] += failed
        if host and not group[2]:
            group[2] = host

    def merge(self, other: StatsBuilder) -> None:
        """Add everything ``other`` folded (both without ``since``): the result
        is what one builder folding both streams would hold."""
        if self.cutoff is not None or other.cutoff is not None:
            raise ValueError("only whole summaries (no since) merge")
        self.attempts += other.attempts
        self.failed += other.failed
        self.sketch.merge(other.sketch)
        for entry in other.slowest:
            if len(self.slowest) < SLOWEST:
                heapq.heappush(self.slowest, entry)
            elif entry > self.slowest[0]:
                heapq.heapreplace(self.slowest, entry)
        self.throughput.merge(other.throughput)
        self.recent.merge(other.recent)
        for reason, (n, item_id, attempt) in other.reasons.items():
            self._reason_group(reason, n, item_id, attempt)
        self._merge_retried(other.retried)
        for runner, (n, failed, host) in other.runners.items():
            self._runner_group(runner, host, n, failed)

    def _merge_retried(self, other: bytearray) -> None:
        if len(other) > len(self.retried):
            self.retried.extend(bytes(len(other) - len(self.retried)))
        # One byte (0 or 1) per id: OR both, as integers (C speed).
        width = len(self.retried)
        merged = int.from_bytes(self.retried, "little") | int.from_bytes(other, "little")
        self.retried[:] = merged.to_bytes(width, "little")

    def build(self, *, queue: str, counts: dict[str, int], held: tuple[int, ...] = ()) -> Stats:
        runners = tuple(
            sorted(
                (Group(name, host, n, failed) for name, (n, failed, host) in self.runners.items()),
                key=lambda g: (-g.attempts, g.name),
            )
        )
        return Stats(
            queue=queue,
            now=self.now,
            since=self.since,
            counts=dict(counts),
            attempts=self.attempts,
            durations=durations_of(self.sketch),
            throughput=self.throughput.view(),
            rate_window=self.recent.span(self.now),
            recent_finishes=self.recent.count(self.now),
            rate=self.recent.rate(self.now),
            failed_attempts=self.failed,
            reasons=tuple(
                sorted(
                    (ReasonGroup(r, n, i, at) for r, (n, i, at) in self.reasons.items()),
                    key=lambda g: (-g.count, g.reason),
                )
            ),
            retried_items=self.retried.count(1),
            held=held,
            slowest=tuple(
                Slow(-neg_id, attempt, d)
                for d, neg_id, attempt in sorted(self.slowest, reverse=True)
            ),
            runners=runners,
            hosts=hosts_of(runners),
        )


def hosts_of(runners: Iterable[Group]) -> tuple[Group, ...]:
    """The runners' figures added up per host."""
    per: dict[str, list[int]] = {}
    for g in runners:
        n = per.setdefault(g.host, [0, 0])
        n[0] += g.attempts
        n[1] += g.failed
    groups = (Group(h, h, n, f) for h, (n, f) in per.items())
    return tuple(sorted(groups, key=lambda g: (-g.attempts, g.name)))


def durations_of(sketch: QuantileSketch) -> Durations:
    empty = not sketch.count
    return Durations(
        count=sketch.count,
        min=None if empty else sketch.min,
        max=None if empty else sketch.max,
        mean=None if empty else sketch.total / sketch.count,
        quantiles={f"p{round(q * 100)}": sketch.quantile(q) for q in QUANTILES},
        error=sketch.alpha,
        histogram=histogram(sketch),
    )


def _slowest_rows(b: AttemptBatch, values: list[float]) -> list[tuple[float, int, int]]:
    """(duration, -id, attempt) of the successful attempts in ``b`` that took
    one of ``values`` (found by C-level scans, not a Python step per
    attempt); at most ``SLOWEST`` per value, the first in the batch."""
    durations, rows = b.duration, []
    for value in values:
        start = 0
        found = 0
        while found < SLOWEST:
            try:
                pos = durations.index(value, start)
            except ValueError:
                break
            if b.ok[pos]:
                rows.append((value, -b.item_id[pos], b.attempt[pos]))
                found += 1
            start = pos + 1
    return rows


def compute_stats(
    attempts: Iterable[Attempt],
    *,
    queue: str = "",
    counts: dict[str, int] | None = None,
    held: tuple[int, ...] = (),
    now: float,
    since: float | None = None,
) -> Stats:
    """The figures of ``attempts`` (those that ended in the last ``since``
    seconds, when given), with the queue's current ``counts`` for the ETA."""
    return stats_of_batches(
        batches_of(attempts), queue=queue, counts=counts, held=held, now=now, since=since
    )


def stats_of_batches(
    batches: Iterable[AttemptBatch],
    *,
    queue: str = "",
    counts: dict[str, int] | None = None,
    held: tuple[int, ...] = (),
    now: float,
    since: float | None = None,
) -> Stats:
    """``compute_stats`` over attempts already in batches (``Store.iter_attempt_batches``)."""
    builder = StatsBuilder(now=now, since=since)
    builder.add_all(batches)
    return builder.build(queue=queue, counts=counts or {}, held=held)


__all__ = [
    "ALPHA",
    "RATE_WINDOW_SECONDS",
    "STATS_SCHEMA",
    "Stats",
    "StatsBuilder",
    "compute_stats",
    "normalise_reason",
]
