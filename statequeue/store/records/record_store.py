"""The logic every record-based store shares: the journal and memory stores
persist records and replay them into a ``QueueState``; this class turns that
into the ``Store`` contract."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Collection, Container, Sequence
from contextlib import AbstractContextManager

from statequeue.core.errors import StateQueueError
from statequeue.core.exported import ExportedItem
from statequeue.core.gcpause import gc_paused
from statequeue.core.models import (
    Claim,
    EnqueueResult,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.core.records import Record, item_fields, item_text
from statequeue.core.views import (
    RecoveryReport,
)
from statequeue.store import transitions
from statequeue.store.records.backend import record_time
from statequeue.store.records.pending import is_due
from statequeue.store.records.record_runners import RecordRunners
from statequeue.store.records.recovery import Recovery, crash_record
from statequeue.store.records.runners import RunnerRegistry
from statequeue.store.records.state import LiveItem, QueueState
from statequeue.store.records.user_actions import UserActions
from statequeue.store.transitions import RETRYABLE

ENQUEUE_BATCH = 20_000


class RecordStore(RecordRunners):
    """Store logic over a ``QueueState``: subclasses persist records and tell
    whether a claim is still held by a live process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = QueueState(self._load_text)
        self._notices: list[str] = []
        # The store's jobs beside claims and reads, each an object it holds.
        backend = _Backend(self)
        self._registry = RunnerRegistry(backend, workers=self.published_workers)
        self._recovery = Recovery(backend, self._registry)
        self._actions = UserActions(backend)
        self._reserved: tuple[int, tuple[int, ...]] | None = None  # (id, claim fds): reserve()

    # -- what a backend provides ---------------------------------------------

    @abstractmethod
    def _locked(self) -> AbstractContextManager[QueueState]:
        """Hold the queue exclusively, with ``state`` brought up to date."""

    def _import(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        from statequeue.store.records import transfer  # lazy: start-up time (not on enqueue)

        return transfer.import_items(_Backend(self), entries)

    @abstractmethod
    def _write(self, batch: list[Record], *, sync: bool) -> None:
        """Persist ``batch`` (fsync when ``sync``), then apply it to ``state``
        with each record's locator."""

    @abstractmethod
    def _load_text(self, item_id: int, loc: int) -> str:
        """The text of item ``item_id``, held by the record at locator ``loc``
        (given to ``apply``); DamagedState if that record is not about it."""

    @abstractmethod
    def _take_claim(self, item_id: int) -> tuple[int, ...] | None:
        """Hold ``item_id``'s claim; returns fds to inherit, or None if held elsewhere."""

    @abstractmethod
    def _drop_claim(self, item_id: int) -> None:
        """Stop holding ``item_id``'s claim."""

    @abstractmethod
    def _runner_alive(self, runner_id: str) -> bool:
        """True when the runner is alive (or this process is it)."""

    def _write_settling(self, rec: Record, item_id: int, *, sync: bool) -> None:
        """Write the record that settles a claim, then let the claim go,
        whatever interrupts in between: a second Ctrl-C that landed after the
        record (a give-back's "pending") and before the claim was let go left
        this process holding the claim of an item the journal called pending,
        which no run or work() loop could take while it lived (an outside
        tester's double Ctrl-C). Let go even if the write failed: the
        attempt has ended by then (its process exited, or it is kept by the
        run's keeper, whose inherited claim stays held), so the next
        recovery records it interrupted, as after a crash."""
        try:
            self._write([rec], sync=sync)
        finally:
            self._drop_claim(item_id)

    def _maybe_compact(self, state: QueueState) -> None:
        """Compact when enough dead records piled up (stores with a journal)."""

    def _forget_runner(self, runner_id: str) -> None:
        """Release whatever a dead runner left behind (its lock file)."""

    def _known_keys(self, state: QueueState) -> Container[str]:
        """Every item text ever enqueued (subclasses add archived ones).

        Built on first use from the journal's records, then kept up to date by
        ``QueueState.apply``."""
        keys = state.merged_keys()
        if keys is None:
            keys = state.keys = {
                item_text(r): r["id"]
                for r in self._journal_records()
                if r.get("t") in ("enq", "item")
            }
        return keys

    # -- the contract --------------------------------------------------------

    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        with gc_paused():
            return self._enqueue(items)

    def _enqueue(self, items: Sequence[str]) -> EnqueueResult:
        # Repeats within the input go first (dict.fromkeys keeps the order), so
        # a batch need not be checked against the batches before it. A set
        # finds out whether there are any at half the cost of the dict (the
        # usual `find | statequeue enqueue` has none), and leaves every
        # text's hash cached for the dict and the batches' lookups.
        unique = list(items) if len(set(items)) == len(items) else list(dict.fromkeys(items))
        added = 0
        keys: Container[str] = {}
        keys_of: object = None
        for start in range(0, max(len(unique), 1), ENQUEUE_BATCH):
            batch = unique[start : start + ENQUEUE_BATCH]
            with self._locked() as state:
                if keys_of is None or keys_of is not state.keys:
                    # First batch, or the state was reloaded (another process
                    # compacted): take the keys afresh. Records other processes
                    # appended meanwhile are in them through ``apply``.
                    keys = self._known_keys(state)
                    keys_of = state.keys
                if isinstance(keys, dict):
                    known = keys.keys() & batch  # a C-level pass
                    fresh = [t for t in batch if t not in known] if known else batch
                else:
                    fresh = [t for t in batch if t not in keys]
                self._append_enqueued(state.next_id, fresh)
                added += len(fresh)
        return EnqueueResult(added=added, skipped=len(items) - added)

    def _append_enqueued(self, first_id: int, texts: list[str]) -> None:
        """Durably record ``texts`` as new items ``first_id``, ... and apply them."""
        records: list[Record] = [
            {"t": "enq", "id": first_id + i, **item_fields(text)} for i, text in enumerate(texts)
        ]
        if records:  # the batch's time, once (see core.records.enqueue_times)
            records[0]["at"] = round(time.time(), 3)
        self._write(records, sync=True)

    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        with self._locked() as state:
            return self._claim_locked(state, runner, on_interrupted, max_crashes, among)

    def _claim_locked(
        self,
        state: QueueState,
        runner: RunnerInfo,
        on_interrupted: OnInterrupted,
        max_crashes: int,
        among: Collection[int] | None,
    ) -> Claim | None:
        self._recovery.recover(state, on_interrupted, max_crashes)
        if state.paused:
            self._unreserve_locked(state)
            return None
        now = time.time()
        found = self._take_reserved(state, now, among)
        if found is None:
            found = state.order.first_claimable(now, among, self._take_claim)
        if found is None:
            return None
        item, fds = found
        attempt = item.attempts + 1
        interrupted = item.interrupted
        start: Record = {
            "t": "start",
            "id": item.id,
            "attempt": attempt,
            "runner": runner.runner_id,
            "at": round(time.time(), 3),
        }
        self._write([start], sync=False)
        return Claim(
            item_id=item.id,
            item=item.text,
            attempt=attempt,
            runner_id=runner.runner_id,
            inherit_fds=fds,
            interrupted=interrupted,
            failures=item.failures,
        )

    def reserve(self, *, among: Collection[int] | None = None) -> bool:
        if self._reserved is not None:
            return True
        with self._locked() as state:
            if state.paused:
                return False
            found = state.order.first_claimable(time.time(), among, self._take_claim)
            if found is None:
                return False
            item, fds = found
            # Out of the pending order (first_claimable took it) only while
            # held: the claim takes it as it is (_take_reserved), a drop puts
            # it back (_unreserve_locked). Its text is loaded now, off the
            # claim's path; nothing is written.
            item.text  # noqa: B018  # loaded (and kept) for the claim
            self._reserved = (item.id, fds)
            return True

    def unreserve(self) -> None:
        if self._reserved is None:
            return
        with self._locked() as state:
            self._unreserve_locked(state)

    def _unreserve_locked(self, state: QueueState) -> None:
        """Let the reserved claim lock go; the item goes back in the pending order."""
        if self._reserved is None:
            return
        item_id, _ = self._reserved
        self._reserved = None
        self._drop_claim(item_id)
        state.order.put_back([item_id])

    def _take_reserved(
        self, state: QueueState, now: float, among: Collection[int] | None
    ) -> tuple[LiveItem, tuple[int, ...]] | None:
        """The reserved item and its claim fds, if it is still due, pending and
        of ``among``; else the reservation is let go (None)."""
        if self._reserved is None:
            return None
        item_id, fds = self._reserved
        item = state.get(item_id)
        if item is None or not is_due(item, now) or (among is not None and item_id not in among):
            self._unreserve_locked(state)
            return None
        self._reserved = None
        return item, fds

    def recover(
        self,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        only: Collection[int] | None = None,
    ) -> RecoveryReport:
        """Apply the policy to items whose runner (and its children) are gone."""
        with self._locked() as state:
            return self._recovery.recover(state, on_interrupted, max_crashes, only)

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        with self._locked() as state:
            target = self._finish_locked(state, claim, outcome, retry_at, sync=sync)
            self._maybe_compact(state)
            return target

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
        # One locked section and one fsync for the end record and the next
        # start: the fsync comes before the lock is let go, so no other process
        # reads the result before it is durable, and before this returns, so
        # the runner reports it (and starts the next item) only once it is.
        with self._locked() as state:
            target = self._finish_locked(state, claim, outcome, retry_at, sync=False)
            try:
                taken = self._claim_locked(state, runner, on_interrupted, max_crashes, among)
            except OSError:
                # The next claim is a bonus: the result stands. The runner's
                # own claim meets the same error (e.g. EMFILE) and handles it.
                taken = None
            self._sync_written()
            self._maybe_compact(state)
            return target, taken

    def _finish_locked(
        self,
        state: QueueState,
        claim: Claim,
        outcome: Outcome,
        retry_at: float | None,
        *,
        sync: bool,
    ) -> ItemState:
        self._claimed_item(state, claim)
        target = transitions.outcome_state(outcome, retry_at)
        rec = transitions.end_record(claim, outcome, target, at=record_time())
        # Who ran it, for `stats` per runner and host: the runner's own
        # record does not survive compaction, this one's summary does.
        rec["runner"] = claim.runner_id
        host = state.runners.get(claim.runner_id, {}).get("host")
        if host:
            rec["host"] = host
        if retry_at is not None and not outcome.ok:
            rec["retry_at"] = retry_at
        self._write_settling(rec, claim.item_id, sync=sync)
        return target

    def defer(
        self, claim: Claim, outcome: Outcome, *, delay: float, max_deferrals: int
    ) -> ItemState:
        with self._locked() as state:
            count = self._claimed_item(state, claim).deferrals + 1
            if transitions.deferral_state(count, max_deferrals) is ItemState.FAILED:
                failed = transitions.deferral_outcome(outcome, count, max_deferrals)
                return self._finish_locked(state, claim, failed, None, sync=True)
            at = time.time()  # unrounded: the record rounds its retry time down
            rec = transitions.defer_record(claim, outcome, delay=delay, deferrals=count, at=at)
            self._write_settling(rec, claim.item_id, sync=True)
            return ItemState.PENDING

    def _sync_written(self) -> None:
        """Make every record written so far durable; the caller holds the lock
        (``sync`` takes it). Stores whose writes are durable at once need nothing."""

    def release(
        self,
        claim: Claim,
        reason: str,
        *,
        uncounted: bool = False,
        to: ItemState = ItemState.PENDING,
    ) -> None:
        with self._locked() as state:
            item = self._claimed_item(state, claim)
            # An item claimed after a crash keeps that mark (a --verify stopped
            # by a signal, or that could not run, must be able to settle it later).
            rec = transitions.interrupted_record(
                item.id,
                item.attempts,
                to,
                reason,
                crashed=claim.interrupted and to is ItemState.PENDING,
                at=record_time(),
            )
            if uncounted:
                rec["attempts"] = claim.attempt - 1  # as if it had never been claimed
            self._write_settling(rec, claim.item_id, sync=True)

    def check_starts(self, claim: Claim) -> None:
        self._check_mark(claim, over=False)

    def check_ends(self, claim: Claim) -> None:
        self._check_mark(claim, over=True)

    def _check_mark(self, claim: Claim, *, over: bool) -> None:
        with self._locked() as state:
            self._claimed_item(state, claim)
            # Unsynced, as the start record: a dead runner does not lose it
            # (the kernel has it), and a power cut ends the attempt's processes too.
            rec = transitions.check_record(claim, over=over, at=record_time())
            self._write([rec], sync=False)

    def interrupt(
        self,
        claim: Claim,
        reason: str,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
    ) -> ItemState:
        with self._locked() as state:
            item = self._claimed_item(state, claim)
            rec, target = crash_record(item, claim.runner_id, on_interrupted, max_crashes, reason)
            self._write_settling(rec, claim.item_id, sync=True)
            return target

    def _claimed_item(self, state: QueueState, claim: Claim) -> LiveItem:
        item = state.get(claim.item_id)
        if (
            item is None
            or item.state is not ItemState.RUNNING
            or item.runner != claim.runner_id
            or item.attempts != claim.attempt
        ):
            raise StateQueueError(transitions.lost_claim_text(claim))
        return item

    def notices(self) -> list[str]:
        out, self._notices = self._notices, []
        return out

    def retry(
        self, ids: Sequence[int] | None, *, states: Collection[ItemState] = RETRYABLE
    ) -> list[int]:
        return self._actions.retry(ids, states)

    def cancel(self, ids: Sequence[int]) -> list[int]:
        return self._actions.cancel(ids)

    def set_paused(self, paused: bool) -> None:
        self._actions.set_paused(paused)

    def is_paused(self) -> bool:
        return self.state.paused

    def retry_waiting(self) -> tuple[int, float | None]:
        return self.state.order.waiting(time.time())  # a hint, as next_due

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        # Read without the lock, as the runner always did: a hint for how long
        # to sleep, refreshed by every claim.
        order = self.state.order
        return order.next_due() if among is None else order.due_among(among)


class _Backend:
    """The store's hooks under the names its parts use (``RecordBackend``),
    looked up on each call so that a backend's overrides apply."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store

    @property
    def name(self) -> str:
        return self._store.name

    def locked(self) -> AbstractContextManager[QueueState]:
        return self._store._locked()

    def write(self, batch: list[Record], *, sync: bool) -> None:
        self._store._write(batch, sync=sync)

    def claim_free(self, item: LiveItem) -> bool:
        return self._store._claim_free(item)

    def runner_alive(self, runner_id: str) -> bool:
        return self._store._runner_alive(runner_id)

    def forget_runner(self, runner_id: str) -> None:
        self._store._forget_runner(runner_id)

    def known_keys(self, state: QueueState) -> Container[str]:
        return self._store._known_keys(state)
