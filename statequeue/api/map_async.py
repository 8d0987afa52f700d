"""asyncio: ``statequeue.map_async()``, the resumable map for a coroutine
function (see ``mapping`` for ``map``).

Every store call runs in a worker thread (``asyncio.to_thread``), never on the
event loop; a Queue is thread-safe. A slot (one of ``concurrency``) claims
its next item only after the result of its last one is durable, as in ``run``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from statequeue.api.map_names import QueueKey, default_queue, queue_key, refuse_nested, working_on
from statequeue.api.map_run import SETTLE_NAP, MapRun
from statequeue.api.queue import Queue
from statequeue.api.work import WorkPolicy
from statequeue.core.errors import UsageError
from statequeue.core.models import Claim
from statequeue.core.rates import RateLimit, as_rate
from statequeue.store.base import Store

R = TypeVar("R")


async def map_async(
    fn: Callable[[str], Awaitable[R]],
    items: Iterable[str],
    *,
    queue: str | Queue | None = None,
    concurrency: int = 16,
    retries: int = 0,
    retry_delay: float = 1.0,
    retry_max_delay: float = 300.0,
    rate: RateLimit | str | float | None = None,
    home: str | os.PathLike[str] | None = None,
    store: Store | str | None = None,
) -> list[R]:
    """``statequeue.map`` for a coroutine function: ``concurrency`` slots await
    ``fn(item)``; the store is used from worker threads only. Same resuming,
    ordering, retries, ``rate`` and ``TryLater`` as ``map``."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise UsageError(f"concurrency must be a whole number, at least 1, not {concurrency!r}")
    policy = WorkPolicy(
        retries=retries,
        retry_delay=retry_delay,
        retry_max_delay=retry_max_delay,
        rate=as_rate(rate),
    )
    owned = not isinstance(queue, Queue)
    if queue is None:
        queue = default_queue(fn, "map_async")
    q = queue if isinstance(queue, Queue) else await _open(queue, home, store)
    try:
        run = MapRun(q, items, policy)
        await asyncio.to_thread(run.plan)
        key = queue_key(q)
        refuse_nested(key, run.left_ids(), run.text_of)
        await asyncio.to_thread(q.register_runner, run.runner)
        try:
            # No more slots than items to run: each idle slot's claim is a
            # worker-thread call (concurrency=10**5 for two items took 15 s).
            await _run_all(run, fn, key, max(1, min(concurrency, run.left)))
        finally:
            if not q.closed:
                await asyncio.shield(asyncio.to_thread(q.unregister_runner, run.runner.runner_id))
        return run.outcome()
    finally:
        if owned:
            await asyncio.shield(asyncio.to_thread(q.close))


async def _open(
    name: str | None, home: str | os.PathLike[str] | None, store: Store | str | None
) -> Queue:
    return await asyncio.to_thread(lambda: Queue(name, home=home, store=store))


async def _run_all(
    run: MapRun, fn: Callable[[str], Awaitable[Any]], key: QueueKey, concurrency: int
) -> None:
    while not run.finished:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(_slot(run, fn, key))
        if not await asyncio.to_thread(run.settle_rest):
            await asyncio.sleep(SETTLE_NAP)


async def _slot(run: MapRun, fn: Callable[[str], Awaitable[Any]], key: QueueKey) -> None:
    """Take items one at a time; each result is durable before the next claim."""
    while True:
        got = await _off_loop_claim(run)
        if got is None:
            return
        if isinstance(got, float):
            await asyncio.sleep(got)
            continue
        try:
            with working_on(key, got.item_id):  # a call inside fn for this item is refused
                value = await fn(got.item)
        except Exception as exc:
            await _recorded(run, got, run.record_failure, exc)
            continue
        except BaseException:
            run.give_back(got, "interrupted: the map was stopped")
            raise
        await _recorded(run, got, run.record, value)


async def _recorded(
    run: MapRun, claim: Claim, record: Callable[[Claim, Any], None], what: Any
) -> None:
    """``record(claim, what)`` off the loop; if it fails (a full disk, a store
    error), the item is given back (best effort) before the error goes on."""
    try:
        await asyncio.to_thread(record, claim, what)
    except BaseException:
        await asyncio.shield(
            asyncio.to_thread(
                run.give_back_unsettled, claim, "interrupted: the map stopped on an error"
            )
        )
        raise


async def _off_loop_claim(run: MapRun) -> Claim | float | None:
    """``run.take_once()`` off the loop; a claim made after this slot was
    cancelled is given back before the cancellation goes on."""
    future = asyncio.ensure_future(asyncio.to_thread(run.take_once))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        got = await future
        if isinstance(got, Claim):
            run.give_back(got, "interrupted: the map was stopped")
        raise


__all__ = ["map_async"]
