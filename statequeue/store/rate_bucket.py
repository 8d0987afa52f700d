"""The queue's shared start rate: a token bucket and its AIMD control, as
pure functions every store applies under its own lock (no I/O, no clock:
callers pass the time in, the database's own on PostgreSQL).

The bucket is pacing state, not acknowledged data: losing an update (a crash
before it reached the disk) lets at most ``burst`` extra items start, and
breaks no promise. Stores keep it beside the queue, never in its records.

AIMD (``run --rate`` with commands that ask to be tried later): a deferral
halves the current rate, but not again within ``cut_hold`` (the attempts
started before the cut come back deferred too, and must not halve it again); each
success raises it, quickly back towards the rate of the last cut, then by
``PROBE_STEPS`` steps per second of successes up to the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from statequeue.core.errors import NotSupported, StateQueueError
from statequeue.core.rates import Pace, RateLimit

CUT_HOLD = 1.0
"""At most this many seconds after a cut, further deferrals do not cut again."""
HOLD_STARTS = 4
"""...nor for as long as this many starts take at the current rate, if shorter:
the attempts started before a cut come back deferred soon after it."""
FLOOR_SHARE = 1 / 64
"""The current rate never drops below this share of the limit."""
RECOVER_SHARE = 1 / 8
"""Below 90% of the rate of the last cut, each success recovers this share of the gap."""
_EPSILON = 1e-9
LATE_SLACK = 0.5
"""Tokens kept beyond the burst for a late taker: a runner that comes for its
start late (a wakeup, a database round trip) keeps what it earned since the
bucket filled up, up to half a start, so lateness does not lower the rate."""
LATE_WINDOW = 0.05
"""Seconds: only that late. A bucket full for longer has sat idle, and holds
exactly ``burst``: after a pause the standard bound holds, at most
``burst + rate * T`` starts in any T seconds (half a start more let the
first two starts after a pause come half an interval apart)."""
PROBE_STEPS = 60
"""Above it, successes add ``limit / PROBE_STEPS`` per second of successes."""


@dataclass
class Bucket:
    """One queue's bucket, as the stores keep it."""

    limit: float
    """Starts per second allowed: the ``--rate`` of the runner (or library
    loop) that started last with a rate other than the queue's."""
    burst: float
    current: float
    """Starts per second now (AIMD): at most ``limit``."""
    tokens: float
    stamp: float
    """When ``tokens`` was last brought up to date (the store's clock)."""
    peak: float = 0.0
    """The current rate just before the last cut (0: never cut)."""
    cut_at: float = 0.0
    set_at: float = 0.0
    """When ``limit`` (or ``burst``) was last set (0: not known, as in a
    bucket an older statequeue wrote, or on PostgreSQL, which keeps none):
    `status` judges only the starts that came under it."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


_FIELDS = tuple(Bucket.__dataclass_fields__)


def bucket_from(data: Any) -> Bucket | None:
    """The bucket a store read back (a dict), or None when it is not one (a
    torn write: the bucket starts afresh, which costs at most a burst)."""
    try:
        found = Bucket(
            **{k: float(data[k] if k != "set_at" else data.get(k, 0.0)) for k in _FIELDS}
        )
    except (KeyError, TypeError, ValueError):
        return None
    return found if found.limit > 0 and found.current > 0 else None


def configured(bucket: Bucket | None, limit: RateLimit, now: float) -> Bucket:
    """``bucket`` set to ``limit`` (a new one, full, when there is none): the
    runner that starts with another ``--rate`` sets the queue's."""
    if bucket is None:
        return Bucket(limit.per_second, limit.burst, limit.per_second, limit.burst, now, set_at=now)
    if bucket.limit != limit.per_second or bucket.burst != limit.burst:
        bucket.set_at = now
        refill(bucket, now)
        was_full = bucket.current >= bucket.limit
        bucket.limit, bucket.burst = limit.per_second, float(limit.burst)
        bucket.current = limit.per_second if was_full else min(bucket.current, limit.per_second)
        bucket.tokens = min(bucket.tokens, bucket.burst)
    return bucket


