"""The library API: ``Queue`` and the ``work()`` loop.

from statequeue import Queue

queue = Queue("crawl")
queue.enqueue(urls)
for item in queue.work():
    item.done(fetch(item.item))

``Queue`` is the surface users call, each method a thin call: ``SharedStore``
holds the store (thread turns, reopening after a fork, closing), and what is
more than one store call lives beside it (``queue_reading``, ``queue_whole``,
``transfer``, ``work``, ``work_async``). What work loops call for each
attempt is inherited from ``QueueAttempts`` (queue_attempts.py), the reading
methods from ``QueueReads`` (queue_reads.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from statequeue.api import queue_reading as reading
from statequeue.api.compaction import compact_store
from statequeue.api.queue_attempts import QueueAttempts
from statequeue.api.queue_reads import QueueReads
from statequeue.api.queue_whole import check_store, drop_store
from statequeue.api.shared_store import SharedStore
from statequeue.api.user_states import cancel_items, retry_items
from statequeue.core.errors import UsageError
from statequeue.core.items import MAX_ITEM_BYTES as MAX_ITEM_BYTES  # re-exported: public API
from statequeue.core.items import check_item as check_item
from statequeue.core.items import check_items
from statequeue.core.models import (
    EnqueueResult,
    ItemState,
    OnInterrupted,
    item_state,
)
from statequeue.core.rates import DEFAULT_MAX_DEFERRALS, RateLimit, as_rate
from statequeue.store.base import RETRYABLE, Store

KEEP_LOGS = 7 * 86400.0
"""Seconds the logs of a finished item are kept before ``compact`` removes them."""

if TYPE_CHECKING:
    from statequeue.api.transfer import CheckedExport, ImportResult
    from statequeue.api.work import (
        WorkItem as WorkItem,  # re-exported: public API (see __getattr__)
    )
    from statequeue.api.work_async import AsyncWorkItem
    from statequeue.core.views import (
        CompactResult,
        QueueCheck,
        RetryReport,
        Status,
    )
    from statequeue.stats.figures import Stats
    from statequeue.stats.report_model import Report


def __getattr__(name: str) -> object:
    # The work loop (and its traceback logging) loads on first use: `enqueue`
    # never needs it. ``WorkItem`` stays importable from here (public API).
    if name == "WorkItem":
        from statequeue.api.work import WorkItem  # lazy: start-up time

        return WorkItem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _state_set(states: object) -> frozenset[ItemState]:
    """``states`` (one state or its name, or a collection of them) as ItemStates;
    UnknownState for anything else."""
    if isinstance(states, str) or not isinstance(states, Iterable):
        return frozenset({item_state(states)})
    return frozenset(item_state(s) for s in states)


class Queue(QueueAttempts, QueueReads):
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
        self._shared = SharedStore.open(
            name, home=home, create=create, store=store, auto_compact=auto_compact, lease=lease
        )
        self.name = self._shared.name
        # Open work() loops: closed first by close(), so their items go back
        # while the store is still open (else recovery counted a crash).
        # (A loop is its process's: a forked child must not give back the parent's items.)
        self._loops: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    @property
    def store(self) -> Store:
        """The store, for this process (reopened after a fork) and while open.

        Calls made on it directly are not serialised between threads; the
        Queue's own methods are."""
        return self._shared.store

    @property
    def path(self) -> Path | None:
        """The queue's folder, for a store that has one."""
        return self._shared.opened.folder

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._shared.closed

    def close(self) -> None:
        """Release the queue's files; later calls raise QueueClosed. Idempotent.
        A ``work()`` loop still open first gives back its item, as leaving
        the loop does (a program that ends holding one leaves no claim)."""
        me = os.getpid()
        for loop, pid in list(self._loops.items()):
            if pid == me:
                with contextlib.suppress(Exception):  # running in another thread: recovery's
                    loop.close()
        self._shared.close()

    def notices(self) -> list[str]:
        """Messages for the user, such as a torn tail repaired on open."""
        with self._shared.using() as store:
            return store.notices()

    def enqueue(self, items: Iterable[str]) -> EnqueueResult:
        """Add each item not already in the queue; returns how many were added and skipped.

        Every item is checked before anything is written, so bad input changes nothing.
        A single str (or bytes) is refused: it would add each of its characters.
        """
        refuse_single_text(items, "enqueue")
        checked = check_items(items)
        with self._shared.using() as store:
            return store.enqueue(checked)

    def status(self) -> Status:
        """Counts per state, live runners, recent failures, held items."""
        with self._shared.using() as store:
            status = store.status()
            pace = store.pace()  # the shared start rate lives beside the records
        return status if pace is None else replace(status, pace=pace)

    def compact(self, *, keep_logs: float = KEEP_LOGS) -> CompactResult:
        """Rewrite the journal as a snapshot; finished results move to the
        archive. First the logs of finished items older than ``keep_logs``
        seconds are removed (0: all of them; ``math.inf``: none): that needs
        no space, so on a full disk it frees what the rewrite needs."""
        if (
            isinstance(keep_logs, bool)
            or not isinstance(keep_logs, int | float)
            or not keep_logs >= 0
        ):
            # as `compact --keep-logs -1d` is refused: -1 removed every log, NaN none
            raise UsageError(f"keep_logs must be a number of seconds >= 0, not {keep_logs!r}")
        with self._shared.using() as store:
            return compact_store(store, keep_logs)

    def retry(
        self,
        ids: Sequence[int] | None = None,
        *,
        states: Collection[ItemState | str] | ItemState | str = RETRYABLE,
    ) -> list[int]:
        """Put failed or held items back as pending: ``ids``, or every item in
        ``states`` (members or names; one alone is fine; UnknownState for
        another); returns the ids changed (see ``Store.retry``), with those
        named whose runner died during their ``--verify`` check, which are
        recovered as pending (see ``retry_report``)."""
        return self.retry_report(ids, states=states).changed

    def retry_report(
        self,
        ids: Sequence[int] | None = None,
        *,
        states: Collection[ItemState | str] | ItemState | str = RETRYABLE,
    ) -> RetryReport:
        """``retry``, telling the items it put back from those it found
        interrupted during their ``--verify`` check and recovered as pending."""
        wanted = None if ids is None else reading.item_ids(ids)
        with self._shared.using() as store:  # what a dead runner left is recovered first
            return retry_items(store, wanted, _state_set(states))

    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Cancel pending, failed or held items; returns the ids changed."""
        wanted = reading.item_ids(ids)
        with self._shared.using() as store:  # what a dead runner left is recovered first
            return cancel_items(store, wanted)

    def pause(self) -> None:
        """Stop runners (and ``work()`` loops) from taking new items; they finish what they hold."""
        with self._shared.using() as store:
            store.set_paused(True)

    def is_paused(self) -> bool:
        """True while the queue is paused (as this process last read the queue)."""
        with self._shared.using() as store:
            return store.is_paused()

    def resume(self) -> None:
        """Let runners take items again after ``pause()``."""
        with self._shared.using() as store:
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
        rate: RateLimit | str | float | None = None,
        max_deferrals: int = DEFAULT_MAX_DEFERRALS,
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

        ``rate`` (``"20/s"``, or starts per second) paces the claims with
        every runner of the queue (``run --rate``); ``raise TryLater(seconds)``
        inside ``with item:``, or ``item.later(seconds)``, puts the item back
        without spending a retry, up to ``max_deferrals`` times.
        """
        from statequeue.api.work import WorkPolicy, work_loop  # lazy: start-up time

        policy = WorkPolicy(
            retries=retries,
            retry_delay=retry_delay,
            retry_max_delay=retry_max_delay,
            on_interrupted=on_interrupted,
            max_crashes=max_crashes,
            rate=as_rate(rate),
            max_deferrals=max_deferrals,
        )
        loop = work_loop(self, policy, verify)
        self._loops[loop] = os.getpid()
        return loop

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
        from statequeue.api.work import WorkPolicy  # lazy: start-up time
        from statequeue.api.work_async import work_loop_async  # lazy: start-up time (asyncio)

        policy = WorkPolicy(
            retries=retries,
            retry_delay=retry_delay,
            retry_max_delay=retry_max_delay,
            on_interrupted=on_interrupted,
            max_crashes=max_crashes,
        )
        return work_loop_async(self, policy, concurrency, verify)

    def stats(self, since: float | None = None, *, now: float | None = None) -> Stats:
        """What the queue's runs did: durations, throughput, rate and ETA,
        failure reasons, the slowest items, runners and hosts, computed in one
        streaming pass over every finished attempt (archive included). With
        ``since`` (seconds), only attempts that ended in that last stretch."""
        return reading.queue_stats(self._shared, _seconds_back(since), now)

    def report(self, since: float | None = None, *, now: float | None = None) -> Report:
        """What `statequeue report` draws: counts, throughput, a timeline of
        attempts, durations, failures grouped by reason, the slowest, most
        retried and interrupted items (``statequeue.stats.report_model``).
        With ``since`` (seconds), only attempts that ended in that stretch."""
        # lazy: start-up time (the report's modules; only `report` needs them)
        from statequeue.api.report_data import gather_report

        return gather_report(self._shared, _seconds_back(since), now)

    # -- the whole queue: check, drop, export, import -------------------------

    def fsck(self, *, repair: bool = False) -> QueueCheck:
        """Check the queue; ``repair`` salvages (journal) or corrects (counters).

        A local journal gets a ``FsckReport`` (every record's checksum and
        sequence; see ``statequeue.api.maintenance.fsck_queue`` for a queue too
        damaged to open), a PostgreSQL store a ``StoreCheck`` (its counters
        against a recount). Both are ``QueueCheck``s: ``damaged``,
        ``repaired``, ``report_lines()``, ``to_json()``."""
        with self._shared.using() as store:
            return check_store(store, repair=repair)

    def drop(self) -> None:
        """Delete the queue with all its items, results and logs, then close it.
        UsageError while a runner is active on it."""
        with self._shared.using() as store:
            drop_store(self.name, store, before=self.close)

    def export(self, to: IO[bytes] | str | os.PathLike[str]) -> int:
        """Write the queue as NDJSON (see ``statequeue.api.transfer``) to a binary
        stream, or to a file path whole or not at all; returns the item count."""
        # lazy: start-up time (the export format; enqueue and work never need it)
        from statequeue.api.transfer import export_queue, export_to_file

        if isinstance(to, str | os.PathLike):
            return export_to_file(self, Path(to))
        if isinstance(to, io.TextIOBase):
            # sys.stdout: a TypeError from its write() came out of the export.
            raise UsageError("export writes bytes: pass a binary stream (sys.stdout.buffer, 'wb')")
        return export_queue(self, to)

    def import_(
        self, source: Iterable[bytes] | CheckedExport, *, merge: bool = False
    ) -> ImportResult:
        """Read an export (its lines, each ending in a newline, or one checked
        by ``transfer.read_export``) into the queue, keeping ids, states and
        results. The whole input is checked before anything changes; a queue
        holding items the export lacks is refused (ImportRefused) unless ``merge``."""
        # lazy: start-up time (the export format; enqueue and work never need it)
        from statequeue.api.transfer import CheckedExport, import_entries, read_export

        if isinstance(source, str | bytes | bytearray) or not (
            isinstance(source, CheckedExport) or hasattr(source, "__iter__")
        ):
            given = (
                "one str or bytes"
                if isinstance(source, str | bytes | bytearray)
                else type(source).__name__
            )
            raise UsageError(
                "import_ takes an export's lines (an open binary file, or "
                f"data.splitlines(keepends=True)), not {given}"
            )
        checked = source if isinstance(source, CheckedExport) else read_export(source)
        return import_entries(self, checked.header, checked.entries, merge=merge)


def _seconds_back(since: float | None) -> float | None:
    """``since`` of ``stats`` and ``report``: None, or seconds >= 0. "1d"
    raised a TypeError deep in the fold, and -5 or NaN were taken."""
    if since is None:
        return None
    if isinstance(since, bool) or not isinstance(since, int | float) or not since >= 0:
        raise UsageError(f"since must be a number of seconds >= 0 (or None), not {since!r}")
    if since == float("inf"):
        return None  # every attempt, as None
    return float(since)
