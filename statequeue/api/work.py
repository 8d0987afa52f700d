"""The ``work()`` loop: items claimed one at a time, each settled durably
under a retry policy before the next is taken.

for item in queue.work(retries=2):
    with item:  # an exception fails the attempt (retried per policy); the loop goes on
        item.done(fetch(item.item))
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from statequeue.api import rate_limits
from statequeue.api.attempt_log import log_traceback
from statequeue.api.interrupts import deferred_interrupt
from statequeue.core.errors import (
    ClaimLost,
    ItemNotSettled,
    StateQueueError,
    TryLater,
    UsageError,
)
from statequeue.core.identity import new_runner
from statequeue.core.models import (
    VERIFIED_AFTER_CRASH,
    Claim,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.core.rates import DEFAULT_MAX_DEFERRALS, RateLimit, delay_problem

if TYPE_CHECKING:
    from statequeue.api.queue import Queue

VERIFIED_REASON = VERIFIED_AFTER_CRASH
LONGEST_NAP = 1.0
"""The longest a loop sleeps before looking again for an item waiting on its retry time."""
PAUSED_NAP = 0.25
"""How often a loop looks whether a paused queue was resumed (as ``run`` does)."""


@dataclass(frozen=True)
class WorkPolicy:
    """What happens to a failed attempt and to an item whose runner died.

    ``retries``: failed attempts retried per episode (as ``run --retries``);
    the n-th retry waits ``retry_delay * 2**(n-1)`` seconds (at most
    ``retry_max_delay``), with jitter. ``on_interrupted`` and ``max_crashes``
    are as in ``run``."""

    retries: int = 0
    retry_delay: float = 1.0
    retry_max_delay: float = 300.0
    on_interrupted: OnInterrupted = OnInterrupted.RETRY
    max_crashes: int = 3
    rate: RateLimit | None = None
    """Starts per second for the whole queue (``run --rate``); None: no limit."""
    max_deferrals: int = DEFAULT_MAX_DEFERRALS
    """Times an item may ask to be tried later (``TryLater``) before it fails."""

    def __post_init__(self) -> None:
        for name in ("retries", "max_crashes", "max_deferrals"):
            value = getattr(self, name)
            # "2", None or 2.5 raised a TypeError at the first comparison, or
            # were taken as they were (an outside tester of the library).
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{name} must be a whole number, not {value!r}")
        if self.retries < 0 or self.max_crashes < 1 or self.max_deferrals < 0:
            raise UsageError("retries and max_deferrals must be >= 0 and max_crashes >= 1")
        for name in ("retry_delay", "retry_max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (
                isinstance(value, int | float) and math.isfinite(value) and value >= 0
            ):
                raise UsageError(f"{name} must be a finite number of seconds >= 0, not {value!r}")
        try:
            policy = OnInterrupted(self.on_interrupted)  # "retry" works too
        except ValueError:
            names = ", ".join(p.value for p in OnInterrupted)
            raise UsageError(f"on_interrupted must be one of {names}") from None
        object.__setattr__(self, "on_interrupted", policy)  # frozen: set once, here

    def retry_at(self, claim: Claim) -> float | None:
        """When a failed attempt of ``claim`` runs again; None: it fails for good.
        Counts failures in the item's episode, as ``run --retries`` does."""
        if claim.failures >= self.retries:
            return None
        return time.time() + backoff(claim.failures + 1, self.retry_delay, self.retry_max_delay)

    def later_delay(self, claim: Claim) -> float:
        """The wait of an item that asked to be tried later without saying how
        long: a backoff that doubles with its attempts, from ``retry_delay``."""
        return backoff(claim.attempt, self.retry_delay, self.retry_max_delay)


def backoff(retry: int, delay: float, max_delay: float) -> float:
    """The wait before the ``retry``-th retry of an episode (``run --retries``
    and ``work(retries=)`` alike): doubling from ``delay`` up to ``max_delay``,
    with jitter."""
    import random  # lazy: start-up time (enqueue never needs it)

    base = min(max_delay, delay * 2.0 ** min(retry - 1, 1000))  # 2.0**1024 raised OverflowError
    return base * random.uniform(0.5, 1.0)  # jitter, not security


