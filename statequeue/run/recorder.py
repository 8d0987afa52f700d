"""The result recorder: each ended attempt's end record, durable before it is reported.

Promise 1: nothing is reported, and no slot refilled, before the end record is
fsynced. Several results share one fsync (group commit), and the last is written
with the next claim in one locked section (fused). Results the store cannot take
during an outage stay owed here until it answers again.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

from statequeue.api.queue import Queue
from statequeue.core.errors import ClaimLost, KeeperLost, StoreUnreachable
from statequeue.core.fileio import CRASH
from statequeue.core.models import Claim, ItemState, Outcome, RunnerInfo
from statequeue.run.attempt_logs import hand_over_log
from statequeue.run.events import ItemFinished, Notice, RunEvent, RunSummary
from statequeue.run.jobs import Job
from statequeue.run.options import RunOptions
from statequeue.run.pacing import Pacing, asks_later
from statequeue.store import transitions

__all__ = ["FuseScope", "ResultRecorder"]

_SETTLED = (ItemState.DONE, ItemState.FAILED)  # recorded for good: no lease to fence
_AFTER_INTERRUPT = {
    ItemState.PENDING: "it runs again",
    ItemState.HELD: "held (see `statequeue show`; `retry` runs it again)",
    ItemState.FAILED: "failed (--on-interrupted fail)",
}

FuseScope = Callable[[], tuple[bool, "set[int] | None"]]
"""Whether a result may be recorded together with the next claim, and the ids
that claim may take (the runner knows its slots: ``Runner._prefetch_scope``)."""


# Why a claim no child was started for went back (as if never claimed).
NOT_STARTED = "not started: the run stopped taking items"


class ResultRecorder:
    """Writes end records, owes what an outage held up, and keeps the claim taken with the last."""

    def __init__(
        self,
        queue: Queue,
        options: RunOptions,
        info: RunnerInfo,
        summary: RunSummary,
        on_event: Callable[[RunEvent], None],
        *,
        fuse_scope: FuseScope,
        on_halt: Callable[[], None],
    ) -> None:
        self.queue = queue
        self._store = queue.store  # taken once, as the runner does (see Runner.__init__)
        self.options = options
        self.info = info
        self.summary = summary
        self.on_event = on_event
        self._fuse_scope = fuse_scope
        self._on_halt = on_halt  # a failure with --halt-on-failure: the run takes no more
        self.prefetched: Claim | None = None  # claimed with the last result, not started yet
        # Ended children whose results the store could not take yet (an
        # outage), and the events of results written but not yet synced.
        self.unrecorded: list[tuple[Job, Outcome]] = []
        self.owed_events: list[RunEvent] = []
        # Results written but not yet synced (group commit): counted in the
        # summary once the fsync that covers them succeeded; a run stopped
        # before it names them cut short, never ok.
        self.unsynced: list[tuple[int, ItemState, bool]] = []
        # Durable results not reported yet: the runner reports them once the
        # next child is started (or before it sleeps), so that printing a
        # result is not on the path from one child's exit to the next start.
        self.ready: list[RunEvent] = []
        # Held here, beside the results that tune it; the runner asks it before each claim.
        self.pacing = Pacing(queue.store, options)

    def take_prefetched(self) -> Claim | None:
        """The claim taken along with the last result, now the caller's to start."""
        claim, self.prefetched = self.prefetched, None
        return claim

    def take_ready(self) -> list[RunEvent]:
        """The durable results held back for reporting, now the caller's to report."""
        events, self.ready = self.ready, []
        return events

    def give_back_prefetched(self) -> None:
        """A claim taken along with the last result that no slot started (the
        run stopped taking items meanwhile) goes back as if never claimed."""
        claim = self.take_prefetched()
        if claim is not None:
            try:
                self.queue.store.release(claim, NOT_STARTED, uncounted=True)
            except StoreUnreachable:
                self.prefetched = claim  # given back once the store is back
                raise

    def drop_owed(self) -> None:
        """The run stops during an outage: what is owed is left to recovery, as if in flight."""
        for job, _ in self.unrecorded:
            self.summary.hand_back(job.claim.item_id)
        self.unrecorded.clear()
        self.owed_events.clear()

    def record_batch(self, results: list[tuple[Job, Outcome]], stop_signal: int | None) -> None:
        """Record the results of children that ended (``stop_signal``: the run's, if stopping)."""
        # Nothing is reported, and no slot refilled, before every end record is
        # fsynced. One result (always, with -j1) is written and fsynced in one
        # locked section; several share one fsync (group commit).
        store = self._store
        ended = []
        for job, outcome in results:
            for text in job.warnings:
                self.on_event(Notice(f"item {job.claim.item_id}: {text}", warning=True))
            if job.stop_reason == "stopped" and job.killed:
                self.summary.killed_on_stop += 1
            if job.stop_reason == "fenced":
                continue  # its lease is lost: the item is another runner's now
            if job.interruption and not job.stop_reason:
                self._interrupt(job, outcome)
                continue
            if job.given_back is not None and not job.stop_reason:
                self._give_back(job, *job.given_back)
                continue
            if job.stop_reason == "stopped" and not outcome.ok:
                # Taken over: nothing to give back. Unreachable: left to recovery.
                with contextlib.suppress(ClaimLost, StoreUnreachable):
                    store.release(  # fsynced by release itself
                        job.claim, f"interrupted: runner stopped by signal {stop_signal}"
                    )
                self.summary.hand_back(job.claim.item_id)
                continue
            ended.append((job, outcome))
        self.unrecorded += ended
        self.record_owed(fuse=True)

    def _interrupt(self, job: Job, outcome: Outcome) -> None:
        """``job``'s process died mid-attempt with the runner alive (a persistent
        worker): the attempt is settled as crash recovery would (a crash,
        --on-interrupted, poison after --max-crashes), durably, then reported."""
        claim = job.claim
        hand_over_log(self._store, claim, job.log_path)
        try:
            state = self._store.interrupt(
                claim,
                job.interruption,
                on_interrupted=self.options.recovery_policy,
                max_crashes=self.options.max_crashes,
            )
        except (ClaimLost, StoreUnreachable):  # taken over, or left to recovery
            self.summary.hand_back(claim.item_id)
            return
        self.summary.record(claim.item_id, state)  # held: counted held, not failed
        # A crash, not a failure: --retries does not count it (ItemFinished would say so).
        after = _AFTER_INTERRUPT.get(state, state.value)
        self.on_event(Notice(f"item {claim.item_id}: {job.interruption}; {after}", warning=True))

    def _give_back(self, job: Job, reason: str, uncounted: bool) -> None:
        """``job``'s item goes back to pending without a crash (a persistent
        worker's attempt; ``uncounted``: nothing of it ran, so the attempt
        does not count either), for a new worker. Its warnings say why."""
        if uncounted:
            self.summary.attempts -= 1
        try:
            self._store.release(job.claim, reason, uncounted=uncounted)
        except (ClaimLost, StoreUnreachable):  # taken over, or left to recovery
            self.summary.hand_back(job.claim.item_id)

    def record_owed(self, *, fuse: bool = False) -> None:
        """Write the end records of ``unrecorded``, then report them. The
        last one is written with the next claim in one locked section (with
        ``fuse``), whose fsync covers the others too (group commit). If the
        store cannot be reached, StoreUnreachable: what is left stays owed,
        and what was written waits to be synced (see ``Runner._ride_out``)."""
        if not self.unrecorded and not self.owed_events:
            return
        if self.owed_events:  # written before an outage: durable (or redone) first
            self._store.sync()
            self._count_synced()
        pending = self.unrecorded
        while pending:
            job, outcome = pending[0]
            last = len(pending) == 1
            event = self.record(job.claim, outcome, job, sync=last, fuse=fuse and last)
            del pending[0]
            self.owed_events.append(event)
        events, self.owed_events = self.owed_events, []
        self._count_synced()  # the last record's fsync covered the others
        for _ in events:
            CRASH.hit("recorded")  # test-only: die right after a durable result
        self.ready += events  # reported by the runner (Runner._emit, Runner._wait)

    def record(
        self,
        claim: Claim,
        outcome: Outcome,
        job: Job | None,
        *,
        sync: bool = True,
        fuse: bool = False,
    ) -> RunEvent:
        """Write the end record of ``claim`` (fsynced when ``sync``); with
        ``fuse``, claim the next item in the same locked section and fsync
        (kept in ``prefetched``). The caller reports the event once the
        record is durable."""
        retry_at = None
        # Exit 75 asks to be tried later: a deferral, not a failure (pacing.py).
        delay = self.pacing.delay(outcome) if asks_later(outcome) else None
        # --retries counts failures in this episode of the item's life (since
        # it was enqueued, retried by a user, or handed back on a stop), not
        # its attempts: runner crashes count against --max-crashes instead.
        if delay is None and not outcome.ok and claim.failures < self.options.retries:
            retry_at = time.time() + self._backoff(claim.failures + 1)
        if job is not None:  # a store shared by hosts keeps the log (PostgreSQL)
            hand_over_log(self._store, claim, job.log_path)
        fused, scope = self._fuse_scope() if fuse and delay is None else (False, None)
        try:
            if delay is not None:
                state = self.queue.defer(
                    claim, outcome, delay=delay, max_deferrals=self.options.max_deferrals
                )
            elif fused:
                state, self.prefetched = self.queue.finish_and_claim(
                    claim,
                    outcome,
                    retry_at=retry_at,
                    runner=self.info,
                    on_interrupted=self.options.recovery_policy,
                    max_crashes=self.options.max_crashes,
                    among=scope,
                )
            else:
                state = self.queue.finish(claim, outcome, retry_at=retry_at, sync=sync)
        except ClaimLost:  # its lease expired and another runner took the item
            text = f"item {claim.item_id} was taken over by another runner; nothing recorded"
            return Notice(text, warning=True)
        if sync or fused or delay is not None:  # durable now (a deferral syncs itself)
            self._count(claim.item_id, state, bool(outcome.log_cut))
            if delay is not None:
                self.summary.defer(claim.item_id)  # "deferred", not "waiting for a retry"
        else:
            self.unsynced.append((claim.item_id, state, bool(outcome.log_cut)))
        self.pacing.ended(outcome, deferred=delay is not None)
        if delay is not None and state is ItemState.FAILED:  # past --max-deferrals
            most = self.options.max_deferrals
            outcome = transitions.deferral_outcome(outcome, most + 1, most)
        if state is ItemState.FAILED and self.options.halt_on_failure:
            self._on_halt()
        log = job.log_path if job is not None else None
        if job is not None and job.lease_kill_at is not None and state in _SETTLED:
            # Settled for good: a detached leftover of it may go on (keeper_process.py).
            with contextlib.suppress(KeeperLost):
                job.keeper.deadline(job.token, math.inf)
        deferred = delay if state is ItemState.PENDING else None
        return ItemFinished(
            claim, outcome, state, log_path=log, retries=self.options.retries, deferred=deferred
        )

    def _count(self, item_id: int, state: ItemState, log_cut: bool) -> None:
        self.summary.record(item_id, state)
        if log_cut:
            self.summary.output_cut.add(item_id)

    def _count_synced(self) -> None:
        for item_id, state, log_cut in self.unsynced:
            self._count(item_id, state, log_cut)
        self.unsynced.clear()

    def _backoff(self, retry: int) -> float:
        """The wait before the ``retry``-th retry of this episode."""
        from statequeue.api.work import backoff  # lazy: start-up time (a failure only)

        return backoff(retry, self.options.retry_delay, self.options.retry_max_delay)
