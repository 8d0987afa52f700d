"""The library API: ``Queue`` and the ``work()`` loop.

from statequeue import Queue

queue = Queue("crawl")
queue.enqueue(urls)
for item in queue.work():
    item.done(fetch(item.item))
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.api.queue_reading import QueueReading
from statequeue.api.queue_whole import QueueWhole
from statequeue.api.work import WorkItem as WorkItem  # re-exported: public API
from statequeue.api.work import WorkPolicy, work_loop
from statequeue.core.errors import (
    InvalidQueueName,
    QueueClosed,
    QueueForked,
    UsageError,
)
from statequeue.core.items import MAX_ITEM_BYTES as MAX_ITEM_BYTES  # re-exported: public API
from statequeue.core.items import check_item as check_item
from statequeue.core.items import check_items
from statequeue.core.location import resolve_home, resolve_queue_name
from statequeue.core.models import (
    Claim,
    EnqueueResult,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
    item_state,
)
from statequeue.core.records import check_json, check_reason
from statequeue.store.base import RETRYABLE, Store
from statequeue.store.opening import chosen_url

if TYPE_CHECKING:
    from statequeue.api.work_async import AsyncWorkItem
    from statequeue.core.views import CompactResult, Status
    from statequeue.stats.figures import Stats


def refuse_single_text(items: object, what: str) -> None:
    """UsageError for a str or bytes given where an iterable of items belongs
    (it would add each of its characters), or anything that is not iterable."""
    if isinstance(items, str | bytes | bytearray):
        raise UsageError(
            f"{what} takes an iterable of items, not one {type(items).__name__}: "
            f"write {what}([text]) to add one item"
        )
    if not isinstance(items, Iterable):
        raise UsageError(f"{what} takes an iterable of items, not {type(items).__name__}")


def queue_folder(name: str | None = None, home: str | os.PathLike[str] | None = None) -> Path:
    """The folder of queue ``name`` under ``home`` (both resolved as the CLI does)."""
    return resolve_home(home) / resolve_queue_name(name)


def _check_location(name: object, home: object) -> None:
    """InvalidQueueName / UsageError for a name or home of the wrong type
    (they would fail deep inside as a TypeError)."""
    if name is not None and not isinstance(name, str):
        raise InvalidQueueName(f"queue name must be a str, not {type(name).__name__}")
    if home is not None and not isinstance(home, str | os.PathLike):
        raise UsageError(f"home must be a path (str or os.PathLike), not {type(home).__name__}")


def _state_set(states: object) -> frozenset[ItemState]:
    """``states`` (one state or its name, or a collection of them) as ItemStates;
    UnknownState for anything else."""
    if isinstance(states, str) or not isinstance(states, Iterable):
        return frozenset({item_state(states)})
    return frozenset(item_state(s) for s in states)


class Queue(QueueReading, QueueWhole):
    """A durable queue, opened by name under a home folder.

    ``create=False`` raises QueueNotFound instead of creating a missing queue.
    ``auto_compact``: dead records that trigger compaction as results are
    recorded (0 turns it off; default $STATEQUEUE_AUTO_COMPACT or 100,000).

    ``store``: a Store, or the URL of a PostgreSQL store (``postgresql://...``
    or a libpq conninfo); by default $STATEQUEUE_STORE, else the local journal.
    ``lease``: seconds a claim's lease lasts in a PostgreSQL store (default
    30; at least 0.5), renewed by a heartbeat thread while the item is held.

    A Queue may be shared by threads: its methods take turns on the store.
    After ``os.fork`` the child reopens the queue on first use (a queue built
    on a given ``store`` cannot be reopened: the child gets QueueForked).
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        create: bool = True,
        store: Store | str | None = None,
        auto_compact: int | None = None,
        lease: float | None = None,
    ) -> None:
        _check_location(name, home)
        self._reopen: Callable[[], Store] | None = None
        if store is None:
            store = chosen_url(None)
        if isinstance(store, str):
            store = self._open_postgres(store, name, home, create)
        elif store is None:
            from statequeue.store.journal.store import JournalStore

            folder = queue_folder(name, home)
            store = JournalStore(folder, create=create, auto_compact=auto_compact)
            self._reopen = lambda: JournalStore(folder, create=False, auto_compact=auto_compact)
        if lease is not None:  # claims' lease, in stores that have leases
            store.use_lease(lease)
        self._store = store
        self.name = store.name
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._closed = False

    def _open_postgres(
        self, url: str, name: str | None, home: str | os.PathLike[str] | None, create: bool
    ) -> Store:
        from statequeue.store.opening import open_postgres

        queue_name = resolve_queue_name(name)
        scratch = resolve_home(home) / ".postgres" / queue_name
        self._reopen = lambda: open_postgres(url, queue_name, create=False, scratch=scratch)
        return open_postgres(url, queue_name, create=create, scratch=scratch)

    @property
    def store(self) -> Store:
        """The store, for this process (reopened after a fork) and while open.

        Calls made on it directly are not serialised between threads; the
        Queue's own methods are."""
        if self._pid != os.getpid():
            self._after_fork()
        if self._closed:
            raise QueueClosed(f"queue {self.name!r} is closed")
        return self._store

    def _after_fork(self) -> None:
        # The parent's store shares its open files (and so its flocks) with
        # this process: using it here would let both write the journal at once.
        # It is dropped without close(), which could write under the parent's lock.
        if self._reopen is None:
            raise QueueForked(
                f"queue {self.name!r} was opened in process {self._pid}, before a fork; "
                "open a new Queue in this process"
            )
        if not self._closed:
            self._store = self._reopen()  # if this raises, the next call tries again
        self._lock = threading.RLock()  # another thread may have held it at the fork
        self._pid = os.getpid()

    @contextmanager
    def _using(self) -> Iterator[Store]:
        """The store, held by this thread for one call."""
        _ = self.store  # checks the process before taking a lock made before a fork
        with self._lock:
            yield self.store  # checked again: another thread may have closed it

    @property
    def path(self) -> Path | None:
        """The queue's folder, for a store that has one."""
        folder = getattr(self._store, "folder", None)
        return folder if isinstance(folder, Path) else None

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the queue's files; later calls raise QueueClosed. Idempotent."""
        if self._pid != os.getpid():
            self._closed = True  # the parent's files are the parent's to close
            return
        with self._lock:
            if not self._closed:
                self._closed = True
                self._store.close()

    def notices(self) -> list[str]:
        """Messages for the user, such as a torn tail repaired on open."""
        with self._using() as store:
            return store.notices()

    def enqueue(self, items: Iterable[str]) -> EnqueueResult:
        """Add each item not already in the queue; returns how many were added and skipped.

        Every item is checked before anything is written, so bad input changes nothing.
        A single str (or bytes) is refused: it would add each of its characters.
        """
        refuse_single_text(items, "enqueue")
        checked = check_items(items)
        with self._using() as store:
            return store.enqueue(checked)

    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        """Claim the next due pending item for ``runner`` (only ids in ``among``,
        when given), recovering dead runners' items first."""
        with self._using() as store:
            return store.claim(
                runner, on_interrupted=on_interrupted, max_crashes=max_crashes, among=among
            )

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        """Record an attempt's outcome durably; returns the item's new state.

        InvalidResult if the result or reason cannot be stored as JSON (nothing
        is recorded then, and the item stays claimed)."""
        check_json(outcome.result, "result")
        check_reason(outcome.reason)
        with self._using() as store:
            return store.finish(claim, outcome, retry_at=retry_at, sync=sync)

    def finish_and_claim(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        retry_at: float | None = None,
        runner: RunnerInfo,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> tuple[ItemState, Claim | None]:
        """``finish`` durably, then claim the next item for ``runner`` (see
        ``Store.finish_and_claim``: one locked section and one fsync where the
        store can). Returns the new state and the next claim, or None."""
        check_json(outcome.result, "result")
        check_reason(outcome.reason)
        with self._using() as store:
            return store.finish_and_claim(
                claim,
                outcome,
                retry_at=retry_at,
                runner=runner,
                on_interrupted=on_interrupted,
                max_crashes=max_crashes,
                among=among,
            )

    def status(self) -> Status:
        """Counts per state, live runners, recent failures, held items."""
        with self._using() as store:
            return store.status()

    def compact(self) -> CompactResult:
        """Rewrite the journal as a snapshot; finished results move to the archive."""
        with self._using() as store:
            return store.compact()

    def retry(
        self,
        ids: Sequence[int] | None = None,
        *,
        states: Collection[ItemState | str] | ItemState | str = RETRYABLE,
    ) -> list[int]:
        """Put failed or held items back as pending: ``ids``, or every item in
        ``states`` (members or names; one alone is fine; UnknownState for
        another); returns the ids changed (see ``Store.retry``)."""
        with self._using() as store:
            return store.retry(ids, states=_state_set(states))

    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Cancel pending, failed or held items; returns the ids changed."""
        with self._using() as store:
            return store.cancel(ids)

    def pause(self) -> None:
        """Stop runners (and ``work()`` loops) from taking new items; they finish what they hold."""
        with self._using() as store:
            store.set_paused(True)

    def is_paused(self) -> bool:
        """True while the queue is paused (as this process last read the queue)."""
        with self._using() as store:
            return store.is_paused()

    def resume(self) -> None:
        """Let runners take items again after ``pause()``."""
        with self._using() as store:
            store.set_paused(False)

    def work(
        self,
        *,
        retries: int = 0,
        retry_delay: float = 1.0,
        retry_max_delay: float = 300.0,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        verify: Callable[[WorkItem], bool] | None = None,
    ) -> Iterator[WorkItem]:
        """Yield pending items one at a time until none is left (waiting for
        items whose retry time has not come yet, and while the queue is paused).

        Settle each item before taking the next: ``item.done(result)``,
        ``item.fail(reason)``, or ``with item:`` (an exception inside fails the
        attempt and the loop goes on; see WorkItem). A failed attempt is
        retried ``retries`` times per episode, after ``retry_delay`` seconds,
        doubling up to ``retry_max_delay`` (as ``run --retries``). An item whose
        runner died is recovered per ``on_interrupted``; ``verify(item)`` is
        asked first and True records it done without yielding it.

        If the loop is left early (``break``, an exception, a crash), the
        unsettled item is given back and runs again next time.
        """
        policy = WorkPolicy(
            retries=retries,
            retry_delay=retry_delay,
            retry_max_delay=retry_max_delay,
            on_interrupted=on_interrupted,
            max_crashes=max_crashes,
        )
        return work_loop(self, policy, verify)

    def work_async(
        self,
        *,
        concurrency: int = 1,
        retries: int = 0,
        retry_delay: float = 1.0,
        retry_max_delay: float = 300.0,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        verify: Callable[[WorkItem], bool] | None = None,
    ) -> AsyncIterator[AsyncWorkItem]:
        """``work()`` for asyncio: ``async for item in queue.work_async(concurrency=16)``.

        Up to ``concurrency`` items are out at once: hand each to a task, which
        settles it (``await item.done(result)``, or ``async with item:``); a
        slot claims again only once its item's result is durable. The loop
        ends when no item is left and every item out is settled. Store calls
        run in worker threads, never on the event loop. Leaving the loop early
        gives back the items not settled yet. ``verify`` runs in a thread."""
        from statequeue.api.work_async import work_loop_async

        policy = WorkPolicy(
            retries=retries,
            retry_delay=retry_delay,
            retry_max_delay=retry_max_delay,
            on_interrupted=on_interrupted,
            max_crashes=max_crashes,
        )
        return work_loop_async(self, policy, concurrency, verify)

    # -- for work loops: thin calls on the store, one thread at a time --------

    def register_runner(self, runner: RunnerInfo) -> None:
        """Record that ``runner`` (a work loop in this process) is active."""
        with self._using() as store:
            store.register_runner(runner)

    def unregister_runner(self, runner_id: str) -> None:
        """Record that the runner stopped cleanly."""
        with self._using() as store:
            store.unregister_runner(runner_id)

    def release(self, claim: Claim, reason: str, *, uncounted: bool = False) -> None:
        """Give a claimed item back as pending, not counted as a failure (durable);
        ``uncounted``: its attempt never began (see ``Store.release``)."""
        with self._using() as store:
            store.release(claim, reason, uncounted=uncounted)

    def stats(self, since: float | None = None, *, now: float | None = None) -> Stats:
        """What the queue's runs did: durations, throughput, rate and ETA,
        failure reasons, the slowest items, runners and hosts, computed in one
        streaming pass over every finished attempt (archive included). With
        ``since`` (seconds), only attempts that ended in that last stretch."""
        import time

        from statequeue.stats.figures import StatsBuilder, stats_of_batches

        now = time.time() if now is None else now
        cutoff = None if since is None else now - since
        with self._using() as store:
            status = store.status()
            summary = getattr(store, "stats_summary", None)
            if since is None and summary is not None:  # cached up to a position
                builder: StatsBuilder = summary()
                builder.now = now
                return builder.build(queue=status.queue, counts=status.counts, held=status.held)
            return stats_of_batches(
                store.iter_attempt_batches(cutoff),
                queue=status.queue,
                counts=status.counts,
                held=status.held,
                now=now,
                since=since,
            )

    def heartbeat(self, claim: Claim) -> None:
        """Tell the store ``claim`` is still held (a no-op for stores without leases)."""
        with self._using() as store:
            store.heartbeat(claim)

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        """When the earliest item waiting for a retry comes due (see ``Store.next_due``)."""
        with self._using() as store:
            return store.next_due(among)

    def sync(self) -> None:
        """Make every record written so far durable."""
        with self._using() as store:
            store.sync()
