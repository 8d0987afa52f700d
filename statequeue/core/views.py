"""What the library reports back: status, listings, results and histories.

Kept apart from ``models`` so that a plain enqueue (the hot path of shell
loops) does not pay for creating these dataclasses at import time. The
reports of `compact` and `fsck` live in ``maintenance_views`` and are
importable from here too, loaded on first use: the store's modules import
this one when `enqueue` starts, and a dataclass costs a compile per method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequeue.core.models import STATUS_SCHEMA, ItemState
from statequeue.core.rates import Pace
from statequeue.core.recent_rate import MIN_SPAN, start_rate
from statequeue.core.textsafe import item_json, record_json

if TYPE_CHECKING:  # at run time, through __getattr__ (below)
    from statequeue.core.maintenance_views import CompactResult as CompactResult
    from statequeue.core.maintenance_views import CountMismatch as CountMismatch
    from statequeue.core.maintenance_views import LogsRemoved as LogsRemoved
    from statequeue.core.maintenance_views import QueueCheck as QueueCheck
    from statequeue.core.maintenance_views import StoreCheck as StoreCheck

_MAINTENANCE = frozenset(
    {"CompactResult", "CountMismatch", "LogsRemoved", "QueueCheck", "StoreCheck"}
)


def __getattr__(name: str) -> object:
    if name in _MAINTENANCE:
        from statequeue.core import maintenance_views  # lazy: start-up time (see the docstring)

        return getattr(maintenance_views, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Failure:
    """The last failure of an item, for status displays."""

    item_id: int
    item: str
    attempts: int
    reason: str
    stderr_last: str = ""
    """The last line its last attempt wrote to stderr ("" when none)."""


@dataclass(frozen=True)
class WorkerView:
    """A persistent worker of a live runner (``run --persistent``), as last published."""

    slot: int
    pid: int
    items: int
    """Requests it has answered."""
    rss: int | None = None
    """Resident memory in bytes (None if unknown)."""

    def to_json(self) -> dict[str, Any]:
        return {"slot": self.slot, "pid": self.pid, "items": self.items, "rss": self.rss}


@dataclass(frozen=True)
class ActiveRunner:
    """A runner that is alive now."""

    runner_id: str
    pid: int
    host: str
    started_at: float
    running: tuple[int, ...]
    heard_ago: float | None = None
    """Seconds since its last heartbeat, where the store has heartbeats (PostgreSQL)."""
    lease_ends_at: float | None = None
    """When its lease ends unless renewed (Unix time), where the store has leases."""
    lease: float | None = None
    """Its lease's length in seconds, where the store has leases."""
    workers: tuple[WorkerView, ...] = ()
    """Its persistent workers, where the store keeps them (``Store.publish_workers``)."""
    stopped: bool = False
    """Its process, on this host, is stopped by a signal (SIGSTOP, ctrl-Z, a
    debugger): it runs nothing new until it is continued (SIGCONT). On
    PostgreSQL it is listed so even once its lease has ended: it takes its
    runner row back when it resumes."""


STARTS_WINDOW = 60.0
"""Seconds of starts ``status`` counts (every runner's, paced or not)."""


@dataclass(frozen=True)
class Starts:
    """The items started in the last ``STARTS_WINDOW`` seconds, by every
    runner and library loop (``status``): at least two."""

    count: int
    first: float
    last: float
    per_second: float | None
    """Starts per second since the first (``core.recent_rate.start_rate``):
    the batch that came at that first moment not counted; None while every
    start came in it."""


def starts_of(
    count: int, first: float, last: float, now: float, at_first: int, floor: float = MIN_SPAN
) -> Starts | None:
    """The ``Starts`` of ``count`` starts from ``first`` to ``last``, ``at_first``
    of them in the first moment (``FIRST_BATCH``); None for fewer than two.
    ``floor``: the shortest span the rate is measured over (``start_rate``)."""
    if count < 2:
        return None
    return Starts(count, first, last, start_rate(count, at_first, first, now, floor))


