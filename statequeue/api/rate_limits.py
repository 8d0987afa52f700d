"""The library's side of rate limits and "try later" (``work(rate=)``,
``map(rate=)``, ``TryLater``, ``item.later()``), as ``run`` does them
(run/pacing.py): each start is taken from the queue's bucket in the store,
shared with every runner; a deferral puts the item back without spending a
retry, and tunes the shared rate (AIMD, store/rate_bucket.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from statequeue.core.models import Claim, ItemState, Outcome
from statequeue.core.rates import RateLimit

if TYPE_CHECKING:
    from statequeue.api.queue import Queue
    from statequeue.api.work import WorkPolicy


def start_wait(queue: Queue, rate: RateLimit | None) -> float:
    """Take one start from the queue's bucket: 0.0 when taken (or no
    ``rate``), else the seconds until one will be there (nothing taken)."""
    if rate is None:
        return 0.0
    return queue.take_start(rate)[0]


def wait_for_start(queue: Queue, rate: RateLimit | None) -> None:
    """Sleep until a start is taken from the queue's bucket (none without ``rate``)."""
    while (wait := start_wait(queue, rate)) > 0:
        time.sleep(wait)


def succeeded(queue: Queue, rate: RateLimit | None) -> None:
    """A success raises the queue's shared rate a step (AIMD)."""
    if rate is not None:
        queue.rate_feedback(rate, deferred=False)


def defer(
    queue: Queue, claim: Claim, policy: WorkPolicy, outcome: Outcome, seconds: float | None
) -> ItemState:
    """Record that the attempt asked to be tried later, durably: pending again
    after ``seconds`` (None: a backoff that doubles with the item's attempts),
    or failed past ``policy.max_deferrals``. Halves the shared rate."""
    if seconds is None:
        seconds = policy.later_delay(claim)
    state = queue.defer(claim, outcome, delay=seconds, max_deferrals=policy.max_deferrals)
    if policy.rate is not None:
        queue.rate_feedback(policy.rate, deferred=True)
    return state
