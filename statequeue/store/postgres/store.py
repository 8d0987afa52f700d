"""``PostgresStore``: one queue in a PostgreSQL database, shared by runners on many hosts.

The store opens the queue (migrating the schema first), registers runners,
answers for the leases it holds, and hands every other Store-contract call to
one of the parts it holds, all on one session (session.py):

- ``Reader`` (reader.py): every read;
- ``Actions`` (actions.py): enqueue, the user's actions, compaction, imports
  and attempts' logs;
- ``Claims`` (claims.py): claim, finish, release, sync and recovery, with the
  fencing tokens and leases that make them safe across hosts.

A store that serves a runner (``register_runner``) survives a lost
connection: each call reopens it with backoff and runs again, for up to
``PATIENCE`` seconds (or ``use_patience``) but never past the first lease
that would need fencing. Other callers (enqueue, status) fail at once with
StoreUnreachable.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import QueueNotFound, RunnerActive, StoreUnreachable
from statequeue.core.identity import boot_id, host_name
from statequeue.core.models import (
    Claim,
    EnqueueResult,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.core.rates import RateLimit
from statequeue.core.records import Record
from statequeue.core.views import LogsRemoved
from statequeue.store import rate_bucket, transitions
from statequeue.store.base import DEFAULT_LEASE, RETRYABLE, Store
from statequeue.store.postgres import logs, queries, rate_rows, reaping, sql, writes
from statequeue.store.postgres.actions import Actions
from statequeue.store.postgres.claims import Claims
from statequeue.store.postgres.connection import Connection, mask
from statequeue.store.postgres.leases import Leases, kill_grace
from statequeue.store.postgres.notify import Listener
from statequeue.store.postgres.reader import Reader
from statequeue.store.postgres.schema import migrate
from statequeue.store.postgres.scratch import open_scratch, remove_if_unused
from statequeue.store.postgres.session import PATIENCE, Session
from statequeue.store.rate_bucket import Bucket, BucketChange

if TYPE_CHECKING:
    from statequeue.core.exported import ExportedItem
    from statequeue.core.views import (
        ActiveRunner,
        CompactResult,
        ItemHistory,
        ItemResult,
        ItemView,
        RecoveryReport,
        Status,
        StoreCheck,
        WorkerView,
    )
    from statequeue.stats.attempts import Attempt
    from statequeue.store.journal.folder import QueueFolder


class PostgresStore(Store):
    """Queue ``name`` in the database at ``url`` (migrated on open)."""

    has_leases = True
    chains_claims = True

    stores_logs = True
    url: str  # always set: the database holds the queue
    folder: Path | None
    scratch: QueueFolder | None
    """``folder`` held open and checked (folder.py), or None without one."""

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
        made_now = scratch is not None and not create and not os.path.lexists(scratch)
        # And the home and its .postgres, where this open makes them.
        above = [] if scratch is None else [scratch.parents[1], scratch.parent]
        made_above = [folder for folder in above if made_now and not os.path.lexists(folder)]
        self.scratch = None if scratch is None else open_scratch(scratch)
        self._leases = Leases(url, name, lease)
        self._locks = reaping.ClaimLocks(self.scratch)
        self._patience = PATIENCE
        self._listener: Listener | None = None
        self._started: set[str] = set()  # runners whose command is recorded
        session = None
        try:
            self._session = session = Session(url, self._leases.fence_at)
            with session.guard():
                # A look at a database without the schema builds none.
                if migrate(session.conn, build=create)[1] == 0:
                    raise writes.no_queue(name)
                self._open_queue(session.conn, create)
        except BaseException as exc:
            if session is not None:
                session.close()
            if made_now and isinstance(exc, QueueNotFound) and self.scratch is not None:
                # A look at a missing queue leaves no folder.
                remove_if_unused(self.scratch, made_above)
            self._close_scratch()
            raise
        self._reader = Reader(session, name, self.scratch)
        self._actions = Actions(session, name)
        self._claims = Claims(session, name, self._leases, self._locks)

    def _close_scratch(self) -> None:
        if self.scratch is not None:
            self.scratch.close()

    def __repr__(self) -> str:
        return f"PostgresStore({mask(self.url)!r}, {self.name!r})"

    def _open_queue(self, conn: Connection, create: bool) -> None:
        q = {"q": self.name}
        if create:
            conn.execute(
                "INSERT INTO statequeue.queues (name) VALUES (%(q)s) ON CONFLICT DO NOTHING", q
            )
        found = conn.execute("SELECT dropping FROM statequeue.queues WHERE name = %(q)s", q)
        row = found.fetchone()
        if row is None:
            raise writes.no_queue(self.name)
        if row[0]:
            raise QueueNotFound(
                f"queue {self.name!r} is being dropped: run `statequeue drop {self.name} --yes`"
                " to finish"
            )

    @property
    def logs_fd(self) -> int:
        """The scratch folder's ``logs``, held open: the runner opens each
        attempt's log relative to it, never through a link (-1: no folder)."""
        if self.scratch is None:
            return -1
        return self.scratch.subfolder(logs.SUBFOLDER, create=True)

    # The leases this store holds (leases.py).

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

    def fence_at(self) -> float | None:
        return self._leases.fence_at()

    def kill_by(self, token: int | None) -> float | None:
        return self._leases.kill_by(token)

    def fence_grace(self, grace: float) -> float:
        return kill_grace(self._leases.lease, grace)

    # Runners.

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        self._session.patience = self._patience  # a runner outlives a database restart
        if exclusive:
            # A dead runner of this host is not "another runner active" (its
            # items are left to recovery, under the run's own --on-interrupted).
            # Others leave it to their first claim's recovery, which does the
            # same: 16 loops starting at once each paid it twice.
            self._session.patiently(
                lambda conn: reaping.stop_dead_runners_here(
                    conn, self.name, host=host_name(), boot=boot_id()
                )
            )
        with self._session.transaction() as conn:
            # Only an exclusive runner needs the others to wait: 16 loops
            # starting at once no longer queue on the queue row one by one.
            writes.lock_queue(conn, self.name, shared=not exclusive)
            if exclusive:
                active = queries.active_runners(conn, self.name)
                others = [r for r in active if r.runner_id != runner.runner_id]
                if others:
                    r = others[0]
                    raise RunnerActive(
                        f"another runner is active on queue {self.name!r} "
                        f"(pid {r.pid} on {r.host}); not starting"
                    )
            self._locks.hold_runner(runner.runner_id)  # before any claim of it commits
            writes.add_runner(conn, self.name, runner, self._leases.lease)
        self._leases.runners.add(runner.runner_id)
        self._leases.start()

    def unregister_runner(self, runner_id: str) -> None:
        self._leases.runners.discard(runner_id)
        rec = transitions.runner_stopped_record(runner_id, at=writes.now())
        body, at = writes.jsonb(rec), time.time()
        params = {"q": self.name, "rid": runner_id, "at": at, "id": rec.get("id"), "body": body}

        def attempt(conn: Connection) -> None:
            # One statement, so one round trip (not BEGIN, two, COMMIT): every
            # work() loop pays it as it ends, in the run's tail.
            conn.execute(sql.RUNNER_STOPPED, params)

        self._session.patiently(attempt)
        self._locks.let_runner_go(runner_id)

    def publish_workers(self, runner_id: str, workers: Sequence[WorkerView]) -> None:
        self._leases.publish(runner_id, [[w.slot, w.pid, w.items, w.rss] for w in workers])

    # Claims (claims.py).

    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        found = self._claims.claim(
            runner, on_interrupted=on_interrupted, max_crashes=max_crashes, among=among
        )
        if found is not None and runner.runner_id not in self._started:
            self._note_started(runner)
        return found

    def _note_started(self, runner: RunnerInfo) -> None:
        # Its first attempt: its command is now the queue's last (writes.py);
        # tried again at the next claim if the database cannot be reached.
        with contextlib.suppress(StoreUnreachable):
            self._session.patiently(lambda conn: writes.runner_started(conn, self.name, runner))
            self._started.add(runner.runner_id)

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        return self._claims.finish(claim, outcome, retry_at=retry_at, sync=sync)

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
        """One statement, one transaction and one synchronous commit (claims.py)."""
        state, found = self._claims.finish_and_claim(
            claim,
            outcome,
            retry_at=retry_at,
            runner=runner,
            on_interrupted=on_interrupted,
            max_crashes=max_crashes,
            among=among,
        )
        if found is not None and runner.runner_id not in self._started:
            self._note_started(runner)
        return state, found

    def release(
        self,
        claim: Claim,
        reason: str,
        *,
        uncounted: bool = False,
        to: ItemState = ItemState.PENDING,
    ) -> None:
        self._claims.release(claim, reason, uncounted=uncounted, to=to)

    def interrupt(
        self,
        claim: Claim,
        reason: str,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
    ) -> ItemState:
        return self._claims.interrupt(
            claim, reason, on_interrupted=on_interrupted, max_crashes=max_crashes
        )

    def sync(self) -> None:
        self._claims.sync()

    # Rates and deferrals (rate_rows.py).

    def defer(
        self, claim: Claim, outcome: Outcome, *, delay: float, max_deferrals: int
    ) -> ItemState:
        return self._claims.defer(claim, outcome, delay=delay, max_deferrals=max_deferrals)

    def take_start(self, limit: RateLimit) -> tuple[float, float]:
        """One statement when the queue has a bucket and this take does not
        set its limit (``RateHooks.setting_limit``: the usual case); else set
        up through ``bucket_update`` and taken there."""
        if self.setting_limit(limit):
            return rate_bucket.take_start(self.bucket_update, limit)
        taken = self._session.patiently(lambda conn: rate_rows.take(conn, self.name))
        return rate_bucket.take_start(self.bucket_update, limit) if taken is None else taken

    def bucket_update(self, change: BucketChange, *, create: bool = True) -> Bucket | None:
        return self._session.patiently(lambda conn: rate_rows.update(conn, self.name, change))

    def deferrals(self, since: float | None = None) -> int:
        return self._session.patiently(lambda conn: rate_rows.deferrals(conn, self.name, since))

    def recover(
        self,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        only: Collection[int] | None = None,
    ) -> RecoveryReport:
        return self._claims.recover(
            on_interrupted=on_interrupted, max_crashes=max_crashes, only=only
        )

    def check_starts(self, claim: Claim) -> None:
        self._claims.mark_check(claim, over=False)

    def check_ends(self, claim: Claim) -> None:
        self._claims.mark_check(claim, over=True)

    def handed_over(self, claim: Claim) -> None:
        self._claims.handed_over(claim)

    def lost_claims(self) -> set[int]:
        return self._claims.lost_claims()

    # Enqueue and the user's actions (actions.py).

    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        return self._actions.enqueue(items)

    def retry(
        self, ids: Sequence[int] | None, *, states: Collection[ItemState] = RETRYABLE
    ) -> list[int]:
        return self._actions.retry(ids, states=states)

    def cancel(self, ids: Sequence[int]) -> list[int]:
        return self._actions.cancel(ids)

    def set_paused(self, paused: bool) -> None:
        self._actions.set_paused(paused)

    def compact(self) -> CompactResult:
        """Moves done and cancelled items' results and events to the archive
        tables (actions.py, archive.py)."""
        return self._actions.compact()

    def save_log(self, claim: Claim, data: bytes) -> bool:
        return self._actions.save_log(claim, data)

    def remove_finished_logs(self, keep: float) -> LogsRemoved:
        cutoff = time.time() - keep
        with self._session.transaction() as conn:
            files, size = logs.remove_finished(conn, self.name, cutoff)
        return LogsRemoved(files, size)

    def import_items(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        return self._actions.import_items(entries)

    def wake_fd(self) -> int | None:
        if self._listener is None:
            self._listener = Listener(self.url, self.name)
        return self._listener.fileno()

    def drain_wake(self) -> bool:
        return self._listener is not None and self._listener.drain()

    # Reads (reader.py).

    def active_runners(self) -> list[ActiveRunner]:
        return self._reader.active_runners()

    def commands(self) -> list[list[str]]:
        return self._reader.commands()

    def is_paused(self) -> bool:
        return self._reader.is_paused()

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        return self._reader.next_due(among)

    def status(self) -> Status:
        found = self._reader.status(self._held_here)
        waiting = self._session.patiently(lambda c: rate_rows.deferred_waiting(c, self.name))
        return replace(found, deferred=waiting)

    def retry_waiting(self) -> tuple[int, float | None]:
        now = time.time()
        return self._session.patiently(lambda c: queries.retry_waiting(c, self.name, now))

    def interrupted(self) -> tuple[int, ...]:
        return self._reader.runner_gone(self._held_here)[0]

    def held_by_dead_runner(self) -> tuple[int, ...]:
        return self._reader.runner_gone(self._held_here)[1]

    def _held_here(self, token: int, runner_id: str) -> bool:
        """Whether a process on this host holds the claim lock of ``token``
        (``runner_id``'s, when the claim has no file): as recovery asks."""
        return self._locks.is_held(token, runner_id or None)

    def runner_hosts(self, runner_ids: Collection[str]) -> dict[str, str]:
        return self._reader.runner_hosts(runner_ids)

    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        return self._reader.items(state)

    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        return self._reader.results(state)

    def result(self, item_id: int) -> ItemResult | None:
        return self._reader.result(item_id)

    def results_of(self, ids: Collection[int]) -> dict[int, ItemResult]:
        return self._reader.results_of(ids)

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        return self._reader.find_ids(texts)

    def live_texts(self, ids: Collection[int]) -> dict[int, str]:
        if not ids:
            return {}
        with self._session.guard():
            return queries.live_texts(self._session.conn, self.name, sorted(ids))

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        return self._reader.states(ids)

    def history(self, item_id: int) -> ItemHistory:
        return self._reader.history(item_id)

    def check(self, *, repair: bool = False) -> StoreCheck:
        return self._reader.check(repair=repair)

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        return self._reader.read_log(item_id, attempt, offset)

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        return self._reader.read_events(cursor)

    def notices(self) -> list[str]:
        # A reap lock another session keeps (reaping.ReapWait), said once.
        return self._claims.reap_wait.take()

    def export_items(self) -> Iterator[ExportedItem]:
        return self._reader.export_items()

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        return self._reader.iter_attempts(since)

    def close(self) -> None:
        """Claims still held are left to recovery (when their leases expire,
        or at once on this host once no process of theirs is left)."""
        self._actions.send_owed_notify()
        if self._listener is not None:
            self._listener.close()
        self._leases.close()
        self._locks.close()
        self._session.close()
        self._close_scratch()