@dataclass(frozen=True)
class Status:
    """Counts per state and what is going on in one queue."""

    queue: str
    counts: dict[str, int]
    runners: tuple[ActiveRunner, ...] = ()
    recent_failures: tuple[Failure, ...] = ()
    held: tuple[int, ...] = ()
    interrupted: tuple[int, ...] = ()
    """Items recorded as running whose runner is gone: the next run recovers them."""
    interrupted_pending: tuple[int, ...] = ()
    """Pending items whose last attempt was interrupted (its runner died) and
    not settled since: a run with --verify checks them before running them."""
    paused: bool = False
    rate: float | None = None
    """Items finished per second over the last minute (since the work they
    count began, when that is shorter: ``core.recent_rate``), while there is progress."""
    deferred: int = 0
    """Pending items waiting because their last attempt asked to be tried later (exit 75)."""
    waiting: int = 0
    """Pending items not due yet: a retry's backoff (``--retry-delay``) or a
    deferral (exit 75) makes them wait until their due time."""
    next_due: float | None = None
    """When the earliest of the ``waiting`` items comes due (Unix time); None when none waits."""
    pace: Pace | None = None
    """The queue's shared start rate (``run --rate``): current and limit; None when unlimited."""
    starts: Starts | None = None
    """The starts of the last minute, every runner's: None for fewer than two."""
    leftovers: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """Pending items whose claim a process left by an earlier attempt still
    holds (its run's keeper keeps it until that process ends), each with the
    pids noted for it: a run waits for them."""
    held_by_dead_runner: tuple[int, ...] = ()
    """Items recorded as running whose runner is gone (its keeper too) while a
    process of their attempt lives on and holds the claim: no run takes them
    until those processes end; then the next run recovers them."""

    @property
    def over_limit(self) -> bool:
        """More starts in the last minute than the queue's limit lets through
        its bucket (``burst + limit * T``, with a margin for the records'
        timing and a limit that changed): some runner or library loop takes
        no starts from it (no ``--rate``, no ``rate=``)."""
        if self.pace is None or self.starts is None:
            return False
        if self.pace.set_at > self.starts.first + 0.01:  # records keep times to the ms
            # The minute's starts came under two limits (a runner started with
            # another --rate): not judged until they all came under this one.
            return False
        allowed = self.pace.burst + self.pace.limit * (self.starts.last - self.starts.first)
        return self.starts.count > 1.1 * allowed + 1

    @property
    def eta(self) -> float | None:
        """Seconds until the pending and running items are done, at the current
        rate; None when unknown, while the queue is paused, or while no runner
        is active (no end in sight: the text says no ETA then, and `stats`
        too; the JSON gave one, from the rate of a runner since gone)."""
        left = self.counts.get("pending", 0) + self.counts.get("running", 0)
        if not self.rate or not left or self.paused or not self.runners:
            return None
        return left / self.rate

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATUS_SCHEMA,
            "queue": self.queue,
            "counts": dict(self.counts),
            "total": self.total,
            "runner_active": bool(self.runners),
            "runners": [
                {
                    "runner_id": r.runner_id,
                    "pid": r.pid,
                    "host": r.host,
                    "started_at": r.started_at,
                    "running": list(r.running),
                    "heard_ago": r.heard_ago,
                    "lease_ends_at": r.lease_ends_at,
                    "stopped": r.stopped,
                    "workers": [w.to_json() for w in r.workers],
                }
                for r in self.runners
            ],
            "recent_failures": [
                {
                    "id": f.item_id,
                    **item_json(f.item),
                    "attempts": f.attempts,
                    "reason": f.reason,
                    "stderr_last": f.stderr_last,
                }
                for f in self.recent_failures
            ],
            "held": list(self.held),
            "interrupted": list(self.interrupted),
            "interrupted_pending": list(self.interrupted_pending),
            "leftovers": [{"id": i, "pids": list(pids)} for i, pids in self.leftovers],
            "held_by_dead_runner": list(self.held_by_dead_runner),
            "paused": self.paused,
            "rate": self.rate,
            "eta_seconds": self.eta,
            "deferred": self.deferred,
            "waiting": self.waiting,
            "next_due": self.next_due,
            "rate_limit": None
            if self.pace is None
            else {
                "current_per_second": self.pace.current,
                "limit_per_second": self.pace.limit,
                "burst": self.pace.burst,
                "started_per_second": self.starts.per_second if self.starts else None,
                "over_limit": self.over_limit,
            },
        }


