"""Finished attempts, one small record each, as every store yields them for `stats`.

A finished attempt is an ``end`` record (the command exited, timed out, or
the library settled the item) or a crash recovery (an ``intr`` record that
counts a crash: its runner died during the attempt). An attempt handed back
by a stopped runner is not one: it never finished, and runs again.

An attempt that --verify settled done without running (``VERIFIED_REASONS``)
is one, as `list` and `show` count it, but with no duration: it ran nothing,
and its recorded 0 s would drag the duration figures down.

The journal keeps an attempt's record until compaction; then the item's
``arch`` record (done items) or ``item`` record (unfinished ones) carries its
attempts as ``tries`` summaries, and ``attempts_of`` reads all three alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import compress
from typing import Any, NamedTuple, cast

from statequeue.core.exported import MAX_SECONDS
from statequeue.core.models import VERIFIED_REASONS
from statequeue.core.records import Record


class Attempt(NamedTuple):
    """One finished attempt (a tuple: a million of them stream through `stats`)."""

    item_id: int
    attempt: int
    state: str
    """The item's state after it: done, failed, pending (a retry follows) or held."""
    ok: bool
    duration: float | None
    reason: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    runner: str
    """The runner's id ("" when the record does not say: written before runners were named)."""
    host: str
    ended_at: float | None
    interrupted: bool = False
    """Its runner died during it (crash recovery ended it, not the command)."""
    started_at: float | None = None
    """When an interrupted attempt started (its ``start`` record's time; None
    when not known, as after a compaction dropped that record). Its
    ``ended_at`` is the recovery's: the two are the span it held its item."""


def is_crash(rec: Record) -> bool:
    """True for an ``intr`` record that ended an attempt by crash recovery
    (not a stopped runner's give-back, which counts no crash)."""
    return rec.get("t") == "intr" and "crashes" in rec


def from_end(rec: Record, item_id: int, state: str = "") -> Attempt:
    """The attempt an ``end`` record (or its summary, or an ``arch``) describes."""
    state = state or rec.get("state", "done")
    reason = rec.get("reason", "")
    return Attempt(
        item_id,
        rec.get("attempt", 0),
        state,
        rec.get("ok", state == "done"),
        None if reason in VERIFIED_REASONS else rec.get("dur"),
        reason,
        rec.get("exit"),
        rec.get("sig"),
        bool(rec.get("timeout")),
        rec.get("runner", ""),
        rec.get("host", ""),
        rec.get("at"),
    )


def from_crash(rec: Record, item_id: int, started_at: float | None = None) -> Attempt:
    """The attempt a crash recovery (``intr`` record) ended. Its start is the
    one the recovery copied from the attempt's ``start`` record (``started``),
    else ``started_at``: that record's time, when the caller read it (records
    written before recoveries copied it)."""
    started = rec.get("started")
    if isinstance(started, int | float) and not isinstance(started, bool):
        started_at = float(started)
    return Attempt(
        item_id,
        rec.get("attempt", 0),
        rec.get("state", "pending"),
        False,
        None,
        "interrupted",
        None,
        None,
        False,
        rec.get("runner", ""),
        rec.get("host", ""),
        rec.get("at"),
        True,
        started_at,
    )


def from_tries(tries: Iterable[Record], item_id: int) -> Iterator[Attempt]:
    """The finished attempts among an item's ``tries`` summaries."""
    for t in tries:
        kind = t.get("t")
        if kind == "end":
            yield from_end(t, item_id)
        elif kind == "intr" and "crashes" in t:
            yield from_crash(t, item_id)


def from_archived(rec: Record) -> Iterator[Attempt]:
    """The attempts of an archived (``arch``) item: its ``tries`` when it has
    them (they end with its last attempt), else the one attempt it records."""
    item_id = rec["id"]
    tries = rec.get("tries")
    if tries:
        yield from from_tries(tries, item_id)
    elif "attempt" in rec:  # a bare one (salvaged, never ended) records no attempt
        yield from_end(rec, item_id, "done")


def run_durations(records: Sequence[Record]) -> list[float | None]:
    """The ``dur`` of each of ``records`` (``end`` or ``arch``), None where it
    gives none or --verify settled it without running (as ``from_end``)."""
    return [None if rec.get("reason") in VERIFIED_REASONS else rec.get("dur") for rec in records]


def attempts_of(records: Iterable[Record]) -> Iterator[Attempt]:
    """The finished attempts in a stream of journal or archive records. An
    ``end`` that does not name its runner (written by an older statequeue)
    takes it from the attempt's ``start`` record, and a host from the
    runner's ``run`` record (``joined_host``)."""
    started: dict[int, Record] = {}  # id -> the start record of its attempt in flight
    hosts: dict[str, str] = {}  # runner -> host, from ``run`` records
    return _attempts_of(records, started, hosts)


