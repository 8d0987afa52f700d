"""The store interface: one documented contract for every backend.

Nothing above this module may assume files, flock or a single host: the
journal, memory and PostgreSQL stores implement the same ``Store`` methods.
The record-replay logic the journal and memory stores share is in
``record_store``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

from statequeue.models import Claim, EnqueueResult, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.records import Record

if TYPE_CHECKING:  # views are imported where built: enqueue never needs them
    from statequeue.attempts import Attempt, AttemptBatch
    from statequeue.views import (
        ActiveRunner,
        CompactResult,
        ItemHistory,
        ItemResult,
        ItemView,
        RecoveryReport,
        Status,
    )

RETRYABLE = (ItemState.FAILED, ItemState.HELD)


class Store(ABC):
    """A queue's durable state. Every method is atomic with respect to other
    processes using the same queue; none prints or exits."""

    name: str

    @abstractmethod
    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        """Add the items not already in the queue (same text, in any state, even
        archived), in order. Durable before it returns. An empty sequence adds 0."""

    @abstractmethod
    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        """Recover items whose runner died, then atomically claim the lowest-id
        due pending item for ``runner`` (only ids in ``among``, when given) and
        record its start. An item whose earlier attempt still has a live
        process is skipped. Returns None when no item is due (an empty queue
        returns None)."""

    @abstractmethod
    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        """Record the attempt's outcome, durably (fsync) when ``sync``, before
        returning the item's new state. ``retry_at`` puts a failed item back as
        pending, due at that wall-clock time. Releases the claim."""

    @abstractmethod
    def release(self, claim: Claim, reason: str, *, uncounted: bool = False) -> None:
        """Give a claimed item back as pending without counting a crash (the
        runner was stopped by a signal). With ``uncounted`` the attempt never
        began (the runner could not start it): it does not count either, and
        its number is given out again. Releases the claim."""

    @abstractmethod
    def sync(self) -> None:
        """Make every record written so far durable (for group commit)."""

    @abstractmethod
    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        """Record that ``runner`` is active until ``unregister_runner`` or its death.
        With ``exclusive``, atomically refuse (RunnerActive) if another is alive."""

    @abstractmethod
    def unregister_runner(self, runner_id: str) -> None:
        """Record that the runner stopped cleanly."""

    @abstractmethod
    def active_runners(self) -> list[ActiveRunner]:
        """Runners that are alive now (a dead runner is never listed)."""

    @abstractmethod
    def status(self) -> Status:
        """Counts per state, live runners, recent failures and held items."""

    @abstractmethod
    def compact(self) -> CompactResult:
        """Rewrite the state as a snapshot, moving finished results to an archive.
        Safe while other processes use the queue."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource; claims still held are left to recovery."""

    @abstractmethod
    def retry(
        self, ids: Sequence[int] | None, *, states: Collection[ItemState] = RETRYABLE
    ) -> list[int]:
        """Put failed or held items back as pending; returns the ids changed.

        ``ids``: raises ItemNotFound for an unknown id and UsageError for an item
        in another state; then nothing is changed. None: every item that is in
        one of ``states`` (failed or held) at the moment of the change, chosen
        and changed atomically, so items another process retried meanwhile are
        simply not chosen (no error)."""

    @abstractmethod
    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Mark pending, failed or held items cancelled: they never run. Same
        errors as ``retry``; a running item is refused (stop its runner first)."""

    @abstractmethod
    def set_paused(self, paused: bool) -> None:
        """While paused, ``claim`` returns None; runners finish what they hold."""

    @abstractmethod
    def is_paused(self) -> bool:
        """True while the queue is paused (as this process last saw it)."""

    @abstractmethod
    def next_due(self, among: Collection[int] | None = None) -> float | None:
        """The wall-clock time the earliest pending item waiting for a retry
        time comes due; None when none waits. With ``among``, only those ids,
        and a pending one with no retry time counts as due at 0.0."""

    @abstractmethod
    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        """Every item (or those in ``state``), in id order, archived ones included."""

    @abstractmethod
    def history(self, item_id: int) -> ItemHistory:
        """Every record about one item, its result and stderr tail. ItemNotFound if unknown."""

    @abstractmethod
    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        """The stored result of every finished item (done or failed, or only ``state``),
        archived ones included."""

    @abstractmethod
    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        """Records written since ``cursor`` (None: from the start) and the new cursor.
        After a compaction, continues from the new journal's snapshot."""

    @abstractmethod
    def notices(self) -> list[str]:
        """Messages for the user gathered since the last call (torn tails repaired)."""

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        """The output attempt ``attempt`` of item ``item_id`` logged, from byte
        ``offset`` on; None when it logged nothing (or the store keeps no logs)."""
        return None

    @abstractmethod
    def recover(
        self, *, on_interrupted: OnInterrupted = OnInterrupted.RETRY, max_crashes: int = 3
    ) -> RecoveryReport:
        """Apply the policy to items whose runner (and its children) are gone,
        atomically per item; returns what was done. ``claim`` does this too."""

    @abstractmethod
    def commands(self) -> list[list[str]]:
        """Command templates of earlier runs, oldest first (consecutive repeats merged)."""

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        """Every finished attempt (an ``end``, or a crash recovery), archived
        ones included, one small record each, streamed: memory does not grow
        with the queue. With ``since`` (epoch seconds), only those that ended
        then or later (a store may still yield older ones; callers filter).
        An empty queue yields nothing. Not a snapshot: attempts that finish
        meanwhile may or may not be included.

        This default reads every event through ``read_events``; stores with
        an archive or a results table override it."""
        from statequeue.attempts import attempts_of

        return attempts_since(attempts_of(self._all_events()), since)

    def iter_attempt_batches(self, since: float | None = None) -> Iterator[AttemptBatch]:
        """What ``iter_attempts`` yields, as column batches (what `stats` folds).
        Stores that can build the columns without a tuple per attempt override it."""
        from statequeue.attempts import batches_of

        return batches_of(self.iter_attempts(since))

    def _all_events(self) -> Iterator[Record]:
        cursor: object | None = None
        while True:
            batch, cursor = self.read_events(cursor)
            if not batch:
                return
            yield from batch


def attempts_since(attempts: Iterator[Attempt], since: float | None) -> Iterator[Attempt]:
    """The attempts that ended at ``since`` (epoch seconds) or later; all when None."""
    if since is None:
        return attempts
    return (a for a in attempts if a.ended_at is not None and a.ended_at >= since)