@dataclass(frozen=True)
class RetryReport:
    """What a user's ``retry`` did. ``put_back``: the failed or held items it
    moved to pending. ``recovered``: items named whose runner had died during
    their ``--verify`` check: recovery made them pending again (their command
    never ran: no attempt, no crash), which is what the retry asked for."""

    put_back: tuple[int, ...] = ()
    recovered: tuple[int, ...] = ()

    @property
    def changed(self) -> list[int]:
        """Every item the retry left pending that was not before."""
        return [*self.recovered, *self.put_back]


@dataclass
class RecoveryReport:
    """What recovery did with items left in flight by dead runners."""

    retried: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ItemView:
    """One item as `list` shows it."""

    item_id: int
    item: str
    state: ItemState
    attempts: int = 0
    reason: str = ""
    interrupted: bool = False
    """Running, but its runner died: the next run recovers it (``Status.interrupted``)."""
    held_by_dead_runner: bool = False
    """Running, its runner dead, but processes of its attempt still run and hold
    it: no run takes it until they end (``Status.held_by_dead_runner``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATUS_SCHEMA,
            "id": self.item_id,
            **item_json(self.item),
            "state": self.state.value,
            "attempts": self.attempts,
            "reason": self.reason,
            "interrupted": self.interrupted,
            "held_by_dead_runner": self.held_by_dead_runner,
        }


@dataclass(frozen=True)
class ItemResult:
    """A finished attempt's stored result, as `results` streams it."""

    item_id: int
    item: str
    state: ItemState
    attempt: int
    exit_code: int | None
    duration: float | None
    reason: str
    result: Any
    archived: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATUS_SCHEMA,
            "id": self.item_id,
            **item_json(self.item),
            "state": self.state.value,
            "attempt": self.attempt,
            "exit": self.exit_code,
            "duration": self.duration,
            "reason": self.reason,
            "result": self.result,
            "archived": self.archived,
        }


@dataclass(frozen=True)
class ItemHistory:
    """Everything recorded about one item: `show` renders it."""

    item_id: int
    item: str
    state: ItemState
    events: tuple[dict[str, Any], ...]
    """The item's records (enqueue, start, end, interruptions, user actions), in order."""
    result: Any = None
    stderr_tail: str = ""
    log_paths: tuple[str, ...] = ()
    interrupted: bool = False
    """Running, but its runner died: the next run recovers it (``Status.interrupted``)."""
    held_by_dead_runner: bool = False
    """Running, its runner dead, its attempt's processes still running (``ItemView``)."""

    def log_cuts(self) -> dict[int, str]:
        """Why an attempt's output log stops short ("disk full"), by attempt:
        the ``logcut`` of its end record (or of its summary after compaction)."""
        cuts: dict[int, str] = {}
        for rec in self.events:
            tries = rec.get("tries")
            for r in (*(tries if isinstance(tries, list) else ()), rec):
                if not isinstance(r, dict):
                    continue
                cut, attempt = r.get("logcut"), r.get("attempt")
                if isinstance(cut, str) and cut and isinstance(attempt, int):
                    cuts[attempt] = cut
        return cuts

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATUS_SCHEMA,
            "id": self.item_id,
            **item_json(self.item),
            "state": self.state.value,
            "interrupted": self.interrupted,
            "held_by_dead_runner": self.held_by_dead_runner,
            "events": [record_json(e) for e in self.events],
            "result": self.result,
            "stderr_tail": self.stderr_tail,
            "logs": list(self.log_paths),
        }
