"""The methods of ``Queue`` a work loop calls, one attempt after another:
claims, each attempt's outcome (``finish``, ``defer``, ``release``), the
shared start rate, runner registration, leases and durability. Each is a thin
call on the store, one thread at a time. A base class of ``Queue``
(queue.py), so they are its methods, as ``QueueReads``'s are."""

from __future__ import annotations

import math
from collections.abc import Collection

from statequeue.api.shared_store import SharedStore
from statequeue.core.errors import UsageError
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.core.rates import MAX_DEFER, RateLimit
from statequeue.core.records import check_json, check_reason


class QueueAttempts:
    """What a work loop asks of ``Queue`` for each attempt (it sets ``_shared``)."""

    _shared: SharedStore

    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        """Claim the next due pending item for ``runner`` (only ids in ``among``,
        when given), recovering dead runners' items first."""
        with self._shared.using() as store:
            return store.claim(
                runner, on_interrupted=on_interrupted, max_crashes=max_crashes, among=among
            )

    def reserve(self, *, among: Collection[int] | None = None) -> bool:
        """Make the next ``claim`` (or ``finish_and_claim``) quick: hold the claim
        lock of the item it would take, with its text loaded, writing nothing
        (``Store.reserve``). True if one is held (False: none due, or the store
        cannot). ``unreserve`` lets it go."""
        with self._shared.using() as store:
            return store.reserve(among=among)

    def unreserve(self) -> None:
        """Let a reserved claim lock go (``reserve``); the item stays pending."""
        with self._shared.using() as store:
            store.unreserve()

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        """Record an attempt's outcome durably; returns the item's new state.

        InvalidResult if the result or reason cannot be stored as JSON (nothing
        is recorded then, and the item stays claimed)."""
        check_json(outcome.result, "result")
        check_reason(outcome.reason)
        with self._shared.using() as store:
            return store.finish(claim, outcome, retry_at=retry_at, sync=sync)

    def defer(
        self, claim: Claim, outcome: Outcome, *, delay: float, max_deferrals: int
    ) -> ItemState:
        """The attempt asks to be tried later: the item is pending again, due in
        ``delay`` seconds, without spending a retry; past ``max_deferrals``
        deferrals it fails (``Store.defer``). Durable before it returns."""
        check_json(outcome.result, "result")
        check_reason(outcome.reason)
        nan = isinstance(delay, float) and math.isnan(delay)  # an int may pass a float's range
        if isinstance(delay, bool) or not isinstance(delay, int | float) or nan:
            raise UsageError(f"a deferral's delay must be a number of seconds, not {delay!r}")
        # At most a day: 1e308 overflowed (and float() of an int past its range raises).
        delay = float(min(max(delay, 0.0), MAX_DEFER))
        with self._shared.using() as store:
            return store.defer(claim, outcome, delay=delay, max_deferrals=max_deferrals)

    def take_start(self, limit: RateLimit) -> tuple[float, float]:
        """Take one start from the queue's shared bucket (``Store.take_start``)."""
        with self._shared.using() as store:
            return store.take_start(limit)

    def rate_feedback(self, limit: RateLimit, *, deferred: bool) -> None:
        """Tune the queue's shared rate after an attempt (``Store.rate_feedback``)."""
        with self._shared.using() as store:
            store.rate_feedback(limit, deferred=deferred)

    def finish_and_claim(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        retry_at: float | None = None,
        runner: RunnerInfo,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> tuple[ItemState, Claim | None]:
        """``finish`` durably, then claim the next item for ``runner`` (see
        ``Store.finish_and_claim``: one locked section and one fsync where the
        store can). Returns the new state and the next claim, or None."""
        check_json(outcome.result, "result")
        check_reason(outcome.reason)
        with self._shared.using() as store:
            return store.finish_and_claim(
                claim,
                outcome,
                retry_at=retry_at,
                runner=runner,
                on_interrupted=on_interrupted,
                max_crashes=max_crashes,
                among=among,
            )

    # -- runners, leases, durability ------------------------------------------

    def register_runner(self, runner: RunnerInfo) -> None:
        """Record that ``runner`` (a work loop in this process) is active, and
        keep the queue's space reserve, as `run` does (``release``)."""
        with self._shared.using() as store:
            store.keep_space_reserve()  # first: with no room for it, the loop must not start
            store.register_runner(runner)

    def unregister_runner(self, runner_id: str) -> None:
        """Record that the runner stopped cleanly."""
        with self._shared.using() as store:
            store.unregister_runner(runner_id)

    def release(self, claim: Claim, reason: str, *, uncounted: bool = False) -> None:
        """Give a claimed item back as pending, not counted as a failure (durable);
        ``uncounted``: its attempt never began (see ``Store.release``). After a
        full disk stopped the store, in the room its space reserve leaves
        (``Store.space_reserve_freed``), as `run` gives its items back: else
        the next run would recover the item as if its runner had died,
        counting a crash (three such stops hold an innocent item as poison)."""
        with self._shared.using() as store, store.space_reserve_freed() as full_disk:
            why = f"{reason}: the disk was full" if full_disk else reason
            store.release(claim, why, uncounted=uncounted)

    def interrupt(
        self, claim: Claim, reason: str, policy: OnInterrupted, max_crashes: int
    ) -> ItemState:
        """The process running ``claim``'s attempt died while this one lives:
        a crash, settled by ``policy`` as recovery would (``Store.interrupt``)."""
        with self._shared.using() as store:
            return store.interrupt(claim, reason, on_interrupted=policy, max_crashes=max_crashes)

    def heartbeat(self, claim: Claim) -> None:
        """Tell the store ``claim`` is still held (a no-op for stores without leases)."""
        with self._shared.using() as store:
            store.heartbeat(claim)

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        """When the earliest item waiting for a retry comes due (see ``Store.next_due``)."""
        with self._shared.using() as store:
            return store.next_due(among)

    def sync(self) -> None:
        """Make every record written so far durable."""
        with self._shared.using() as store:
            store.sync()
