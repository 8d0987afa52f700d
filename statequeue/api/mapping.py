"""A resumable map: ``statequeue.map(fn, items, queue="crawl")``.

The items go in a queue (deduplicated); only those with no stored result
run; each result is durable before its slot claims another item; results
come back in input order, those of earlier calls read back from the store.
Calling it again after a crash runs only what is left (at most the items
that were in flight run twice).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, overload

from statequeue.api.map_names import (
    QueueKey,
    default_queue,
    queue_key,
    refuse_nested,
    working_on,
)
from statequeue.api.map_run import SETTLE_NAP, MapRun
from statequeue.api.queue import Queue
from statequeue.api.work import WorkPolicy
from statequeue.core.errors import MapFailed, PoolBroken, UsageError
from statequeue.core.models import Claim
from statequeue.core.rates import RateLimit, as_rate
from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.api.pool_guard import ProcessPool

R = TypeVar("R")


@contextmanager
def opened(
    queue: str | Queue | None, home: str | os.PathLike[str] | None, store: Store | str | None
) -> Iterator[Queue]:
    """The Queue to map over: the one given, or one opened (and closed) here."""
    if isinstance(queue, Queue):
        yield queue
        return
    with Queue(queue, home=home, store=store) as q:
        yield q


@contextmanager
def registered(run: MapRun) -> Iterator[None]:
    """The run's runner, registered for its lifetime (so recovery knows it is alive)."""
    run.queue.register_runner(run.runner)
    try:
        yield
    finally:
        # Not in a process forked inside fn that left the map: the runner
        # is its parent's, still at work.
        if not run.queue.closed and os.getpid() == run.runner.pid:
            run.queue.unregister_runner(run.runner.runner_id)