def refill(bucket: Bucket, now: float) -> None:
    """Add the tokens earned since ``stamp`` at the current rate, up to
    ``burst``; beyond it (up to ``LATE_SLACK``) only what a taker earned by
    coming at most ``LATE_WINDOW`` after the bucket filled up.

    A bucket full for longer keeps ``stamp`` at the time it filled up (and
    ``tokens`` at ``burst``), so that a later refill does not take an idle
    bucket for one that just filled: ``stamp`` is then not ``now``."""
    earned = max(0.0, now - bucket.stamp) * bucket.current  # a clock step back earns none
    filled = bucket.tokens + earned
    full_at = bucket.stamp + (bucket.burst - bucket.tokens) / bucket.current
    if filled >= bucket.burst and now - full_at > LATE_WINDOW:
        bucket.tokens, bucket.stamp = bucket.burst, min(full_at, now)
        return
    bucket.tokens = min(bucket.burst + LATE_SLACK, filled)
    bucket.stamp = now


def take(bucket: Bucket, now: float) -> float:
    """Take one start: 0.0 when taken, else the seconds until a token will be
    there (nothing taken)."""
    refill(bucket, now)
    if bucket.tokens >= 1.0 - _EPSILON:  # a runner woken on time is not sent back for 1e-15 s
        bucket.tokens, bucket.stamp = max(0.0, bucket.tokens - 1.0), now
        return 0.0
    return (1.0 - bucket.tokens) / bucket.current


def on_deferral(bucket: Bucket, now: float) -> None:
    """A command asked to be tried later: halve the current rate (not again
    within ``cut_hold``)."""
    refill(bucket, now)  # tokens earned so far were earned at the old rate
    if now - bucket.cut_at < cut_hold(bucket) and bucket.cut_at <= now:
        return
    bucket.peak = bucket.current
    bucket.current = max(bucket.current / 2, bucket.limit * FLOOR_SHARE)
    bucket.cut_at = now


def cut_hold(bucket: Bucket) -> float:
    """Seconds after a cut during which deferrals do not cut again."""
    return min(CUT_HOLD, HOLD_STARTS / bucket.current)


def on_success(bucket: Bucket, now: float) -> None:
    """An item succeeded: raise the current rate one step, never above the limit."""
    if bucket.current >= bucket.limit:
        return
    refill(bucket, now)
    if bucket.current < 0.9 * bucket.peak:
        bucket.current += (bucket.peak - bucket.current) * RECOVER_SHARE
    else:
        bucket.current += bucket.limit / PROBE_STEPS / bucket.current
    bucket.current = min(bucket.current, bucket.limit)


BucketChange = Callable[["Bucket | None", float], "Bucket | None"]
"""A change of the bucket (None: there is none yet) at a time: returns the
bucket to keep, or None to keep it as it was."""


class BucketUpdate(Protocol):
    """How a store applies a ``BucketChange``: atomically with respect to every
    process using the queue, at the store's time; returns the bucket after.
    Without ``create``, only read: a queue without a bucket gets none."""

    def __call__(self, change: BucketChange, *, create: bool = True) -> Bucket | None: ...


def take_start(
    update: BucketUpdate, limit: RateLimit, *, setting: bool = True
) -> tuple[float, float]:
    """``Store.take_start`` over a store's ``update``. ``setting``: the bucket
    is set to ``limit`` (a runner's first start); else only a queue without
    a bucket gets one of ``limit``, and the queue's own limit stands."""
    wait = 0.0

    def taking(bucket: Bucket | None, now: float) -> Bucket:
        nonlocal wait
        if setting or bucket is None:
            bucket = configured(bucket, limit, now)
        wait = take(bucket, now)
        return bucket

    after = update(taking)
    return wait, after.current if after is not None else limit.per_second


def feedback(update: BucketUpdate, limit: RateLimit, *, deferred: bool) -> None:
    """``Store.rate_feedback`` over a store's ``update``."""
    step = on_deferral if deferred else on_success

    def feeding(bucket: Bucket | None, now: float) -> Bucket:
        if bucket is None:  # dropped meanwhile: a limit is set by a start, not here
            bucket = configured(bucket, limit, now)
        step(bucket, now)
        return bucket

    update(feeding)


def pace_of(update: BucketUpdate) -> Pace | None:
    """``Store.pace`` over a store's ``update``: None without a bucket, or
    when it cannot be read (``status`` shows no rate rather than fail)."""
    try:
        found = update(lambda bucket, now: None, create=False)
    except (NotSupported, OSError, StateQueueError):
        return None
    if found is None:
        return None
    return Pace(found.current, found.limit, int(found.burst), found.set_at)
