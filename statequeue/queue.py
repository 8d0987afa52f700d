"""The library API: ``Queue`` and the ``work()`` loop.

from statequeue import Queue

queue = Queue("crawl")
queue.enqueue(urls)
for item in queue.work():
    item.done(fetch(item.item))
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statequeue.errors import (
    ItemNotSettled,
    QueueClosed,
    QueueForked,
    UsageError,
)
from statequeue.identity import new_runner
from statequeue.items import MAX_ITEM_BYTES as MAX_ITEM_BYTES  # re-exported: public API
from statequeue.items import check_item as check_item
from statequeue.items import check_items
from statequeue.location import resolve_home, resolve_queue_name
from statequeue.models import (
    Claim,
    EnqueueResult,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.records import check_json
from statequeue.store.base import RETRYABLE, Store
from statequeue.store.opening import chosen_url

if TYPE_CHECKING:
    from statequeue.stats import Stats
    from statequeue.views import CompactResult, ItemHistory, ItemResult, ItemView, Status


def queue_folder(name: str | None = None, home: str | os.PathLike[str] | None = None) -> Path:
    """The folder of queue ``name`` under ``home`` (both resolved as the CLI does)."""
    return resolve_home(home) / resolve_queue_name(name)


class Queue:
    """A durable queue, opened by name under a home folder.

    ``create=False`` raises QueueNotFound instead of creating a missing queue.
    ``auto_compact``: dead records that trigger compaction as results are
    recorded (0 turns it off; default $STATEQUEUE_AUTO_COMPACT or 100,000).

    ``store``: a Store, or the URL of a PostgreSQL store (``postgresql://...``
    or a libpq conninfo); by default $STATEQUEUE_STORE, else the local journal.

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
    ) -> None:
        self._reopen: Callable[[], Store] | None = None
        if store is None:
            store = chosen_url(None)
        if isinstance(store, str):
            store = self._open_postgres(store, name, home, create)
        elif store is None:
            from statequeue.store.journal_store import JournalStore

            folder = queue_folder(name, home)
            store = JournalStore(folder, create=create, auto_compact=auto_compact)
            self._reopen = lambda: JournalStore(folder, create=False, auto_compact=auto_compact)
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
        """
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
        check_json(outcome.reason, "reason")
        with self._using() as store:
            return store.finish(claim, outcome, retry_at=retry_at, sync=sync)

    def status(self) -> Status:
        """Counts per state, live runners, recent failures, held items."""
        with self._using() as store:
            return store.status()

    def compact(self) -> CompactResult:
        """Rewrite the journal as a snapshot; finished results move to the archive."""
        with self._using() as store:
            return store.compact()

    def retry(
        self, ids: Sequence[int] | None = None, *, states: Collection[ItemState] = RETRYABLE
    ) -> list[int]:
        """Put failed or held items back as pending: ``ids``, or every item in
        ``states``; returns the ids changed (see ``Store.retry``)."""
        with self._using() as store:
            return store.retry(ids, states=states)

    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Cancel pending, failed or held items; returns the ids changed."""
        with self._using() as store:
            return store.cancel(ids)

    def items(self, state: ItemState | None = None) -> list[ItemView]:
        """Every item (or those in ``state``), in id order, as a list (the lock
        is not held while the caller iterates; ``store.items()`` streams)."""
        with self._using() as store:
            return list(store.items(state))

    def results(self, state: ItemState | None = None) -> list[ItemResult]:
        """The stored result of every finished item (or those in ``state``)."""
        with self._using() as store:
            return list(store.results(state))

    def history(self, item_id: int) -> ItemHistory:
        """Everything recorded about one item; ItemNotFound if unknown."""
        with self._using() as store:
            return store.history(item_id)

    def work(
        self,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
    ) -> Iterator[WorkItem]:
        """Yield pending items one at a time until none is left.

        Call ``item.done(result)`` or ``item.fail(reason)`` before taking the
        next one. If the loop is left early (``break``, an exception, a crash),
        the unsettled item is given back and runs again next time.
        """
        runner = new_runner(command=("python", *sys.argv[:1]))
        with self._using() as store:
            store.register_runner(runner)
        current: WorkItem | None = None
        try:
            while True:
                claim = self.claim(runner, on_interrupted=on_interrupted, max_crashes=max_crashes)
                if claim is None:
                    return
                current = WorkItem(self, claim)
                yield current
                if not current.settled:
                    raise ItemNotSettled(
                        f"item {claim.item_id} was neither done() nor fail()ed before the next"
                    )
                current = None
        finally:
            self._end_work(runner.runner_id, current)

    def _end_work(self, runner_id: str, current: WorkItem | None) -> None:
        if self._closed:
            return  # closing released the claim: recovery gives the item back
        with self._using() as store:
            if current is not None and not current.settled:
                store.release(current.claim, "abandoned: the work loop stopped early")
            store.unregister_runner(runner_id)

    def stats(self, since: float | None = None, *, now: float | None = None) -> Stats:
        """What the queue's runs did: durations, throughput, rate and ETA,
        failure reasons, the slowest items, runners and hosts, computed in one
        streaming pass over every finished attempt (archive included). With
        ``since`` (seconds), only attempts that ended in that last stretch."""
        import time

        from statequeue.stats import stats_of_batches

        now = time.time() if now is None else now
        cutoff = None if since is None else now - since
        with self._using() as store:
            status = store.status()
            return stats_of_batches(
                store.iter_attempt_batches(cutoff),
                queue=status.queue,
                counts=status.counts,
                held=status.held,
                now=now,
                since=since,
            )


class WorkItem:
    """One claimed item inside ``Queue.work()``."""

    def __init__(self, queue: Queue, claim: Claim) -> None:
        self.queue = queue
        self.claim = claim
        self.settled = False

    @property
    def id(self) -> int:
        return self.claim.item_id

    @property
    def item(self) -> str:
        return self.claim.item

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def interrupted(self) -> bool:
        """The previous attempt died with its process: check before redoing side effects."""
        return self.claim.interrupted

    def done(self, result: Any = None) -> None:
        """Record success with ``result`` (any JSON value), durably, before returning."""
        self._settle(Outcome(ok=True, result=result))

    def fail(self, reason: str = "failed", result: Any = None) -> None:
        """Record failure with ``reason``, durably, before returning."""
        self._settle(Outcome(ok=False, reason=reason, result=result))

    def _settle(self, outcome: Outcome) -> None:
        if self.settled:
            raise UsageError(f"item {self.id} is already settled")
        self.queue.finish(self.claim, outcome)
        self.settled = True
