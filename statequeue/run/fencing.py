"""Fencing: stop the children of claims whose lease this runner can no longer vouch for.

Promise 4 across hosts (DESIGN.md, "Self-fencing"): a runner that cannot renew
its leases stops their children before another runner may take the items, and
tells its keeper when each lease ends, so that a frozen runner's children die
then too. Nothing is recorded for a fenced item: it is another runner's now.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterable

from statequeue.api.queue import Queue
from statequeue.core import lease_clock
from statequeue.core.errors import KeeperLost
from statequeue.run.events import Notice, RunEvent
from statequeue.run.jobs import Job

__all__ = ["Fencing"]


class Fencing:
    """The lease side of a run: backstops at the keeper, and stops on a lost lease."""

    def __init__(self, queue: Queue, grace: float, on_event: Callable[[RunEvent], None]) -> None:
        self.queue = queue
        self._store = queue.store  # taken once, as the runner does (see Runner.__init__)
        self.grace = grace
        self.on_event = on_event

    def fence(self, jobs: Iterable[Job]) -> None:
        """Stop at once the children of claims whose lease this runner can
        no longer vouch for (promise 4 across hosts); nothing is recorded for them."""
        store = self._store
        jobs = list(jobs)
        if store.fence_at() is not None:
            for job in jobs:
                self.backstop(job)
        lost = store.lost_claims()
        if not lost:
            return
        now = time.monotonic()
        grace = self.queue.store.fence_grace(self.grace)
        for job in jobs:
            if job.claim.token in lost:
                job.stop_reason = "fenced"
                job.signal_group(signal.SIGTERM)
                job.kill_at = now + grace
                text = (
                    f"item {job.claim.item_id}: lease lost (not renewed in time, or taken "
                    "over by another runner); its child is stopped and nothing is recorded"
                )
                self.on_event(Notice(text, warning=True))

    def backstop(self, job: Job) -> None:
        """Tell the keeper when ``job``'s lease ends as last renewed: it kills
        the child then even if this runner is frozen (SIGSTOP, a paused VM)."""
        at = self._store.kill_by(job.claim.token)
        if at is not None and at != job.lease_kill_at:
            job.lease_kill_at = at
            with contextlib.suppress(KeeperLost):
                job.keeper.deadline(job.token, at)

    def wait_bound(self) -> float | None:
        """Seconds until a lease needs renewing (the lease clock), or None if none does."""
        fence = self._store.fence_at()
        return None if fence is None else max(0.0, fence - lease_clock.now())