def map(  # statequeue.map, as the issue names it: shadows the builtin here only
    fn: Callable[[str], R],
    items: Iterable[str],
    *,
    queue: str | Queue | None = None,
    jobs: int = 8,
    processes: bool = False,
    retries: int = 0,
    retry_delay: float = 1.0,
    retry_max_delay: float = 300.0,
    rate: RateLimit | str | float | None = None,
    home: str | os.PathLike[str] | None = None,
    store: Store | str | None = None,
) -> list[R]:
    """``[fn(item) for item in items]``, resumable: each result is recorded
    durably in ``queue`` before its slot takes another item, and a later call
    runs only the items that have no stored result (the others are read back).

    ``jobs`` threads call ``fn`` (or, with ``processes=True``, a pool of
    ``jobs`` processes: ``fn`` must be picklable, and the results are still
    recorded by this process; a call that kills its worker is a crash of its
    item, held after ``max_crashes``, and the map goes on with a fresh pool:
    PoolBroken only when a worker died and no item can be blamed, see
    ``statequeue help python``). An exception fails the attempt; it is retried
    per ``retries``/``retry_delay`` (as ``work()``). Failed items (and items
    cancelled by the user) are reported together at the end: MapFailed, with
    ``.failures`` [(item, reason)], ``.results`` (None where an item
    failed) and ``.errors`` {item: exception} (those raised in this call; the
    first is ``__cause__``). Each failed attempt's traceback is its log
    (`statequeue logs ID`). A later call gives failed items a new set of attempts.

    ``rate`` (``"20/s"``, or starts per second) paces the calls with every
    runner of the queue (``run --rate``); ``fn`` raising ``TryLater(seconds)``
    puts its item back without spending a retry (as ``work()``).

    Results are returned as stored (JSON values: a tuple comes back as a
    list); a result that is not JSON fails its item with InvalidResult.

    Without ``queue``, the results are kept in a queue named for ``fn``
    (map_names.py: ``crawl.fetch`` for ``fetch`` of ``crawl.py``).
    """
    if not callable(fn):
        # Refused before anything is written: each item was recorded failed
        # with "TypeError: 'NoneType' object is not callable".
        raise UsageError(f"fn must be a function (callable), not {type(fn).__name__}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"jobs must be a whole number, at least 1, not {jobs!r}")
    if processes:
        _check_picklable(fn)
    policy = WorkPolicy(
        retries=retries,
        retry_delay=retry_delay,
        retry_max_delay=retry_max_delay,
        rate=as_rate(rate),
    )
    with opened(default_queue(fn, "map") if queue is None else queue, home, store) as q:
        run = MapRun(q, items, policy)
        run.plan()
        key = queue_key(q)
        refuse_nested(key, run.left_ids(), run.text_of)
        with registered(run):
            _drive(run, fn, key, jobs, processes)
        return run.outcome()


def _drive(
    run: MapRun, fn: Callable[[str], Any], key: QueueKey, jobs: int, processes: bool
) -> None:
    """Run the slots until every item of ``run`` is settled. A process pool
    whose worker died while running an item (its attempt counted as a crash)
    is replaced by a fresh one, and the map goes on; PoolBroken when a
    worker died and no item's attempt could be blamed."""
    while not run.finished:
        # No more slots (threads, or processes in the pool) than items to run:
        # jobs=1000 for 3 items started 1000 threads; none are needed for none.
        slots = max(1, min(jobs, run.left))
        with _pool(processes, slots) as pool:
            call: Callable[[Claim], Any] = functools.partial(_in_thread, fn, key)
            halt: Callable[[], None] | None = None  # threads cannot be ended
            if pool is not None:
                call, halt = functools.partial(pool.call, fn), pool.stop
            while not run.finished and not run.broken:
                _run_slots(run, call, slots, halt)
                if run.error is not None:
                    raise run.error
                if not run.broken and not run.settle_rest():
                    time.sleep(SETTLE_NAP)
        broken, run.broken = run.broken, []
        if broken and not any(b.crashed for b in broken):
            raise broken[0]


def _check_picklable(fn: Callable[[str], Any]) -> None:
    """UsageError, before anything is enqueued or claimed, when ``fn`` cannot
    be sent to a pool process (a lambda, a nested function): else every item
    would be claimed and recorded as failed for a mistake of the call's."""
    import pickle  # lazy: start-up time (only a map with processes=True gets here)

    try:
        pickle.dumps(fn)
    except Exception as exc:  # PicklingError, AttributeError, TypeError: all the same mistake
        what = getattr(fn, "__qualname__", type(fn).__name__)
        raise UsageError(
            f"with processes=True, fn must be picklable (a function defined at the top "
            f"level of a module), and {what!r} is not: {exc}"
        ) from None


def _run_slots(
    run: MapRun, call: Callable[[Claim], Any], jobs: int, halt: Callable[[], None] | None
) -> None:
    """Run ``jobs`` slots until none finds an item to claim. On Ctrl-C the
    calls in flight end and record; on a second one, ``halt()`` ends them
    (a pool's workers) and they are waited for again, briefly."""
    stop = threading.Event()
    if jobs == 1:
        _slot(run, call, stop)
        return
    threads = [
        threading.Thread(target=_slot, args=(run, call, stop), name=f"statequeue-map-{n}")
        for n in range(jobs)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:
        # Ctrl-C: no slot takes another item; those running finish and record.
        stop.set()
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:
            if halt is None:
                raise
            halt()
            for t in threads:
                t.join()
            raise
        raise


def _slot(run: MapRun, call: Callable[[Claim], Any], stop: threading.Event) -> None:
    """Take items one at a time; each result is durable before the next claim."""
    claim = None
    try:
        while (claim := run.take(stop.is_set)) is not None:
            _attempt(run, call, claim)
    except PoolBroken as exc:  # its item is settled: the map decides (``_drive``)
        stop.set()
        run.broken.append(exc)
    except BaseException as exc:
        stop.set()
        if run.error is None:
            run.error = exc
        if claim is not None and os.getpid() == run.runner.pid:  # its result not recorded
            run.give_back_unsettled(claim, "interrupted: the map stopped on an error")
        if threading.current_thread() is threading.main_thread():
            raise


def _attempt(run: MapRun, call: Callable[[Claim], Any], claim: Claim) -> None:
    try:
        value = call(claim)
    except BaseException as exc:
        if os.getpid() != run.runner.pid:
            raise  # a fork made inside fn, leaving it: the item is its parent's
        if _recorded_failure(run, claim, exc):
            return
        raise
    if os.getpid() != run.runner.pid:
        # The same, returning: nothing is recorded from a fork, and it must
        # not go on with the map (claiming under its parent's runner).
        raise UsageError(
            f"a process forked inside map's function returned from it (item"
            f" {claim.item_id}, run by process {run.runner.pid}): it must exit instead"
        )
    run.record(claim, value)


def _recorded_failure(run: MapRun, claim: Claim, exc: BaseException) -> bool:
    """Record what a call that raised ``exc`` means for its item. True: a
    failure of the item, recorded (the slot goes on); False: the item is
    settled or given back, and the caller raises ``exc`` on."""
    if isinstance(exc, PoolBroken):
        if exc.crashed:  # its own worker died running it: as a crash of a run would
            run.record_crash(
                claim,
                f"interrupted: its map worker process {exc.how()} during attempt {claim.attempt}",
            )
        else:  # terminated by the pool, as every worker is once one dies
            run.give_back(claim, "abandoned: a worker process of the map died")
        return False
    if isinstance(exc, Exception):
        run.record_failure(claim, exc)
        return True
    run.give_back(claim, "interrupted: the map was stopped")
    return False


def _in_thread(fn: Callable[[str], Any], key: tuple[object, ...], claim: Claim) -> Any:
    with working_on(key, claim.item_id):  # a call inside fn for this item is refused
        return fn(claim.item)


@contextmanager
def _pool(processes: bool, jobs: int) -> Iterator[ProcessPool | None]:
    if not processes:
        yield None
        return
    from statequeue.api.pool_guard import process_pool  # lazy: start-up time (multiprocessing)

    with process_pool(jobs) as pool:
        yield pool


@overload
def resumable(queue: Callable[[str], R], /) -> Callable[[str], R]: ...


@overload
def resumable(
    queue: str | None = None,
    *,
    retries: int = 0,
    retry_delay: float = 1.0,
    home: str | os.PathLike[str] | None = None,
    store: Store | str | None = None,
) -> Callable[[Callable[[str], R]], Callable[[str], R]]: ...


def resumable(
    queue: str | Callable[[str], R] | None = None,
    *,
    retries: int = 0,
    retry_delay: float = 1.0,
    home: str | os.PathLike[str] | None = None,
    store: Store | str | None = None,
) -> Any:
    """A decorator: the function, called once per item, runs at most once to
    completion per item across runs. ``f(x)`` returns the stored result when
    ``x`` was done before (by any call or process), else runs ``f``, records
    its result durably and returns it; a failure (after ``retries``) raises
    ``f``'s own exception. An item that failed before is run again by a later
    call (a new set of attempts, as ``map`` gives it); MapFailed only when it
    failed in another process while this call waited for it. The queue is
    opened on the first call and kept open.

    ``@resumable`` alone (no parentheses) is ``@resumable()``: it returned
    the decorator itself, so ``f(x)`` gave back a function and ran nothing."""
    if callable(queue):
        return resumable()(queue)

    def decorate(fn: Callable[[str], R]) -> Callable[[str], R]:
        lock = threading.Lock()
        holder: list[Queue] = []

        name = default_queue(fn, "resumable") if queue is None else queue

        def the_queue() -> Queue:
            with lock:
                if not holder or holder[0].closed:
                    holder[:] = [Queue(name, home=home, store=store)]
                return holder[0]

        @functools.wraps(fn)
        def call(item: str) -> R:
            try:
                found = map(fn, [item], queue=the_queue(), jobs=1, retries=retries,
                            retry_delay=retry_delay)  # fmt: skip
            except MapFailed as failed:
                own = failed.errors.get(item)
                if own is None:
                    raise
            else:
                return found[0]
            # Raised outside the handler, so that MapFailed is not made its context:
            # `except KeyError` around the call fires, and the traceback is fn's.
            raise own

        return call

    return decorate


__all__ = ["MapRun", "map", "resumable"]
