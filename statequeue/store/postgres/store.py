"""``PostgresStore``: one queue in a PostgreSQL database, shared by runners on many hosts.

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

A store that serves a runner (``register_runner``) survives a lost
connection: each call reopens it with backoff and runs again, for up to
``PATIENCE`` seconds (or ``use_patience``) but never past the first lease
that would need fencing. A finish that failed so may be called again later:
it is then a retry of the first (``_first_try``), which may have committed.
Other callers (enqueue, status) fail at once with StoreUnreachable.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statequeue.core import lease_clock
from statequeue.core.errors import (
    ClaimLost,
    QueueNotFound,
    RunnerActive,
    StateQueueError,
    StoreUnreachable,
)
from statequeue.core.identity import boot_id, host_name
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.store import transitions
from statequeue.store.base import DEFAULT_LEASE
from statequeue.store.postgres import (
    functions,
    reads,
    reaping,
    writes,
)
from statequeue.store.postgres.actions import PostgresActions
from statequeue.store.postgres.connection import Connection, mask
from statequeue.store.postgres.leases import Leases, kill_grace
from statequeue.store.postgres.notify import Listener, Notifier
from statequeue.store.postgres.schema import migrate
from statequeue.store.postgres.scratch import open_scratch
from statequeue.store.postgres.session import PATIENCE, Session

if TYPE_CHECKING:
    from statequeue.core.views import (
        RecoveryReport,
    )

RECOVER_EVERY = 1.0
"""Seconds between recovery passes made by ``claim`` while it finds items."""
Unsynced = tuple[int, Claim, Outcome, ItemState, "float | None"]


class PostgresStore(PostgresActions):
    """Queue ``name`` in the database at ``url`` (migrated on open)."""

    stores_logs = True
    url: str  # always set: the database holds the queue

    def __init__(
        self,
        url: str,
        name: str,
        *,
        create: bool = True,
        scratch: Path | None = None,
        lease: float = DEFAULT_LEASE,
    ):
        self.name = name
        self.url = url
        self.folder = scratch
        """A local folder for this host's logs of running attempts and claim
        locks; a finished attempt's log is stored in the database (``save_log``)."""
        # Checked first (scratch.py): an unsafe one stops before the database is touched.
        self.scratch = None if scratch is None else open_scratch(scratch)
        self._recovered_at = -RECOVER_EVERY
        self._unsynced: list[Unsynced] = []
        self._leases = Leases(url, name, lease)
        self._locks = reaping.ClaimLocks(self.scratch)
        self._patience = PATIENCE
        # token -> the connection generation of its first finish try, kept
        # until the finish is settled: a later call retries that one.
        self._first_try: dict[int, int] = {}
        self._notifier = Notifier(name)
        self._listener: Listener | None = None
        session = None
        try:
            self._session = session = Session(url, self._leases.fence_at)
            with self._guard():
                migrate(self._conn)
                self._open_queue(create)
        except BaseException:
            if session is not None:
                session.close()
            self._close_scratch()
            raise

    def _close_scratch(self) -> None:
        if self.scratch is not None:
            self.scratch.close()

    def __repr__(self) -> str:
        return f"PostgresStore({mask(self.url)!r}, {self.name!r})"

    def handed_over(self, claim: Claim) -> None:
        self._locks.let_go(claim.token, remove=False)  # the keeper holds the lock now

    def use_patience(self, seconds: float) -> None:
        self._patience = seconds
        if self._session.patience:
            self._session.patience = seconds

    def use_lease(self, seconds: float) -> None:
        super().use_lease(seconds)
        self._leases.lease = seconds

    def renew(self) -> set[int]:
        """Renew every lease this store holds, in one statement, now (the
        heartbeat does this every third of the lease); returns the tokens
        found lost, which ``lost_claims`` reports too. StoreUnreachable if
        the database cannot be reached."""
        lost = self._leases.renew_now()
        if lost is None:
            raise StoreUnreachable(f"cannot reach the PostgreSQL store {mask(self.url)} to renew")
        return lost

    def lost_claims(self) -> set[int]:
        lost = self._leases.lost()
        for token in lost:
            self._locks.let_go(token, remove=False)  # the child may live on a moment
        return lost

    def fence_at(self) -> float | None:
        return self._leases.fence_at()

    def kill_by(self, token: int | None) -> float | None:
        return self._leases.kill_by(token)

    def fence_grace(self, grace: float) -> float:
        return kill_grace(self._leases.lease, grace)

    def _open_queue(self, create: bool) -> None:
        q = {"q": self.name}
        if create:
            self._conn.execute(
                "INSERT INTO statequeue.queues (name) VALUES (%(q)s) ON CONFLICT DO NOTHING", q
            )
        found = self._conn.execute("SELECT dropping FROM statequeue.queues WHERE name = %(q)s", q)
        row = found.fetchone()
        if row is None:
            raise QueueNotFound(f"no queue {self.name!r} in the PostgreSQL store")
        if row[0]:
            raise QueueNotFound(
                f"queue {self.name!r} is being dropped: run `statequeue drop {self.name} --yes`"
                " to finish"
            )

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
        recovered = False
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)
            recovered = True
        sent, row = self._claim_row(runner, among)
        if row is None and not recovered:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)
            sent, row = self._claim_row(runner, among)
        return None if row is None else self._held(runner, sent, row)

    def _held(self, runner: RunnerInfo, sent: float, row: Sequence[Any]) -> Claim:
        """The claim of a claimed row (id, item, attempts, token, interrupted, failures)."""
        item_id, item, attempt, token, interrupted, failures = row
        # Counted from before the claim was sent: the database started the
        # lease later than that, so this side never thinks it holds it longer.
        self._leases.hold(int(token), sent)
        return Claim(
            item_id=int(item_id),
            item=reads.text_of(item),
            attempt=int(attempt),
            runner_id=runner.runner_id,
            interrupted=bool(interrupted),
            failures=int(failures),
            token=int(token),
            inherit_fds=self._locks.take(int(token)),
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

        def attempt(conn: Connection) -> tuple[Any, ...] | None:
            nonlocal sent
            sent = lease_clock.now()
            return conn.execute(functions.CLAIM, params).fetchone()  # one statement: atomic

        row = self._patiently(attempt)
        return sent, row

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        target = _target(outcome, retry_at)
        generation = self._first_try.setdefault(claim.token or 0, self._session.generation)
        try:
            state = self._patiently(
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
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)  # as claim does
        params = {
            **writes.finish_params(
                self.name, claim, outcome, (_target(outcome, retry_at), retry_at)
            ),
            "now": time.time(),
            "runner": runner.runner_id,
            "lease": self._leases.lease,
            "among": sorted(among) if among is not None else None,
        }
        generation = self._first_try.setdefault(claim.token or 0, self._session.generation)
        sent = lease_clock.now()

        def attempt(conn: Connection) -> tuple[Any, ...] | None:
            nonlocal sent
            sent = lease_clock.now()
            retried = self._session.generation != generation
            return conn.execute(
                functions.FINISH_AND_CLAIM, {**params, "retried": retried}
            ).fetchone()

        row = self._patiently(attempt)
        self._forget(claim)  # finished, or stale: either way no longer held
        if row is None or row[0] is None:
            raise writes.stale(claim)
        taken = None if row[1] is None else self._held(runner, sent, row[1:])
        return ItemState(row[0]), taken

    def _forget(self, claim: Claim) -> None:
        self._first_try.pop(claim.token or 0, None)
        self._leases.drop(claim.token)
        self._locks.let_go(claim.token, remove=True)

    def release(self, claim: Claim, reason: str, *, uncounted: bool = False) -> None:
        generation = self._session.generation

        def attempt(conn: Connection) -> None:
            try:
                with conn.transaction():
                    attempts = writes.held(conn, self.name, claim)
                    writes.give_back(conn, self.name, claim, reason, attempts - uncounted)
            except ClaimLost:
                if self._session.generation == generation:
                    raise
                # Retried after a reconnect: the first try may have committed.

        try:
            self._patiently(attempt)
        finally:
            self._forget(claim)

    def sync(self) -> None:
        # A synchronous commit that writes WAL flushes every earlier
        # asynchronous commit of the cluster as well; but not one the server
        # lost in a crash: those made on an older connection are redone
        # (idempotent by token) before this returns.
        def attempt(conn: Connection) -> None:
            with conn.transaction():
                conn.execute("SELECT txid_current()")

        self._patiently(attempt)
        for generation, claim, outcome, target, retry_at in self._unsynced:
            if generation != self._session.generation:
                self._redo(claim, outcome, (target, retry_at))
        self._unsynced.clear()

    def _redo(self, claim: Claim, outcome: Outcome, end: tuple[ItemState, float | None]) -> None:
        """Finish again (synchronously) what may have been lost with an older connection."""
        self._patiently(
            lambda c: writes.finish_once(c, self.name, claim, outcome, end, sync=True, retried=True)
        )

    def recover(
        self, *, on_interrupted: OnInterrupted = OnInterrupted.RETRY, max_crashes: int = 3
    ) -> RecoveryReport:
        from statequeue.core.views import RecoveryReport

        self._recovered_at = time.monotonic()
        report = RecoveryReport()
        rule = (on_interrupted, max_crashes)

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
            reaping.reap_expired(conn, self.name, rule, report, self._locks)

        self._patiently(attempt)
        return report

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        self._session.patience = self._patience  # a runner outlives a database restart
        # A dead runner of this host is not "another runner active" (its items
        # are left to recovery, under the run's own --on-interrupted).
        self._patiently(
            lambda conn: reaping.stop_dead_runners_here(
                conn, self.name, host=host_name(), boot=boot_id()
            )
        )
        with self._tx() as conn:
            # Only an exclusive runner needs the others to wait: 16 loops
            # starting at once no longer queue on the queue row one by one.
            writes.lock_queue(conn, self.name, shared=not exclusive)
            others = [
                r for r in reads.active_runners(conn, self.name) if r.runner_id != runner.runner_id
            ]
            if exclusive and others:
                r = others[0]
                raise RunnerActive(
                    f"another runner is active on queue {self.name!r} "
                    f"(pid {r.pid} on {r.host}); not starting"
                )
            writes.add_runner(conn, self.name, runner, self._leases.lease)
        self._leases.runners.add(runner.runner_id)
        self._leases.start()

    def unregister_runner(self, runner_id: str) -> None:
        self._leases.runners.discard(runner_id)

        def attempt(conn: Connection) -> None:
            with conn.transaction():
                conn.execute(
                    "UPDATE statequeue.runners SET stopped_at = %s"
                    " WHERE queue = %s AND runner_id = %s",
                    (time.time(), self.name, runner_id),
                )
                rec = transitions.runner_stopped_record(runner_id, at=writes.now())
                writes.event(conn, self.name, rec)

        self._patiently(attempt)

    def close(self) -> None:
        """Claims still held are left to recovery (when their leases expire,
        or at once on this host once no process of theirs is left)."""
        if self._notifier.owed and not self._conn.closed:
            with suppress(StateQueueError), self._tx() as conn:
                self._notifier.notify(conn, force=True)  # the one the throttle held back
        if self._listener is not None:
            self._listener.close()
        self._leases.close()
        self._locks.close()
        self._session.close()
        self._close_scratch()


def _target(outcome: Outcome, retry_at: float | None) -> ItemState:
    """The state an attempt's outcome moves its item to."""
    return transitions.outcome_state(outcome, retry_at)
