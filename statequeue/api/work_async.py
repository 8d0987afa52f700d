"""asyncio: ``queue.work_async()`` (``statequeue.map_async()`` is in ``map_async``).

Every store call runs in a worker thread (``asyncio.to_thread``), never on the
event loop; a Queue is thread-safe. A slot (one of ``concurrency``) claims
its next item only after the result of its last one is durable, as in ``run``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from statequeue.api.work import (
    WorkItem,
    WorkPolicy,
    failure_reason,
    next_nap,
    verified,
)
from statequeue.core.errors import StateQueueError, TryLater, UsageError
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, RunnerInfo

if TYPE_CHECKING:
    from statequeue.api.queue import Queue

_T = TypeVar("_T")


class AsyncWorkItem:
    """One claimed item inside ``Queue.work_async()``; an async context manager
    with the semantics of WorkItem (``async with item:``). Settling frees the
    item's slot for the next claim, once the result is durable.

    ``done``, ``fail`` and ``release`` start their store call at once (in a
    thread) and return an awaitable of its outcome: an item settles even when
    that awaitable is never awaited, a common slip that would otherwise hold
    its slot, and the loop, forever. Await it to know the result is durable."""

    def __init__(self, item: WorkItem, slots: _Slots) -> None:
        self.sync_item = item
        self._slots = slots
        self._settling: _Settling[Any] | None = None
        self.given_back: BaseException | None = None
        """Set when the loop's end gave the item back: what a settle then raises."""

    @property
    def id(self) -> int:
        return self.sync_item.id

    @property
    def item(self) -> str:
        return self.sync_item.item

    @property
    def attempt(self) -> int:
        return self.sync_item.attempt

    @property
    def interrupted(self) -> bool:
        return self.sync_item.interrupted

    @property
    def settled(self) -> bool:
        return self.sync_item.settled or self.sync_item.released

    def done(self, result: Any = None) -> Awaitable[ItemState]:
        """Record success with ``result`` (any JSON value), durably (started
        now; await to wait for it)."""
        return self._settle(self.sync_item.done, result)

    def fail(self, reason: str = "failed", result: Any = None) -> Awaitable[ItemState]:
        """Record failure with ``reason``, durably (retried per the loop's
        policy; started now; await to wait for it)."""
        return self._settle(self.sync_item.fail, reason, result)

    def later(self, seconds: float | None = None) -> Awaitable[ItemState]:
        """Ask for the item to be tried later, not counted as a failure (see
        WorkItem.later; started now; await to wait for it)."""
        return self._settle(self.sync_item.later, seconds)

    def release(self, reason: str = "given back") -> Awaitable[None]:
        """Give the item back as pending, not counted as a failure (started
        now; await to wait for it)."""
        return self._settle(self.sync_item.release, reason)

    async def heartbeat(self) -> None:
        """See WorkItem.heartbeat."""
        await asyncio.to_thread(self.sync_item.heartbeat)

    def _settle(self, call: Callable[..., _T], *args: Any) -> _Settling[_T]:
        if self.given_back is not None:
            # The loop ended (cancelled, or left early) and gave the item back:
            # a cancellation goes on as one, never as a store error.
            raise self.given_back
        pending = self._settling
        if pending is not None and not pending.task.done():
            raise UsageError(f"item {self.id} is already being settled")
        settling = _Settling(asyncio.get_running_loop().create_task(self._call(call, *args)))
        settling.task.add_done_callback(settling.seen_by_loop)
        self._settling = settling
        return settling

    async def _call(self, call: Callable[..., _T], *args: Any) -> _T:
        try:
            value = await asyncio.to_thread(call, *args)
        except BaseException as exc:
            self._slots.failed(self, exc, self._settling)
            raise
        self._slots.settled(self)
        return value

    async def __aenter__(self) -> AsyncWorkItem:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if os.getpid() != self.sync_item.owner:
            return False  # a fork leaving the block: the item is its parent's (work.py)
        pending = self._settling
        if pending is not None and not pending.task.done():
            # A done() (or fail) not awaited inside the block: wait for it
            # here rather than settle the item a second time.
            if exc is None:
                await pending  # its error is the block's
            elif isinstance(exc, Exception):
                with suppress(Exception):  # the block's error goes on; the loop sees this one
                    await asyncio.shield(pending.task)
        if exc is None:
            if not self.settled:
                await self.done(None)
            return False
        if self.settled:
            return False
        if isinstance(exc, TryLater):  # not a failure: pending again, no retry spent
            await self.later(exc.seconds)
            return True
        if isinstance(exc, Exception):
            await self.fail(failure_reason(exc))
            return True
        # Cancelled or interrupted: give the item back without awaiting (a
        # cancelled task must not wait), then let the exception go on, never
        # a store error of the give-back (the loop's end may have raced it).
        with suppress(StateQueueError):
            self.sync_item.release(f"interrupted: {type(exc).__name__} inside the work item")
        self._slots.settled(self)
        return False