def joined_host(host: str, runner: str, hosts: dict[str, str]) -> str:
    """The host of an attempt whose record names no runner (an older
    statequeue's), its runner taken from the ``start`` record: the one
    ``runner``'s ``run`` record named (``hosts``). Only for those: a record
    that names its runner is taken as written, with no host if it names none
    (its runner had been recorded lost when a recovery wrote it). A ``run``
    record does not survive compaction while a stats cache remembers it, so
    looking it up for such a record made the cache and the files disagree."""
    return host or hosts.get(runner, "")


def _attempts_of(
    records: Iterable[Record], started: dict[int, Record], hosts: dict[str, str]
) -> Iterator[Attempt]:
    for rec in records:
        kind = rec.get("t")
        if kind == "run":
            hosts[rec["runner"]] = rec.get("host", "")
        elif kind == "end":
            a = from_end(rec, rec["id"])
            runner = started.pop(a.item_id, {}).get("runner", "")
            yield (
                a
                if a.runner
                else a._replace(runner=runner, host=joined_host(a.host, runner, hosts))
            )
        elif kind == "start":
            started[rec["id"]] = rec
        elif kind == "intr":
            start = started.pop(rec["id"], {})
            runner = start.get("runner", "")
            if "crashes" in rec:
                a = from_crash(rec, rec["id"], start_time(start, rec))
                yield (
                    a
                    if a.runner
                    else a._replace(runner=runner, host=joined_host(a.host, runner, hosts))
                )
        elif kind == "arch":
            yield from from_archived(rec)
        elif kind == "item" and rec.get("tries"):
            yield from from_tries(rec["tries"], rec["id"])


def start_time(start: Record | None, intr: Record) -> float | None:
    """The time of ``start`` (a ``start`` record, or None) when it is the
    start of the attempt the ``intr`` record ``intr`` ended."""
    if start is None or start.get("attempt") != intr.get("attempt"):
        return None
    at = start.get("at")
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


class AttemptBatch(NamedTuple):
    """Many attempts as columns (row i of each is one attempt): `stats` folds
    them with C-level passes (counts, min, max, sorts) instead of a Python
    step per attempt. ``failures`` holds the failed ones whole (they are few,
    and their reasons need a closer look)."""

    item_id: Sequence[int]
    attempt: Sequence[int]
    state: Sequence[str]
    ok: Sequence[bool]
    duration: Sequence[float | None]
    ended_at: Sequence[float | None]
    runner: Sequence[str | None]
    host: Sequence[str | None]
    failures: list[Attempt]


BATCH = 20_000


def batches_of(attempts: Iterable[Attempt], size: int = BATCH) -> Iterator[AttemptBatch]:
    """``attempts`` as batches of at most ``size``."""
    batch: list[Attempt] = []
    for a in attempts:
        batch.append(a)
        if len(batch) >= size:
            yield batch_of(batch)
            batch = []
    if batch:
        yield batch_of(batch)


def batch_of(attempts: Sequence[Attempt]) -> AttemptBatch:
    if not attempts:
        return AttemptBatch((), (), (), (), (), (), (), (), [])
    cols = list(zip(*attempts, strict=True))
    return AttemptBatch(
        cols[0], cols[1], cols[2], cols[3], cols[4], cols[11], cols[9], cols[10],
        [a for a in attempts if not a.ok],
    )  # fmt: skip


def within_limits(b: AttemptBatch) -> AttemptBatch:
    """``b`` with each duration and end time outside an import's limits
    (``exported.MAX_SECONDS``: an older import let in 1e20) as None, as if the
    record gave none, so that no figure, bucket or date overflows."""
    duration, ended_at = _sane(b.duration), _sane(b.ended_at)
    if duration is b.duration and ended_at is b.ended_at:
        return b
    return b._replace(duration=duration, ended_at=ended_at)


def _sane(column: Sequence[float | None]) -> Sequence[float | None]:
    given = cast(Sequence[float], column)  # no None: checked in C
    if None in column:
        given = [x for x in column if x is not None]
    if not given or (min(given) >= 0 and max(given) < MAX_SECONDS):  # C-level passes
        return column
    return [x if x is not None and 0 <= x < MAX_SECONDS else None for x in column]


def ended_since(b: AttemptBatch, cutoff: float) -> AttemptBatch:
    """The attempts of ``b`` that ended at ``cutoff`` or later (`stats --since`,
    `report --since`)."""
    keep = [at is not None and at >= cutoff for at in b.ended_at]
    if all(keep):
        return b
    failures = [a for a in b.failures if a.ended_at is not None and a.ended_at >= cutoff]
    columns: list[Any] = [list(compress(column, keep)) for column in b[:-1]]
    return AttemptBatch._make([*columns, failures])
