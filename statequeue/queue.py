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
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statequeue.errors import ItemNotSettled, ItemTooLarge, UsageError
from statequeue.identity import new_runner
from statequeue.location import resolve_home, resolve_queue_name
from statequeue.models import (
    Claim,
    EnqueueResult,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.store.base import RecordStore

if TYPE_CHECKING:
    from statequeue.views import CompactResult, Status

MAX_ITEM_BYTES = 65536
"""The largest item, in bytes once encoded (Linux limits one argv element to 128 KiB)."""


def check_item(item: str) -> str:
    """Return ``item`` if it can be queued, else raise a UsageError subclass."""
    if not item:
        raise UsageError("empty item")
    if "\0" in item:
        raise UsageError("item contains a NUL byte, which no command argument can hold")
    if len(item) <= MAX_ITEM_BYTES // 4:  # 4 bytes per character at most: surely fits
        return item
    size = len(os.fsencode(item))
    if size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"item of {size} bytes exceeds the {MAX_ITEM_BYTES}-byte limit")
    return item


def check_items(items: Iterable[str]) -> list[str]:
    """``check_item`` for each of ``items``, with the common case (short texts,
    no NUL, none empty) decided by C-level passes over the whole list."""
    checked = list(items)
    short = max(map(len, checked), default=0) <= MAX_ITEM_BYTES // 4
    if short and all(checked) and "\0" not in "".join(checked):
        return checked
    return [check_item(i) for i in checked]


def queue_folder(name: str | None = None, home: str | os.PathLike[str] | None = None) -> Path:
    """The folder of queue ``name`` under ``home`` (both resolved as the CLI does)."""
    return resolve_home(home) / resolve_queue_name(name)


class Queue:
    """A durable queue, opened by name under a home folder.

    ``create=False`` raises QueueNotFound instead of creating a missing queue.
    ``auto_compact``: dead records that trigger compaction as results are
    recorded (0 turns it off; default $STATEQUEUE_AUTO_COMPACT or 100,000).
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        create: bool = True,
        store: RecordStore | None = None,
        auto_compact: int | None = None,
    ) -> None:
        if store is None:
            from statequeue.store.journal_store import JournalStore

            store = JournalStore(queue_folder(name, home), create=create, auto_compact=auto_compact)
        self.store = store
        self.name = store.name

    @property
    def path(self) -> Path | None:
        """The queue's folder, for a store that has one."""
        folder = getattr(self.store, "folder", None)
        return folder if isinstance(folder, Path) else None

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()

    def notices(self) -> list[str]:
        """Messages for the user, such as a torn tail repaired on open."""
        return self.store.notices()

    def enqueue(self, items: Iterable[str]) -> EnqueueResult:
        """Add each item not already in the queue; returns how many were added and skipped.

        Every item is checked before anything is written, so bad input changes nothing.
        """
        return self.store.enqueue(check_items(items))

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
        return self.store.claim(
            runner, on_interrupted=on_interrupted, max_crashes=max_crashes, among=among
        )

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        """Record an attempt's outcome durably; returns the item's new state."""
        return self.store.finish(claim, outcome, retry_at=retry_at, sync=sync)

    def status(self) -> Status:
        return self.store.status()

    def compact(self) -> CompactResult:
        return self.store.compact()

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
        self.store.register_runner(runner)
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
            if current is not None and not current.settled:
                self.store.release(current.claim, "abandoned: the work loop stopped early")
            self.store.unregister_runner(runner.runner_id)


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
