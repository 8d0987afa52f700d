"""The part of the store contract (base.py) for the queue's shared start
rate (``run --rate``): a token bucket kept in the store, which every runner
of the queue takes its starts from, on every host (rate_bucket.py). A store
that keeps one fills in ``bucket_update``; the other methods go through it.
The defaults here say "no bucket".
"""

from __future__ import annotations

from statequeue.core.errors import NotSupported
from statequeue.core.rates import Pace, RateLimit
from statequeue.store import rate_bucket
from statequeue.store.rate_bucket import Bucket, BucketChange


class RateHooks:
    """Start-rate hooks of ``Store``, with the defaults of a store that keeps no bucket."""

    def bucket_update(self, change: BucketChange, *, create: bool = True) -> Bucket | None:
        """Apply ``change`` to the queue's start-rate bucket, atomically with
        respect to every process using the queue (``rate_bucket.BucketUpdate``):
        what the rate methods below use. Default: NotSupported (no bucket)."""
        raise NotSupported(f"the {type(self).__name__} keeps no rate limit")

    _limit_set: RateLimit | None = None
    """The limit this store object last set the queue's bucket to."""

    def take_start(self, limit: RateLimit) -> tuple[float, float]:
        """Atomically take one item start from the queue's token bucket, kept
        in the store and shared by every runner of the queue (on every host):
        refilled at its current rate (never above its limit) up to its burst.
        The first take with a ``limit`` sets the queue's bucket to it (the
        runner that starts with a new --rate sets the queue's limit); later
        ones take from the bucket as it is, whatever limit another runner
        set since (taken back at each take, two runners with different rates
        set it in turn, and the one that took last starved the other).
        Returns (0.0, current rate) when a start was taken, else (seconds
        until one will be there, current rate) and nothing is taken.
        This default goes through ``bucket_update``."""
        setting = self.setting_limit(limit)
        return rate_bucket.take_start(self.bucket_update, limit, setting=setting)

    def setting_limit(self, limit: RateLimit) -> bool:
        """Whether this take sets the queue's bucket to ``limit``: the first
        with it from this store object (then remembered as set)."""
        setting = self._limit_set != limit
        self._limit_set = limit
        return setting

    def rate_feedback(self, limit: RateLimit, *, deferred: bool) -> None:
        """Tell the queue's bucket how an attempt went (AIMD, rate_bucket.py):
        a deferral halves its current rate, a success raises it a step, never
        above ``limit``. Atomic, as ``take_start``; not durable (pacing state).
        This default goes through ``bucket_update``."""
        rate_bucket.feedback(self.bucket_update, limit, deferred=deferred)

    def pace(self) -> Pace | None:
        """The queue's shared rate as last set (current and limit), for
        ``status``; None when no runner has limited it, or the store keeps no
        bucket. This default reads it through ``bucket_update``."""
        return rate_bucket.pace_of(self.bucket_update)
