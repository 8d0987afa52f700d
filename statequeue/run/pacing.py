"""The runner's side of ``--rate`` and of commands that ask to be tried later.

The rate itself is the store's (a token bucket every runner of the queue takes
its starts from, store/rate_bucket.py): before each claim the runner takes a
start, or learns how long to wait for one. What comes back tunes it (AIMD):
a deferral halves the queue's rate, a success raises it a step. Without
``--rate`` the same control acts on this runner's concurrency instead: a
deferral halves the items it runs at once, successes raise it back to -j.

A deferral's delay is the command's ``retry_after`` (its result JSON), or a
backoff that doubles while this runner's commands keep asking to be tried
later and starts again from ``--retry-delay`` after a success.
"""

from __future__ import annotations

import math
import time
from typing import Any

from statequeue.core.models import Outcome
from statequeue.core.rates import MAX_DEFER, TRY_LATER_EXIT
from statequeue.run.options import RunOptions
from statequeue.store.base import Store
from statequeue.store.rate_bucket import CUT_HOLD

__all__ = ["Pacing", "asks_later", "retry_after"]

LOOK_FIRST = 1.0
"""Seconds: a refused start due later than this is waited for only while an
item is pending (one look at the queue per refusal); sooner ones, as under
any rate of a start a second or more, are waited for without a look."""


RATE_WAIT_SAID_FROM = 5.0
"""Seconds: a wait for a start this long is said (once per run): at --rate
1/m a run sat silent for a minute between items, and looked hung."""


def asks_later(outcome: Outcome) -> bool:
    """Whether the attempt asked to be tried later (exit 75, EX_TEMPFAIL)."""
    return not outcome.ok and outcome.exit_code == TRY_LATER_EXIT and not outcome.timed_out


def retry_after(result: Any) -> float | None:
    """The ``retry_after`` seconds a result JSON names (a finite number >= 0), else None."""
    if not isinstance(result, dict):
        return None
    value = result.get("retry_after")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not (math.isfinite(value) and value >= 0):
        return None
    return min(float(value), MAX_DEFER)  # 1e308 overflowed the record's time


class Pacing:
    """One runner's pacing: starts taken from the store's bucket, AIMD feedback."""

    def __init__(self, store: Store, options: RunOptions) -> None:
        self._store = store
        self._options = options
        self.limit = options.rate
        self._current = options.rate.per_second if options.rate else 0.0
        self._next_at = 0.0  # wall-clock time before which no start is there to take
        self._refused = False  # the last look found no start: the runner must look again
        self._work_left: bool | None = None  # after a refusal: whether any item is pending
        self._concurrency = options.jobs  # AIMD on concurrency (no --rate)
        self._cut_at = -math.inf
        self._successes = 0
        self._streak = 0  # deferrals in a row: the adaptive backoff doubles with it
        self._said_wait = False  # a long wait for a start was said (once per run)

    @property
    def limited(self) -> bool:
        """True under ``--rate``: every start is taken from the store."""
        return self.limit is not None

    def slots(self, concurrency: int) -> int:
        """How many items may run at once: ``concurrency``, or fewer while
        deferrals hold this runner's concurrency down (no ``--rate``)."""
        return concurrency if self.limited else min(concurrency, self._concurrency)

    def may_start(self) -> bool:
        """Take one start from the queue's bucket; False (nothing taken) when
        none is there yet: ``due`` then says when to look again."""
        if self.limit is None:
            return True
        if time.time() < self._next_at:
            self._refused = True
            return False
        wait, self._current = self._store.take_start(self.limit)
        self._next_at = time.time() + wait
        self._refused = wait > 0
        self._work_left = None
        return not self._refused

    def due(self, retry_due: float | None) -> float | None:
        """The wall-clock time the runner must look again: ``retry_due`` (the
        next retry), or sooner when a start comes due in the bucket."""
        if self.limit is None or not self._refused:
            return retry_due  # no start was refused: nothing to wake for
        if retry_due is None and self._next_at - time.time() > LOOK_FIRST and not self._pending():
            # Nothing to start: the run ends (or --follow waits for work) now,
            # not after waiting out a start it would have no use for.
            return retry_due
        # Refused, so items wait for it: look again at that time, even when
        # it has passed meanwhile (a loaded machine: the run must not end).
        return self._next_at if retry_due is None else min(retry_due, self._next_at)

    def wait_notice(self) -> str | None:
        """What to say, once per run, when the next start is a long wait
        (``RATE_WAIT_SAID_FROM``) away and an item waits for it."""
        if self._said_wait or self.limit is None or not self._refused:
            return None
        left = self._next_at - time.time()
        if left < RATE_WAIT_SAID_FROM or not self._pending():
            return None
        from statequeue.core.durations import format_duration  # lazy: a long wait only
        from statequeue.core.rates import rate_text

        self._said_wait = True
        return (
            f"waiting for the queue's start rate ({rate_text(self._current)}): "
            f"next start in {format_duration(math.ceil(left))}"
        )

    def _pending(self) -> bool:
        if self._work_left is None:
            self._work_left = self._store.status().counts["pending"] > 0
        return self._work_left

    def delay(self, outcome: Outcome) -> float:
        """The seconds a deferred item waits before it runs again."""
        asked = retry_after(outcome.result)
        if asked is not None:
            return asked
        from statequeue.api.work import backoff  # lazy: start-up time (a deferral only)

        opts = self._options
        return backoff(max(self._streak, 1), opts.retry_delay, opts.retry_max_delay)

    def ended(self, outcome: Outcome, *, deferred: bool) -> None:
        """Tune the rate (or the concurrency) after an attempt ended."""
        self._streak = self._streak + 1 if deferred else 0
        if self.limit is not None:
            if deferred or self._current < self.limit.per_second:
                self._store.rate_feedback(self.limit, deferred=deferred)
            return
        now = time.monotonic()
        if deferred:
            if now - self._cut_at >= CUT_HOLD:
                self._concurrency = max(1, self._concurrency // 2)
                self._cut_at = now
            self._successes = 0
        elif outcome.ok and self._concurrency < self._options.jobs:
            self._successes += 1
            if self._successes >= self._concurrency:  # one more slot per round of successes
                self._concurrency += 1
                self._successes = 0


HELD_POLL = 0.02  # seconds between claim attempts on a due retry whose claim is held


def until_due(due: float) -> float:
    """Seconds until a retry due at ``due`` (epoch seconds). One due already
    was not claimable just now: its claim is still held (by a detached
    leftover of its last attempt, or by the keeper about to let go), so look
    again soon, without spinning."""
    wait = due - time.time()
    return wait if wait > 0 else HELD_POLL