class _Settling(Awaitable[_T]):
    """What ``done``, ``fail`` and ``release`` return: their store call, a
    task started at once. ``awaited`` tells the loop whether someone will see
    its error (else the loop raises it)."""

    def __init__(self, task: asyncio.Task[_T]) -> None:
        self.task = task
        self.awaited = False

    def __await__(self) -> Generator[Any, None, _T]:
        self.awaited = True
        return self.task.__await__()

    def seen_by_loop(self, task: asyncio.Task[_T]) -> None:
        """Mark an error nobody awaits as retrieved: the loop raises it (``_Slots.failed``)."""
        if not self.awaited and not task.cancelled():
            task.exception()


class _Slots:
    """Items out for work, at most ``concurrency``; wakes the loop when one settles."""

    def __init__(self, concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            # As map_async says it: "3", None or 2.5 raised a TypeError here.
            raise UsageError(f"concurrency must be a whole number, at least 1, not {concurrency!r}")
        self.free = asyncio.Semaphore(concurrency)
        self.out: set[AsyncWorkItem] = set()
        # Items whose settling call failed: no longer holding a slot (else a
        # failure nobody awaited would stop the loop for good), given back
        # when the loop ends unless settled meanwhile.
        self.stuck: set[AsyncWorkItem] = set()
        self.unseen: BaseException | None = None
        self.changed = asyncio.Event()

    def settled(self, item: AsyncWorkItem) -> None:
        self.stuck.discard(item)
        if item in self.out:
            self.out.discard(item)
            self.free.release()
            self.changed.set()

    def failed(
        self, item: AsyncWorkItem, exc: BaseException, settling: _Settling[Any] | None
    ) -> None:
        """A settling call of ``item`` raised ``exc``: free its slot, and keep
        the error for the loop to raise if nobody awaits the call."""
        unseen = settling is not None and not settling.awaited
        if unseen and isinstance(exc, Exception) and self.unseen is None:
            self.unseen = exc  # a cancellation is the canceller's to see, not the loop's
        if item in self.out:
            self.out.discard(item)
            self.stuck.add(item)
            self.free.release()
            self.changed.set()

    def raise_unseen(self) -> None:
        """Raise the error of a settling call that nobody awaited, if any."""
        if self.unseen is not None:
            exc, self.unseen = self.unseen, None
            raise exc

    async def wait_for_one(self) -> None:
        self.changed.clear()
        await self.changed.wait()


async def work_loop_async(
    queue: Queue,
    policy: WorkPolicy,
    concurrency: int,
    verify: Callable[[WorkItem], bool] | None,
) -> AsyncIterator[AsyncWorkItem]:
    """The async generator behind ``Queue.work_async``."""
    slots = _Slots(concurrency)
    # In process: no claim's lock is handed on (RunnerInfo.in_process).
    runner = new_runner(command=("python", *sys.argv[:1]), in_process=True)
    await asyncio.to_thread(queue.register_runner, runner)
    cancelled = False
    try:
        while True:
            await slots.free.acquire()
            slots.raise_unseen()
            item = await _next_item(queue, runner, policy, verify, slots)
            if item is None:
                slots.free.release()
                if slots.out:
                    await slots.wait_for_one()
                    slots.raise_unseen()
                    continue
                nap = await asyncio.to_thread(next_nap, queue)
                if nap is None:
                    return
                await asyncio.sleep(nap)
                continue
            slots.out.add(item)
            yield item
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        await _end(queue, runner, slots, cancelled=cancelled)


async def _next_item(
    queue: Queue,
    runner: RunnerInfo,
    policy: WorkPolicy,
    verify: Callable[[WorkItem], bool] | None,
    slots: _Slots,
) -> AsyncWorkItem | None:
    def take() -> WorkItem | None:
        while True:
            claim = queue.claim(
                runner, on_interrupted=policy.on_interrupted, max_crashes=policy.max_crashes
            )
            if claim is None:
                return None
            item = WorkItem(queue, claim, policy)
            if not verified(item, verify):
                return item

    future = asyncio.ensure_future(asyncio.to_thread(take))
    try:
        found = await asyncio.shield(future)
    except asyncio.CancelledError:
        # The claim goes on in its thread: an item it took is given back
        # (on the loop, briefly: a cancelled task must not wait for a thread).
        taken = await future
        if taken is not None:
            taken.release("interrupted: the work loop was cancelled")
        raise
    return None if found is None else AsyncWorkItem(found, slots)


async def _end(queue: Queue, runner: RunnerInfo, slots: _Slots, *, cancelled: bool) -> None:
    """Give back the items not settled (the loop was left early) and unregister.
    A done() or fail() under way is waited for first (its store call runs on
    in its thread): if it fails (a full disk), its item is given back with
    the rest, rather than left recorded as running for recovery to count a
    crash. A later settle of an item given back here raises CancelledError
    when the loop was cancelled (its handler's task group is being cancelled
    too), else UsageError."""
    if queue.closed or os.getpid() != runner.pid:
        return  # closed; or a fork's copy of the loop, whose items are its parent's
    under_way = {
        item._settling.task
        for item in [*slots.out, *slots.stuck]
        if item._settling is not None and not item._settling.task.done()
    }
    # A cancellation meanwhile goes on once the items are back (_to_its_end).
    # Futures no task: `asyncio.run`'s shutdown cancels every task, and a
    # generator closed then (its object collected) would give nothing back.
    if under_way:
        stop = await _to_its_end(asyncio.gather(*under_way, return_exceptions=True))
    else:
        stop = None
    back = [
        item
        for item in [*slots.out, *slots.stuck]
        if not item.settled and (item._settling is None or item._settling.task.done())
    ]
    for item in back:
        item.given_back = (
            asyncio.CancelledError()
            if cancelled
            else UsageError(f"item {item.id} was given back: the work loop ended before it")
        )

    def end() -> None:
        for item in back:
            with suppress(StateQueueError):  # settled meanwhile after all: nothing to give back
                item.sync_item.release("abandoned: the work loop stopped early")
        queue.unregister_runner(runner.runner_id)

    stop = await _to_its_end(asyncio.get_running_loop().run_in_executor(None, end)) or stop
    if stop is not None:
        raise stop


async def _to_its_end(future: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait for ``future`` (the give-back's thread, the settles under way) to
    its end even when this task is cancelled meanwhile, and return that
    cancellation, for the caller to raise once its work is done: whoever
    caught it would close the queue under the give-back (a handler's error in
    a TaskGroup, found with a full disk: the items were left recorded as
    running, for recovery to count a crash). Raises ``future``'s own error."""
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if future.cancelled():  # never by this call: the caller's next step still runs
        return cancelled or asyncio.CancelledError()
    future.result()
    return cancelled


__all__ = ["AsyncWorkItem", "work_loop_async"]
