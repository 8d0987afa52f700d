"""The part of the store contract (base.py) that reads a queue's history:
its records since a cursor (``read_events``), and what `stats` takes from
them, finished attempts and deferrals. The defaults here fold
``read_events``; stores with an archive, a results table or a summary of
their own override them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from statequeue.core.records import Record

if TYPE_CHECKING:
    from statequeue.stats.attempts import Attempt, AttemptBatch
    from statequeue.stats.figures import StatsBuilder


class EventReads(ABC):
    """History reads of ``Store``, with defaults over ``read_events``."""

    @abstractmethod
    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        """Records written since ``cursor`` (None: from the start) and the new cursor.
        After a compaction, continues from the new journal's snapshot."""

    def stats_summary(self) -> StatsBuilder | None:
        """Every finished attempt folded (what ``iter_attempt_batches()``
        yields, unfiltered), from a summary the store keeps up to date, or
        None (the default) when it keeps none: the caller then folds
        ``iter_attempt_batches`` itself. What `stats` and the live rate use."""
        return None

    def deferrals(self, since: float | None = None) -> int:
        """How many deferrals the store still records (those at ``since`` or
        later, when given): what ``stats`` counts under ``deferred``. This
        default counts those ``read_events`` gives (``deferrals_in``)."""
        return deferrals_in(self._all_events(), since)

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        """Every finished attempt (an ``end``, or a crash recovery), archived
        ones included, one small record each, streamed: memory does not grow
        with the queue. With ``since`` (epoch seconds), only those that ended
        then or later (a store may still yield older ones; callers filter).
        An empty queue yields nothing. Not a snapshot: attempts that finish
        meanwhile may or may not be included.

        This default reads every event through ``read_events``; stores with
        an archive or a results table override it."""
        # lazy: start-up time (enqueue never needs the stats modules)
        from statequeue.stats.attempts import attempts_of

        return attempts_since(attempts_of(self._all_events()), since)

    def iter_attempt_batches(self, since: float | None = None) -> Iterator[AttemptBatch]:
        """What ``iter_attempts`` yields, as column batches (what `stats` folds).
        Stores that can build the columns without a tuple per attempt override it."""
        from statequeue.stats.attempts import batches_of  # lazy: start-up time

        return batches_of(self.iter_attempts(since))

    def _all_events(self) -> Iterator[Record]:
        cursor: object | None = None
        while True:
            batch, cursor = self.read_events(cursor)
            if not batch:
                return
            yield from batch


def deferrals_in(records: Iterable[Record], since: float | None) -> int:
    """The deferrals among ``records`` (at ``since`` or later, when given):
    ``defer`` records, and those that compaction kept in a record's ``tries``."""
    found = 0
    for r in records:
        for d in (r, *r.get("tries", ())) if "tries" in r else (r,):
            found += d.get("t") == "defer" and (since is None or d.get("at", 0.0) >= since)
    return found


def attempts_since(attempts: Iterator[Attempt], since: float | None) -> Iterator[Attempt]:
    """The attempts that ended at ``since`` (epoch seconds) or later; all when None."""
    if since is None:
        return attempts
    return (a for a in attempts if a.ended_at is not None and a.ended_at >= since)
