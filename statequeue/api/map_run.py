"""One call of ``statequeue.map`` or ``map_async``: which items run, and what
came of each. The slots (threads, a process pool's feeders, asyncio tasks)
share it; the loops that drive them are in ``mapping`` and ``map_async``."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from statequeue.api import rate_limits
from statequeue.api.attempt_log import log_traceback
from statequeue.api.queue import Queue, refuse_single_text
from statequeue.api.work import WorkPolicy, failure_reason, next_nap, wait_for_due
from statequeue.core.errors import (
    InvalidResult,
    MapFailed,
    PoolBroken,
    StateQueueError,
    TryLater,
)
from statequeue.core.identity import new_runner
from statequeue.core.items import check_items
from statequeue.core.models import Claim, ItemState, Outcome
from statequeue.core.rates import delay_problem
from statequeue.core.records import check_json

WINDOW = 64
"""Ids offered to one claim: the lowest ones left (a claim scans what it is offered)."""
SETTLE_NAP = 0.2
"""How often a map looks again at its items that run in another process."""


class MapRun:
    """One call of map: which items to run, and what came of each.

    Thread-safe: slots (threads, or tasks through ``asyncio.to_thread``) call
    ``take``, ``record`` and ``record_failure``; each records durably before
    it returns, so a slot's result is on disk before it takes another item."""

    def __init__(self, queue: Queue, items: Iterable[str], policy: WorkPolicy) -> None:
        refuse_single_text(items, "map")
        self.texts = check_items(items)
        self.queue = queue
        self.policy = policy
        self.results: dict[str, Any] = {}
        self.failures: dict[str, str] = {}
        self.errors: dict[str, BaseException] = {}
        """The exception each item's latest attempt in this process raised."""
        self.error: BaseException | None = None
        """The first error that stopped a slot (not one the function raised)."""
        self.broken: list[PoolBroken] = []
        """How the calls in flight ended when the process pool broke (``mapping``)."""
        self._lock = threading.Lock()
        self._todo: deque[int] = deque()  # ids left to settle, lowest first
        self._left: dict[int, str] = {}  # id -> text, for the ids in _todo
        # ids a slot of this run holds now -> when claimed (monotonic): the
        # attempt's duration is from the claim, just before the call, to its record.
        self._held: dict[int, float] = {}
        self.runner = new_runner(command=("python", *sys.argv[:1]))

    # -- planning ------------------------------------------------------------------

    def plan(self) -> None:
        """Enqueue the items, read back earlier results, and choose what runs."""
        unique = list(dict.fromkeys(self.texts))
        self.queue.enqueue(unique)
        ids = self.queue.find_ids(unique)
        states = self.queue.states(ids.values())
        done: dict[int, str] = {}
        again: list[int] = []
        for text, item_id in ids.items():
            state = states.get(item_id, ItemState.DONE)
            if state is ItemState.DONE:
                done[item_id] = text
            elif state is ItemState.CANCELLED:
                self.failures[text] = "cancelled"
            else:
                # Failed and held items of an earlier call get a new episode.
                if state in (ItemState.FAILED, ItemState.HELD):
                    again.append(item_id)
                self._left[item_id] = text
        if again:
            self.queue.retry(again)
        self._todo.extend(sorted(self._left))
        self._read_back(done)

    def _read_back(self, done: dict[int, str]) -> None:
        """The stored results of items ``done`` (id -> text)."""
        # Only these items' results (an item at a time when they are few
        # beside the queue): a resumable call read back every result of the
        # queue, so a loop resuming over N done items cost O(N^2).
        for item_id, r in self.queue.results_of(done).items():
            if r.state is ItemState.DONE:
                self.results[done[item_id]] = r.result

    def left_ids(self) -> set[int]:
        """The ids this call still has to settle (after ``plan``: what will run)."""
        with self._lock:
            return set(self._left)

    def text_of(self, item_id: int) -> str:
        """The text of item ``item_id`` of this call."""
        with self._lock:
            return self._left.get(item_id, str(item_id))

    @property
    def finished(self) -> bool:
        with self._lock:
            return not self._left

    @property
    def left(self) -> int:
        """How many items are still to settle (after ``plan``: what will run)."""
        with self._lock:
            return len(self._left)

    # -- slots ---------------------------------------------------------------------

    def take(self, stopping: Callable[[], bool] = lambda: False) -> Claim | None:
        """Claim the next item of this run, waiting for retries that come due;
        None when none is left to claim (or ``stopping()``)."""
        while not stopping() and self.error is None:
            if not self._anything_to_claim():
                return None  # before the rate's start: the last slot took one and slept a period
            wait = rate_limits.start_wait(self.queue, self.policy.rate)
            if wait > 0:
                time.sleep(wait)
                continue
            claim = self._claim(self._window()) or self._claim(self._unheld())
            if claim is not None:
                return claim
            if not wait_for_due(self.queue, self._unheld()):
                return None
        return None

    def take_once(self) -> Claim | float | None:
        """One try of ``take`` that never sleeps: a claim, None (nothing left
        to claim), or the seconds to wait before trying again."""
        if not self._anything_to_claim():
            return None  # as in ``take``: no start is taken from the rate for nothing
        wait = rate_limits.start_wait(self.queue, self.policy.rate)
        if wait > 0:
            return wait
        claim = self._claim(self._window()) or self._claim(self._unheld())
        if claim is not None:
            return claim
        return next_nap(self.queue, self._unheld())

    def _claim(self, among: list[int]) -> Claim | None:
        if not among:
            return None
        policy = self.policy
        claim = self.queue.claim(
            self.runner,
            on_interrupted=policy.on_interrupted,
            max_crashes=policy.max_crashes,
            among=among,
        )
        if claim is not None:
            with self._lock:
                self._held[claim.item_id] = time.monotonic()
        return claim

    def _window(self) -> list[int]:
        """The lowest ids left that no slot holds, at most WINDOW of them."""
        with self._lock:
            todo, left = self._todo, self._left
            while todo and todo[0] not in left:
                todo.popleft()  # settled: amortised O(1) per item
            window = []
            for item_id in todo:
                if item_id in left and item_id not in self._held:
                    window.append(item_id)
                    if len(window) == WINDOW:
                        break
            return window

    def _anything_to_claim(self) -> bool:
        """Whether an item of this run is left that no slot of it holds (held
        ids are always among those left, so the counts tell, in O(1))."""
        with self._lock:
            return len(self._left) > len(self._held)

    def _unheld(self) -> list[int]:
        with self._lock:
            return [i for i in self._left if i not in self._held]

    def record(self, claim: Claim, value: Any) -> None:
        """Record ``value`` as the item's result, durably; a value that is not
        JSON fails the item (InvalidResult) instead."""
        try:
            check_json(value)
        except InvalidResult as exc:
            self.record_failure(claim, exc)
            return
        stored = orjson.loads(orjson.dumps(value))  # what a later call reads back
        rate_limits.succeeded(self.queue, self.policy.rate)
        self.queue.finish(claim, Outcome(ok=True, result=stored, duration=self._took(claim)))
        self._settled(claim, ItemState.DONE, stored)

    def record_failure(self, claim: Claim, exc: BaseException) -> None:
        """Record a failed attempt, durably; the item runs again while the policy allows."""
        bad = delay_problem(exc.seconds) if isinstance(exc, TryLater) else None
        reason = bad or failure_reason(exc)
        outcome = Outcome(ok=False, reason=reason, duration=self._took(claim))
        if isinstance(exc, TryLater) and bad is None:  # not a failure: no retry spent
            state = rate_limits.defer(self.queue, claim, self.policy, outcome, exc.seconds)
        else:
            log_traceback(self.queue.store, claim, exc)  # for `statequeue logs ID`
            with self._lock:
                self.errors[claim.item] = exc  # the last attempt's, for MapFailed
            state = self.queue.finish(claim, outcome, retry_at=self.policy.retry_at(claim))
        self._settled(claim, state, reason)

    def record_crash(self, claim: Claim, reason: str) -> None:
        """The process running the attempt died (a pool worker): a crash,
        durably, settled by the policy as recovery after a crash would be."""
        policy = self.policy
        state = self.queue.interrupt(claim, reason, policy.on_interrupted, policy.max_crashes)
        again = state is ItemState.PENDING  # runs again, later in this call
        self._settled(claim, state, reason if again else self._reason(claim.item_id, state))

    def _took(self, claim: Claim) -> float:
        """Seconds since ``claim`` was made (0.0 if this run did not make it)."""
        with self._lock:
            started = self._held.get(claim.item_id)
        return 0.0 if started is None else time.monotonic() - started

    def give_back(self, claim: Claim, why: str) -> None:
        """Release a claim whose attempt did not finish (not counted as a failure)."""
        with self._lock:
            self._held.pop(claim.item_id, None)
        if not self.queue.closed:
            self.queue.release(claim, why)

    def give_back_unsettled(self, claim: Claim, why: str) -> None:
        """Best effort, as a slot ends on an error (its result could not be
        recorded: a full disk, a store error): give ``claim`` back if this run
        still holds it, so that it is not left recorded as running, for
        recovery to count a crash. The disk full: in the room the queue's
        space reserve leaves (``Queue.release``)."""
        with self._lock:
            held = claim.item_id in self._held
        if held:
            with contextlib.suppress(StateQueueError):  # recovery finds it instead
                self.give_back(claim, why)

    def _settled(self, claim: Claim, state: ItemState, value: Any) -> None:
        with self._lock:
            self._held.pop(claim.item_id, None)
            if state is ItemState.PENDING:
                return  # a retry comes due later
            del self._left[claim.item_id]
            if state is ItemState.DONE:
                self.results[claim.item] = value
            else:
                self.failures[claim.item] = value

    # -- the end -------------------------------------------------------------------

    def settle_rest(self) -> bool:
        """For items left that this run could not claim: read what others
        recorded. True when every item is settled; False while some are still
        pending or running in another process (look again later)."""
        with self._lock:
            left = dict(self._left)
        if not left:
            return True
        done: dict[int, str] = {}
        for item_id, state in self.queue.states(left).items():
            if state in (ItemState.PENDING, ItemState.RUNNING):
                continue
            if state is ItemState.DONE:
                done[item_id] = left[item_id]
            else:
                self.failures[left[item_id]] = self._reason(item_id, state)
            with self._lock:
                del self._left[item_id]
        self._read_back(done)
        return self.finished

    def _reason(self, item_id: int, state: ItemState) -> str:
        if state is ItemState.FAILED:
            found = self.queue.result(item_id)
            return found.reason if found is not None and found.reason else "failed"
        return state.value  # cancelled or held by another process or the user

    def outcome(self) -> list[Any]:
        """The results in input order; MapFailed when some item failed."""
        results = [self.results.get(t) for t in self.texts]
        if self.failures:
            firsts = dict.fromkeys(t for t in self.texts if t in self.failures)
            errors = {t: self.errors[t] for t in firsts if t in self.errors}
            failed = MapFailed([(t, self.failures[t]) for t in firsts], results, errors=errors)
            raise failed from next(iter(errors.values()), None)
        return results
