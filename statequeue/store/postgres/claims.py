"""A runner's claims on a PostgreSQL queue: claim, finish, release, and the
recovery of expired ones. ``PostgresStore`` holds a ``Claims`` and hands
these calls to it.

Claims are one ``FOR UPDATE SKIP LOCKED`` statement on a hot table of
unfinished items. Each claim gets a fencing token from a sequence and a lease
end from the database clock; finish, release and renew name the token, so a
runner whose item was taken over changes nothing (ClaimLost). One result per
token is enforced by the results table's key, so a finish retried after a lost
commit acknowledgement returns the state already recorded.

Liveness is the item's lease, never the connection: a heartbeat thread with
its own connection renews every held lease (leases.py), and a runner that
cannot renew in time learns it from ``lost_claims`` and stops the children
before the lease ends (self-fencing). ``recover`` treats an expired lease as
an interrupted attempt and applies the ``--on-interrupted`` policy; one
reaper at a time (``queues.last_reap_at``), each re-checking the lease on the
locked row. On the same host (host name and boot id), an item whose runner's
pid is gone and whose claim lock file is free (no process of the item is
left: the keeper holds it until then) is recovered at once.

Every call here goes through ``Session.patiently``: a store that serves a
runner reconnects and runs it again (session.py). A finish that failed so
may be called again later: it is then a retry of the first (``_first_try``),
which may have committed. A claim retried so first adopts the claim its first
try committed, if any (``sql.ADOPT_CLAIM``); one it never heard of at all
(the call gave up) is recovered by this runner's own reaper once its lease
ends (``reaping.ClaimLocks``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Sequence
from typing import Any

import psycopg

from statequeue.core import lease_clock
from statequeue.core.errors import ClaimLost, QueueNotFound, StateQueueError
from statequeue.core.identity import boot_id, host_name
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.core.views import RecoveryReport
from statequeue.store import transitions
from statequeue.store.postgres import (
    check_marks,
    functions,
    queries,
    rate_rows,
    reaping,
    sql,
    writes,
)
from statequeue.store.postgres.connection import Connection
from statequeue.store.postgres.leases import Leases
from statequeue.store.postgres.prepared_call import PreparedCall
from statequeue.store.postgres.session import Session

RECOVER_EVERY = 1.0
"""Seconds between recovery passes made by ``claim`` while it finds items."""
Unsynced = tuple[int, Claim, Outcome, ItemState, "float | None"]
Cursor = psycopg.Cursor[tuple[Any, ...]]
_FINISH_AND_CLAIM = PreparedCall(
    "statequeue_finish_and_claim",
    functions.FINISH_AND_CLAIM,
    ("text", "bigint", "bytea", "integer", "bigint", "boolean", "integer"),
)
"""The per-item statement, called without a cursor (prepared_call.py)."""


class Claims:
    """The claims of queue ``name`` held through one session: their leases
    (``leases``, renewed by its heartbeat) and this host's claim lock files
    (``locks``). The store owns and closes both."""

    def __init__(
        self, session: Session, name: str, leases: Leases, locks: reaping.ClaimLocks
    ) -> None:
        self._session = session
        self.name = name
        self._leases = leases
        self._locks = locks
        self._recovered_at = -RECOVER_EVERY
        self.reap_wait = reaping.ReapWait()  # its notice: the store's notices()
        self._unsynced: list[Unsynced] = []
        # token -> the connection generation of its first finish try, kept
        # until the finish is settled: a later call retries that one.
        self._first_try: dict[int, int] = {}
        self._kept: Cursor | None = None

    def handed_over(self, claim: Claim) -> None:
        self._locks.let_go(claim.token, remove=False)  # the keeper holds the lock now

    def lost_claims(self) -> set[int]:
        lost = self._leases.lost()
        for token in lost:
            self._locks.let_go(token, remove=False)  # the child may live on a moment
        return lost

    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        # Recovery looks for expired leases: at most every RECOVER_EVERY
        # seconds while claims succeed, and always before reporting that
        # nothing is left (an orphan may be all there is).
        self._check_registered(runner)
        recovered = False
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)
            recovered = True
        sent, row = self._claim_row(runner, among)
        if row is None and not recovered:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)
            sent, row = self._claim_row(runner, among)
        return None if row is None else self._held(runner, sent, row)

    def _check_registered(self, runner: RunnerInfo) -> None:
        """Before a claim by a runner that no renewal has confirmed for a lease
        (it was frozen): QueueNotFound if its row is gone. The queue was
        dropped meanwhile (`drop` refuses only while a runner is alive), maybe
        made again under its name: a resumed runner worked the new queue's
        items unregistered, unseen by `status` and by `drop` (an outside
        tester's finding). One clock read per claim otherwise."""
        if runner.runner_id not in self._leases.runners or not self._leases.overdue():
            return
        leases = self._leases
        if not self._session.patiently(lambda conn: leases.registered(conn, runner.runner_id)):
            raise QueueNotFound(
                f"queue {self.name!r} was dropped while runner {runner.runner_id[:8]} was"
                " stopped: it claims nothing more (a queue made again under the name is"
                " another queue)"
            )

    def _held(self, runner: RunnerInfo, sent: float, row: Sequence[Any]) -> Claim:
        """The claim of a claimed row (id, item, attempts, token, interrupted, failures)."""
        item_id, item, attempt, token, interrupted, failures = row
        # Counted from before the claim was sent: the database started the
        # lease later than that, so this side never thinks it holds it longer.
        self._leases.hold(int(token), sent)
        return Claim(
            item_id=int(item_id),
            item=queries.text_of(item),
            attempt=int(attempt),
            runner_id=runner.runner_id,
            interrupted=bool(interrupted),
            failures=int(failures),
            token=int(token),
            inherit_fds=self._locks.take(
                int(token), runner.runner_id if runner.in_process else None
            ),
        )

    def _claim_row(
        self, runner: RunnerInfo, among: Collection[int] | None
    ) -> tuple[float, tuple[Any, ...] | None]:
        params = {
            "q": self.name,
            "now": time.time(),
            "runner": runner.runner_id,
            "lease": self._leases.lease,
            "among": sorted(among) if among is not None else None,
        }
        sent = lease_clock.now()
        generation = self._session.generation

        def attempt(conn: Connection) -> tuple[Any, ...] | None:
            nonlocal sent
            sent = lease_clock.now()
            if self._session.generation != generation:
                # Retried on a new connection: the first try may have
                # committed, its answer lost (a server stopped right after
                # the commit). That claim is this call's, not a second one:
                # left alone, no process would run it, and its runner's
                # host would wait for it as long as the runner lives. The
                # first try may still be running on the server (only the
                # connection was cut): its end is waited for first, else
                # its item, locked, was skipped and the next one claimed.
                self._session.wait_for_previous(conn)
                adopted = conn.execute(sql.ADOPT_CLAIM, params).fetchone()
                if adopted is not None:
                    return adopted
            # One statement: atomic.
            return self._cursor(conn).execute(functions.CLAIM, params).fetchone()

        row = self._session.patiently(attempt)
        return sent, row

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        target = _target(outcome, retry_at)
        generation = self._first_try.setdefault(claim.token or 0, self._session.generation)
        try:
            state = self._session.patiently(
                lambda conn: writes.finish_once(
                    conn,
                    self.name,
                    claim,
                    outcome,
                    (target, retry_at),
                    sync=sync,
                    retried=self._session.generation != generation,
                )
            )
        except ClaimLost:
            self._forget(claim)
            self._note_discarded(claim, outcome)
            raise
        if not sync:
            self._unsynced.append((self._session.generation, claim, outcome, target, retry_at))
        self._forget(claim)
        return state

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
        """One statement, one transaction and one synchronous commit: the result
        is durable before this returns. No next claim (None) when none is due
        (the runner's own ``claim`` then recovers orphans before it says so)."""
        self._check_registered(runner)
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)  # as claim does
        params = writes.finish_params(
            self.name, claim, outcome, (_target(outcome, retry_at), retry_at)
        )
        params["now"] = time.time()
        params["runner"] = runner.runner_id
        params["lease"] = self._leases.lease
        params["among"] = sorted(among) if among is not None else None
        generation = self._first_try.setdefault(claim.token or 0, self._session.generation)
        sent = lease_clock.now()

        def attempt(conn: Connection) -> tuple[Any, ...] | None:
            nonlocal sent
            sent = lease_clock.now()
            params["retried"] = self._session.generation != generation
            if _FINISH_AND_CLAIM.usable(conn):
                return _FINISH_AND_CLAIM(conn, params)
            return self._cursor(conn).execute(functions.FINISH_AND_CLAIM, params).fetchone()

        row = self._session.patiently(attempt)
        self._forget(claim)  # finished, or stale: either way no longer held
        if row is None or row[0] is None:
            self._note_discarded(claim, outcome)
            raise writes.stale(claim)
        taken = None if row[1] is None else self._held(runner, sent, row[1:])
        return ItemState(row[0]), taken

    def _note_discarded(self, claim: Claim, outcome: Outcome) -> None:
        """Record that ``claim``'s result was thrown away (its token was stale):
        the queue's history, not only the runner's stderr, says so. Best
        effort: the caller is told by ClaimLost either way."""
        reason = outcome.reason or ("ok" if outcome.ok else "failed")
        record = transitions.discarded_record(claim, reason, at=writes.now())
        with contextlib.suppress(StateQueueError), self._session.transaction() as conn:
            writes.event(conn, self.name, record)

    def _forget(self, claim: Claim) -> None:
        self._first_try.pop(claim.token or 0, None)
        self._leases.drop(claim.token)
        self._locks.let_go(claim.token, remove=True)

    def _cursor(self, conn: Connection) -> Cursor:
        """A cursor of ``conn`` kept for the per-item statements: psycopg sets
        up its adapters once per cursor, and ``conn.execute`` makes a new
        cursor per call (~15 us of CPU per statement of ~20 parameters)."""
        cursor = self._kept
        if cursor is None or cursor.connection is not conn or cursor.closed:
            cursor = self._kept = conn.cursor()
        return cursor

    def release(
        self,
        claim: Claim,
        reason: str,
        *,
        uncounted: bool = False,
        to: ItemState = ItemState.PENDING,
    ) -> None:
        generation = self._session.generation

        def attempt(conn: Connection) -> None:
            try:
                with conn.transaction():
                    attempts = writes.held(conn, self.name, claim)
                    writes.give_back(conn, self.name, claim, reason, attempts - uncounted, to)
            except ClaimLost:
                if self._session.generation == generation:
                    raise
                # Retried after a reconnect: the first try may have committed.

        try:
            self._session.patiently(attempt)
        finally:
            self._forget(claim)

    def defer(
        self, claim: Claim, outcome: Outcome, *, delay: float, max_deferrals: int
    ) -> ItemState:
        """``Store.defer``: the deferral in one transaction (rate_rows.py);
        past ``max_deferrals``, the attempt's end as a failure saying so."""
        try:
            count = self._session.patiently(
                lambda conn: rate_rows.defer_once(
                    conn, self.name, claim, outcome, delay, max_deferrals
                )
            )
        except ClaimLost:
            self._forget(claim)
            raise
        if transitions.deferral_state(count, max_deferrals) is not ItemState.PENDING:
            failed = transitions.deferral_outcome(outcome, count, max_deferrals)
            return self.finish(claim, failed)
        self._forget(claim)
        return ItemState.PENDING

    def mark_check(self, claim: Claim, *, over: bool) -> None:
        """``Store.check_starts`` (``check_ends`` when ``over``): check_marks.py."""
        self._session.patiently(lambda conn: check_marks.mark(conn, self.name, claim, over=over))

    def interrupt(
        self,
        claim: Claim,
        reason: str,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
    ) -> ItemState:
        generation = self._session.generation
        settled: list[ItemState] = []

        def attempt(conn: Connection) -> None:
            try:
                with conn.transaction():
                    attempts, crashes = writes.held_crashes(conn, self.name, claim)
                    target = transitions.recovery_state(on_interrupted, crashes + 1, max_crashes)
                    writes.recover_one(
                        conn,
                        self.name,
                        claim.item_id,
                        attempts,
                        crashes + 1,
                        target,
                        on_interrupted,
                        interrupted=reason,
                    )
                    settled.append(target)
            except ClaimLost:
                if self._session.generation == generation:
                    raise
                # Retried after a reconnect: the first try may have committed.

        try:
            self._session.patiently(attempt)
        finally:
            self._forget(claim)
        return settled[-1] if settled else ItemState.PENDING

    def sync(self) -> None:
        # A synchronous commit that writes WAL flushes every earlier
        # asynchronous commit of the cluster as well; but not one the server
        # lost in a crash: those made on an older connection are redone
        # (idempotent by token) before this returns.
        def attempt(conn: Connection) -> None:
            with conn.transaction():
                conn.execute("SELECT txid_current()")

        self._session.patiently(attempt)
        for generation, claim, outcome, target, retry_at in self._unsynced:
            if generation != self._session.generation:
                self._redo(claim, outcome, (target, retry_at))
        self._unsynced.clear()

    def _redo(self, claim: Claim, outcome: Outcome, end: tuple[ItemState, float | None]) -> None:
        """Finish again (synchronously) what may have been lost with an older connection."""
        self._session.patiently(
            lambda c: writes.finish_once(c, self.name, claim, outcome, end, sync=True, retried=True)
        )

    def recover(
        self,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        only: Collection[int] | None = None,
    ) -> RecoveryReport:
        if only is None:
            self._recovered_at = time.monotonic()
        report = RecoveryReport()
        rule = (on_interrupted, max_crashes, only)

        def attempt(conn: Connection) -> None:
            reaping.reap_same_host(
                conn,
                self.name,
                host=host_name(),
                boot=boot_id(),
                locks=self._locks,
                rule=rule,
                report=report,
            )
            reaping.reap_expired(
                conn, self.name, rule, report, self._locks, self.reap_wait, self._leases.own()
            )

        self._session.patiently(attempt)
        return report


def _target(outcome: Outcome, retry_at: float | None) -> ItemState:
    """The state an attempt's outcome moves its item to."""
    return transitions.outcome_state(outcome, retry_at)
