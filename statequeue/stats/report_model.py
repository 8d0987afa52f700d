"""The HTML report's data (`statequeue report`): plain frozen dataclasses.

``report_fold`` builds the attempt-derived parts from a stream of finished
attempts; the library (``api/report_data``) adds what only the store knows
(counts, commands, item texts); the CLI renders it. Keeping the model plain
lets it be tested on every store without a browser, and rendered without a
store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DONE = 0
"""Attempt kinds, as the ``Bar.kind`` and chart series use them."""
FAILED = 1
"""The item failed for good after it."""
RETRIED = 2
"""It failed and the item went back as pending (a retry follows)."""
INTERRUPTED = 3
"""Its runner died during it (crash recovery ended it)."""
HELD = 4
"""It ended with the item held (deferred to a person)."""
KIND_NAMES = ("done", "failed", "retried", "interrupted", "held")


@dataclass(frozen=True)
class Bar:
    """One attempt in the timeline: a lane (runner slot), start and end."""

    lane: int
    start: float
    end: float
    item_id: int
    attempt: int
    kind: int
    in_flight: bool = False
    """An attempt in flight when its runner died, not recovered yet: its end is
    not known (the bar runs to the report's time)."""


@dataclass(frozen=True)
class Timeline:
    """Attempts as bars, one lane per runner slot. ``shown`` < ``total`` when
    downsampled: the slowest and the unsuccessful attempts are always kept."""

    lanes: tuple[str, ...]
    bars: tuple[Bar, ...]
    total: int
    shown: int
    unsuccessful: int = 0
    """Attempts that did not end done (failed, retried, interrupted, held)."""
    unsuccessful_shown: int = 0
    """Of those, the ones with a bar (all of them unless there were too many)."""


@dataclass(frozen=True)
class Throughput:
    """Attempts ended per bucket, by kind (``KIND_NAMES``), from ``start``."""

    start: float
    bucket_seconds: float
    counts: tuple[tuple[int, ...], ...]
    """One row per kind, one count per bucket."""


@dataclass(frozen=True)
class DurationHistogram:
    """Attempt durations in log-spaced bins, done against not done."""

    edges: tuple[float, ...]
    done: tuple[int, ...]
    failed: tuple[int, ...]
    quantiles: dict[str, float | None]
    """"p50", "p90", "p99" of the done attempts: nearest rank, within 1% as
    `stats` gives them (the same quantile sketch)."""


@dataclass(frozen=True)
class FailureGroup:
    """Unsuccessful attempts that share a reason."""

    reason: str
    count: int
    example_ids: tuple[int, ...]
    first_seen: float | None
    last_seen: float | None
    examples: tuple[str, ...] = ()
    """The example items' texts (filled by the library)."""


@dataclass(frozen=True)
class ItemRow:
    """An item in one of the report's tables."""

    item_id: int
    attempt: int
    value: float
    """Its duration (slowest), attempts (most retried) or end time (interrupted:
    when the recovery ended it)."""
    text: str = ""
    state: str = ""
    """The item's state now (for interrupted items: recovered or not)."""
    started: float | None = None
    """An interrupted attempt's start (its ``start`` record's time), when known."""


@dataclass(frozen=True)
class AttemptFigures:
    """What a stream of finished attempts shows (``report_fold.ReportFold.build``)."""

    attempts: int
    first_start: float | None
    last_end: float | None
    """The last attempt's end; the report's time while attempts are in flight
    with no end (their runner died, not recovered yet)."""
    kinds: tuple[int, ...]
    """Attempts per kind (``KIND_NAMES``)."""
    runners: tuple[tuple[str, str, int], ...]
    """(runner, host, attempts: ended ones and those in flight when it died),
    most attempts first."""
    throughput: Throughput | None
    timeline: Timeline
    histogram: DurationHistogram
    failures: tuple[FailureGroup, ...]
    slowest: tuple[ItemRow, ...]
    most_retried: tuple[ItemRow, ...]
    interrupted: tuple[ItemRow, ...]
    interrupted_total: int
    retried_total: int = 0
    """Items with more than one attempt (``most_retried`` lists the top ones)."""
    in_flight: tuple[ItemRow, ...] = ()
    """Attempts in flight when their runner died, not recovered yet (the items
    `status` lists as interrupted, or as still run by processes of a dead
    runner: state "orphaned"), by start time (``value``), latest first."""
    in_flight_total: int = 0
    in_flight_held: int = 0
    """Of ``in_flight_total``, those whose processes still run and hold the
    claim (``Status.held_by_dead_runner``): no run takes them until those end."""


@dataclass(frozen=True)
class Report:
    """Everything the HTML report shows, as of ``now``."""

    queue: str
    store: str
    now: float
    since: float | None
    counts: dict[str, int]
    commands: tuple[str, ...]
    """Each as its user typed it (``core.command_text``): quoted, and safe to show."""
    active_runners: int
    figures: AttemptFigures
    hosts: tuple[str, ...] = field(default=())
    deferred: int = 0
    """Deferrals (exit 75, ``TryLater``) the store still records, in the window:
    each is also an attempt put back (counted among the retried ones)."""

    @property
    def success_rate(self) -> float | None:
        """Done items among the finished ones (done or failed); None when none
        is. With ``since``: among those its window's attempts finished (done,
        or failed for good), not the queue's counts now, which said 100% of a
        window in which nothing ran."""
        if self.since is not None:
            kinds = self.figures.kinds
            done, failed = kinds[DONE], kinds[FAILED]
        else:
            done, failed = self.counts.get("done", 0), self.counts.get("failed", 0)
        return done / (done + failed) if done + failed else None

    @property
    def wall_seconds(self) -> float | None:
        """From the first attempt's start to the last one's end, or to the
        report's time while attempts are in flight with no end."""
        f = self.figures
        if f.first_start is None or f.last_end is None:
            return None
        return max(f.last_end - f.first_start, 0.0)