def failure_reason(exc: BaseException) -> str:
    """The reason stored for an attempt that raised ``exc``: its type and message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class WorkItem:
    """One claimed item inside ``Queue.work()``; a context manager.

    Inside ``with item:``, an exception marks the attempt failed (its type and
    message are the reason; retried per the loop's policy) and the loop goes
    on; leaving the block without settling records ``done(None)``. A
    ``KeyboardInterrupt`` (or any other BaseException) gives the item back,
    uncounted as a failure, and leaves the loop."""

    def __init__(
        self,
        queue: Queue,
        claim: Claim,
        policy: WorkPolicy | None = None,
        *,
        runner: RunnerInfo | None = None,
        owner: int | None = None,
    ) -> None:
        self.queue = queue
        self.claim = claim
        self.owner = os.getpid() if owner is None else owner
        """The process the item runs in (the loop's): a process forked inside
        the item holds a copy of this object, and must neither settle the
        item nor give it back (its parent still runs it)."""
        self.policy = policy or WorkPolicy()
        self.settled = False
        self.released = False
        # The work loop's runner: done() and fail() then claim the loop's
        # next item in the same store step as the result (one commit, or one
        # fsync), and leave that claim in ``next_claim`` for the loop.
        self._runner = runner
        self.next_claim: Claim | None = None
        self.chained = False  # settled with a look for the next claim (next_claim, or none due)
        self.handed = False  # given to the program (else a give-back counts no attempt)
        # Made just after the claim: an attempt lasts from it to done/fail, as
        # a command's does from launch to exit (monotonic: `stats` sums these).
        self._claimed_at = time.monotonic()
        self.state: ItemState | None = None
        """The item's state once settled: done, failed, or pending (a retry is due)."""

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

    def done(self, result: Any = None) -> ItemState:
        """Record success with ``result`` (any JSON value), durably, before returning."""
        return self._settle(True, "", result)

    def fail(self, reason: str = "failed", result: Any = None) -> ItemState:
        """Record failure with ``reason``, durably, before returning; the item
        is pending again (due later) while the policy allows a retry."""
        return self._settle(False, reason, result)

    def later(self, seconds: float | None = None) -> ItemState:
        """Ask for the item to be tried later, durably: pending again after
        ``seconds`` (None: a backoff), not counted as a failure; it fails once
        it asked more than the loop's ``max_deferrals`` times. Slows the
        queue's shared rate (``rate=``). ``seconds`` that are no wait (negative,
        NaN, infinite, not a number) fail the attempt instead, with a reason
        naming them (retried per the loop's policy)."""
        self._check_open()
        problem = delay_problem(seconds)
        if problem is not None:
            return self.fail(problem)
        outcome = Outcome(ok=False, reason="try later", duration=self._took())
        self.state = rate_limits.defer(self.queue, self.claim, self.policy, outcome, seconds)
        self.settled = True
        return self.state

    def release(self, reason: str = "given back") -> None:
        """Give the item back as pending, not counted as a failure."""
        self._check_open()
        self.queue.release(self.claim, reason)
        self.released = True

    def heartbeat(self) -> None:
        """Tell the store the item is still being worked on (renews a lease
        where the store has leases; nothing on the local journal)."""
        self.queue.heartbeat(self.claim)

    def _settle(self, ok: bool, reason: str, result: Any) -> ItemState:
        self._check_open()
        retry_at = None if ok else self.policy.retry_at(self.claim)
        # Built once, with its duration: no dataclasses.replace per item.
        outcome = Outcome(ok=ok, duration=self._took(), reason=reason, result=result)
        if ok:
            rate_limits.succeeded(self.queue, self.policy.rate)
        # An interrupt waits for the store call (interrupts.py): the item is
        # then known settled, and the next claim known, for the loop to give back.
        try:
            with deferred_interrupt():
                if self._runner is None:
                    self.state = self.queue.finish(self.claim, outcome, retry_at=retry_at)
                else:
                    # Durable before it returns, as finish is (Store.finish_and_claim).
                    self.state, self.next_claim = self.queue.finish_and_claim(
                        self.claim,
                        outcome,
                        retry_at=retry_at,
                        runner=self._runner,
                        on_interrupted=self.policy.on_interrupted,
                        max_crashes=self.policy.max_crashes,
                    )
                    self.chained = True
                self.settled = True
        except ClaimLost:
            # The lease ran out: the item is another runner's, this result was
            # discarded (and recorded so). Given back, so that leaving its block
            # records nothing more (it once recorded a second, failed result).
            self.released = True
            raise
        return self.state

    def _took(self) -> float:
        return time.monotonic() - self._claimed_at

    def _check_open(self) -> None:
        if os.getpid() != self.owner:
            raise UsageError(
                f"item {self.id} is run by process {self.owner}: a process forked"
                " inside it can neither settle it nor give it back"
            )
        if self.settled:
            raise UsageError(f"item {self.id} is already settled")
        if self.released:
            raise UsageError(
                f"item {self.id} was given back (release(), or the work loop ended before it)"
            )

    def __enter__(self) -> WorkItem:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if os.getpid() != self.owner:
            return False  # a fork leaving the block: the item is its parent's
        if exc is None:
            if not (self.settled or self.released):
                self.done(None)
            return False
        if self.settled or self.released:
            return False  # nothing left to record: the caller sees the exception
        if isinstance(exc, TryLater):
            if delay_problem(exc.seconds) is not None:  # failed: where it was raised, for logs
                log_traceback(self.queue.store, self.claim, exc)
            self.later(exc.seconds)
            return True  # not a failure: the item is pending again; the loop goes on
        if isinstance(exc, Exception):
            self._check_open()
            log_traceback(self.queue.store, self.claim, exc)  # for `statequeue logs ID`
            self.fail(failure_reason(exc))
            return True  # the attempt is recorded as failed; the loop goes on
        # Best effort, so that the interrupt is what the caller sees: one that
        # cut a done() short may have left the item settled (its record written).
        with contextlib.suppress(StateQueueError):
            self.release(f"interrupted: {type(exc).__name__} inside the work item")
        return False


def work_loop(
    queue: Queue, policy: WorkPolicy, verify: Callable[[WorkItem], bool] | None
) -> Iterator[WorkItem]:
    """The generator behind ``Queue.work``."""
    # In process: no claim's lock is handed on (RunnerInfo.in_process).
    runner = new_runner(command=("python", *sys.argv[:1]), in_process=True)
    queue.register_runner(runner)
    # A result and the next claim in one store step where the store does it
    # in one commit (Store.chains_claims), and not under a rate (each start
    # is paced first); elsewhere the claim is made when the item is handed
    # out, so a program killed after done() leaves no claim of an item it
    # never saw (recovery would count an interrupted attempt against it).
    chain = runner if queue.store.chains_claims and policy.rate is None else None
    current: WorkItem | None = None
    taken: Claim | None = None  # claimed by the last item's done() or fail()
    # The last item's done() or fail() looked for the next item in the same
    # store step and found none due: the loop then looks (paused? a retry
    # coming?) before its claim, so that the claim, which recovers orphans
    # first, decides at once (else a claim, a look, and a second claim that
    # recovers again: the tail of every loop's run).
    exhausted = False
    unwinding = False
    try:
        while True:
            looked = False
            if exhausted:
                exhausted = False
                if wait_for_due(queue):
                    continue
                looked = True  # not paused, nothing waits for a retry: the claim decides
            # Under a rate a start is taken before the claim, unless nothing is
            # pending: then the claim decides at once (the loop's last claim
            # slept a whole rate period for a start it never used).
            paced = taken is not None or policy.rate is None
            if not paced and queue.status().counts["pending"] > 0:
                rate_limits.wait_for_start(queue, policy.rate)
                paced = True
            # The claim and the item made of it in one step an interrupt
            # cannot split (interrupts.py): whatever ends the loop from here
            # finds the claim in ``current`` (or still in ``taken``). One
            # claimed by the last done() needs no store call: an interrupt
            # between the two lines below leaves it in both, and end_work
            # gives it back once (two signal-handler swaps less per item).
            if taken is not None:
                current = WorkItem(queue, taken, policy, runner=chain, owner=runner.pid)
                taken = None
            else:
                with deferred_interrupt():
                    current = _take(queue, runner, policy, chain)
            if current is None:
                if looked:
                    return
                if wait_for_due(queue):
                    continue
                # Not paused now and nothing waits for a retry: but a resume
                # may have come between the claim and that look. One more
                # claim decides (else the loop would end beside pending items).
                with deferred_interrupt():
                    current = _take(queue, runner, policy, chain)
                if current is None:
                    return
            if not paced:  # enqueued since the look: its start is paced now
                rate_limits.wait_for_start(queue, policy.rate)
            claim = current.claim
            if not verified(current, verify):
                current.handed = True
                yield current
                if os.getpid() != runner.pid:
                    return  # a fork went on with the loop: it ends here, claiming nothing
                if not (current.settled or current.released):
                    raise ItemNotSettled(
                        f"item {claim.item_id} was neither done() nor fail()ed before the next"
                    )
            taken, current.next_claim = current.next_claim, None
            exhausted = taken is None and current.chained
            current = None
    except BaseException:
        # An interrupt, an error or the generator closed: what is left goes
        # back best effort (recovery finds the rest), and the exception that
        # ended the loop is the one the caller sees, never a store error of
        # the give-back (a KeyboardInterrupt inside done() left the item settled).
        unwinding = True
        raise
    finally:
        # Only in the loop's own process: a fork of it (a worker forked
        # inside an item) closes its copy of this generator when it exits,
        # and must not give back the item its parent still runs.
        if os.getpid() == runner.pid:
            end_work(queue, runner.runner_id, current, taken, best_effort=unwinding)


def _take(
    queue: Queue, runner: RunnerInfo, policy: WorkPolicy, chain: RunnerInfo | None
) -> WorkItem | None:
    """The loop's next item, claimed now (None: none is due)."""
    claim = queue.claim(
        runner, on_interrupted=policy.on_interrupted, max_crashes=policy.max_crashes
    )
    return None if claim is None else WorkItem(queue, claim, policy, runner=chain, owner=runner.pid)


def verified(item: WorkItem, verify: Callable[[WorkItem], bool] | None) -> bool:
    """For an interrupted item: True (and recorded done) when ``verify`` says
    its earlier attempt finished, so it is not run again."""
    if verify is None or not item.interrupted or not verify(item):
        return False
    item._settle(True, VERIFIED_REASON, None)
    return True


def wait_for_due(queue: Queue, among: Collection[int] | None = None) -> bool:
    """Sleep towards the time the next item waiting for a retry comes due
    (at most LONGEST_NAP), or a while when the queue is paused (as ``run``,
    a loop waits for ``resume``); False when no item waits."""
    nap = next_nap(queue, among)
    if nap is None:
        return False
    time.sleep(nap)
    return True


def next_nap(queue: Queue, among: Collection[int] | None = None) -> float | None:
    """How long to wait before looking for an item again; None: none is coming."""
    if among is not None and not among:
        return None  # nothing left to look for: a pause must not hold the caller
    if queue.is_paused():
        return PAUSED_NAP
    due = queue.next_due(among)
    if due is None:
        return None
    # At least a short nap: an item due now that could not be claimed is
    # blocked (a live process from its earlier attempt holds it).
    return min(max(due - time.time(), 0.05), LONGEST_NAP)


def end_work(
    queue: Queue,
    runner_id: str,
    current: WorkItem | None,
    taken: Claim | None = None,
    *,
    best_effort: bool = False,
) -> None:
    """Give back an unsettled item, and the next one its done() claimed (never
    started: uncounted), and record that the loop stopped. ``best_effort``
    (an exception ends the loop): a store error of one step is let go and the
    next step is still taken (recovery finds what is left)."""
    if queue.closed:
        return  # closing released the claims: recovery gives the items back
    errors = (StateQueueError,) if best_effort else ()
    if current is not None and not (current.settled or current.released):
        with contextlib.suppress(*errors):  # never handed out: its attempt never began
            queue.release(
                current.claim,
                "abandoned: the work loop stopped early",
                uncounted=not current.handed,
            )
        current.released = True  # a done() after the loop ended says so (_check_open)
    following = taken or (current.next_claim if current is not None else None)
    if following is not None and (current is None or following is not current.claim):
        with contextlib.suppress(*errors):
            queue.release(following, "abandoned: the work loop stopped early", uncounted=True)
    with contextlib.suppress(*errors):
        queue.unregister_runner(runner_id)
