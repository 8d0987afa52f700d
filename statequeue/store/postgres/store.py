"""``PostgresStore``: one queue in a PostgreSQL database, shared by runners on many hosts.

Step 1 of issue 12. Claims are one ``FOR UPDATE SKIP LOCKED`` statement on a
hot table of unfinished items; each claim gets a fencing token from a
sequence, and finish and release name it (a stale token changes nothing).

Liveness, for now: each store holds a session advisory lock on its own
connection; a claim or runner whose session lock is gone is dead, and
``recover`` applies the ``--on-interrupted`` policy to its items.

TODO(step 2): leases (``live.lease_until`` on the database clock), heartbeat
renewal, self-fencing of children before the lease ends, recovery by lease
expiry (with same-host pid/boot-id shortcut), the idempotent retried finish.
A runner killed with -9 whose child lives on is NOT fenced yet: promise 4
across hosts waits for step 2.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from statequeue.errors import ClaimLost, ItemNotFound, QueueNotFound, RunnerActive
from statequeue.models import Claim, EnqueueResult, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.records import Record
from statequeue.store.base import RETRYABLE, Store
from statequeue.store.postgres import reads, sql, writes
from statequeue.store.postgres.connection import Connection, connect, guarded, mask
from statequeue.store.postgres.schema import LOCK_CLASS, migrate

if TYPE_CHECKING:
    from statequeue.attempts import Attempt
    from statequeue.views import (
        ActiveRunner,
        CompactResult,
        ItemHistory,
        ItemResult,
        ItemView,
        RecoveryReport,
        Status,
    )

ENQUEUE_BATCH = 20_000
RECOVER_EVERY = 1.0
"""Seconds between recovery passes made by ``claim`` while it finds items."""


class PostgresStore(Store):
    """Queue ``name`` in the database at ``url`` (migrated on open)."""

    def __init__(self, url: str, name: str, *, create: bool = True, scratch: Path | None = None):
        self.name = name
        self.url = url
        self.folder = scratch
        """A local folder for this host's logs of running attempts (logs go
        into the database in a later step)."""
        self._recovered_at = -RECOVER_EVERY
        self._conn: Connection = connect(url)
        with self._guard():
            # Whatever the database's default: a result is on the server's
            # disk before finish() returns (promise 1); finish(sync=False)
            # lowers it per transaction, for group commit.
            self._conn.execute("SET synchronous_commit = on")
            migrate(self._conn)
            self._session = self._hold_session()
            self._open_queue(create)

    def __repr__(self) -> str:
        return f"PostgresStore({mask(self.url)!r}, {self.name!r})"

    @contextmanager
    def _guard(self) -> Iterator[None]:
        with guarded(self.url):
            yield

    @contextmanager
    def _tx(self, *, sync: bool = True) -> Iterator[Connection]:
        with self._guard(), self._conn.transaction():
            if not sync:
                # Group commit: a later synchronous commit (``sync``) flushes
                # the WAL past this one too.
                self._conn.execute("SET LOCAL synchronous_commit = off")
            yield self._conn

    def _hold_session(self) -> int:
        """A session key, locked for as long as this connection lives: what
        tells other processes that this store's claims and runners are alive."""
        row = self._conn.execute("SELECT nextval('statequeue.sessions')").fetchone()
        assert row is not None
        key = int(row[0])
        self._conn.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, key))
        return key

    def _open_queue(self, create: bool) -> None:
        q = {"q": self.name}
        if create:
            self._conn.execute(
                "INSERT INTO statequeue.queues (name) VALUES (%(q)s) ON CONFLICT DO NOTHING", q
            )
        found = self._conn.execute("SELECT 1 FROM statequeue.queues WHERE name = %(q)s", q)
        if found.fetchone() is None:
            raise QueueNotFound(f"no queue {self.name!r} in the PostgreSQL store")

    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        unique = list(dict.fromkeys(items))
        added = 0
        for start in range(0, len(unique), ENQUEUE_BATCH):
            batch = [os.fsencode(t) for t in unique[start : start + ENQUEUE_BATCH]]
            with self._tx() as conn:
                # The row lock serialises enqueuers of this queue: ids follow
                # input order, and two enqueuers cannot deadlock on the index.
                first, _ = writes.lock_queue(conn, self.name)
                row = conn.execute(
                    sql.ENQUEUE, {"q": self.name, "items": batch, "first": first}
                ).fetchone()
                n = int(row[0]) if row else 0
                if n:
                    conn.execute(
                        "UPDATE statequeue.queues SET next_id = next_id + %s WHERE name = %s",
                        (n, self.name),
                    )
                    writes.count(conn, self.name, {"pending": n})
                    writes.event(
                        conn, self.name, {"t": "enq", "id": first, "n": n, "at": writes.now()}
                    )
            added += n
        return EnqueueResult(added=added, skipped=len(items) - added)

    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        # Recovery looks for dead holders in pg_locks: at most every
        # RECOVER_EVERY seconds while claims succeed, and always before
        # reporting that nothing is left (an orphan may be all there is).
        recovered = False
        if time.monotonic() - self._recovered_at >= RECOVER_EVERY:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)
            recovered = True
        row = self._claim_row(runner, among)
        if row is None and not recovered:
            self.recover(on_interrupted=on_interrupted, max_crashes=max_crashes)
            row = self._claim_row(runner, among)
        if row is None:
            return None
        item_id, item, attempt, token, interrupted, failures = row
        return Claim(
            item_id=int(item_id),
            item=reads.text_of(item),
            attempt=int(attempt),
            runner_id=runner.runner_id,
            interrupted=bool(interrupted),
            failures=int(failures),
            token=int(token),
        )

    def _claim_row(
        self, runner: RunnerInfo, among: Collection[int] | None
    ) -> tuple[Any, ...] | None:
        params = {
            "q": self.name,
            "now": time.time(),
            "runner": runner.runner_id,
            "holder": self._session,
            "among": sorted(among) if among is not None else None,
        }
        with self._tx() as conn:
            return conn.execute(sql.CLAIM, params).fetchone()

    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        if outcome.ok:
            target = ItemState.DONE
        else:
            target = ItemState.PENDING if retry_at is not None else ItemState.FAILED
        with self._tx(sync=sync) as conn:
            self._held(conn, claim)
            writes.record_result(conn, self.name, claim, outcome, target)
            key = {"q": self.name, "id": claim.item_id}
            if target is ItemState.DONE:
                conn.execute("DELETE FROM statequeue.live WHERE queue = %(q)s AND id = %(id)s", key)
                conn.execute(
                    "UPDATE statequeue.items SET state = 'done', attempts = %(a)s, reason = %(r)s"
                    " WHERE queue = %(q)s AND id = %(id)s",
                    {**key, "a": claim.attempt, "r": writes.safe(outcome.reason)},
                )
            else:
                conn.execute(
                    "UPDATE statequeue.live SET state = %(s)s, retry_at = %(at)s, token = NULL,"
                    " runner = NULL, holder = NULL, failures = failures + 1, interrupted = false,"
                    " reason = %(r)s, last_err = %(e)s, changed_at = %(now)s"
                    " WHERE queue = %(q)s AND id = %(id)s",
                    {
                        **key,
                        "s": target.value,
                        "at": retry_at,
                        "r": writes.safe(outcome.reason),
                        "e": writes.safe(outcome.stderr_tail),
                        "now": time.time(),
                    },
                )
            writes.count(conn, self.name, {"running": -1, target.value: 1})
            writes.event(conn, self.name, writes.end_record(claim, outcome, target, retry_at))
        return target

    def _held(self, conn: Connection, claim: Claim) -> tuple[int, int]:
        """Lock the claim's row if its token is still current, else ClaimLost."""
        row = conn.execute(
            sql.HELD_CLAIM, {"q": self.name, "id": claim.item_id, "token": claim.token}
        ).fetchone()
        if row is None:
            raise ClaimLost(
                f"item {claim.item_id} is no longer claimed by runner {claim.runner_id} "
                f"(token {claim.token} is stale); nothing was recorded"
            )
        return int(row[0]), int(row[1])

    def release(self, claim: Claim, reason: str, *, uncounted: bool = False) -> None:
        with self._tx() as conn:
            attempts, _ = self._held(conn, claim)
            if uncounted:
                attempts -= 1  # as if it had never been claimed
            conn.execute(
                "UPDATE statequeue.live SET state = 'pending', attempts = %(a)s, token = NULL,"
                " runner = NULL, holder = NULL, failures = 0, interrupted = %(i)s,"
                " reason = %(r)s, changed_at = %(now)s WHERE queue = %(q)s AND id = %(id)s",
                {
                    "q": self.name,
                    "id": claim.item_id,
                    "a": attempts,
                    "i": claim.interrupted,
                    "r": writes.safe(reason),
                    "now": time.time(),
                },
            )
            writes.count(conn, self.name, {"running": -1, "pending": 1})
            rec: Record = {"t": "intr", "id": claim.item_id, "attempt": claim.attempt}
            writes.event(
                conn, self.name, {**rec, "state": "pending", "reason": reason, "at": writes.now()}
            )

    def sync(self) -> None:
        # A synchronous commit that writes WAL flushes every earlier
        # asynchronous commit of the cluster as well.
        with self._tx() as conn:
            conn.execute("SELECT txid_current()")

    def recover(
        self, *, on_interrupted: OnInterrupted = OnInterrupted.RETRY, max_crashes: int = 3
    ) -> RecoveryReport:
        from statequeue.views import RecoveryReport

        self._recovered_at = time.monotonic()
        report = RecoveryReport()
        with self._tx() as conn:
            for (rid,) in conn.execute(sql.LOST_RUNNERS, {"q": self.name, "now": time.time()}):
                lost = {"t": "stop", "runner": rid, "reason": "died", "at": writes.now()}
                writes.event(conn, self.name, {**lost, "by": os.getpid()})
            for item_id, attempts, crashes in conn.execute(sql.ORPHANED, {"q": self.name}):
                n = int(crashes) + 1
                target, bucket = writes.policy(on_interrupted, n, max_crashes, report)
                writes.recover_one(
                    conn, self.name, int(item_id), int(attempts), n, target, on_interrupted
                )
                bucket.append(int(item_id))
        return report

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        with self._tx() as conn:
            writes.lock_queue(conn, self.name)
            others = [
                r for r in reads.active_runners(conn, self.name) if r.runner_id != runner.runner_id
            ]
            if exclusive and others:
                r = others[0]
                raise RunnerActive(
                    f"another runner is active on queue {self.name!r} "
                    f"(pid {r.pid} on {r.host}); not starting"
                )
            conn.execute(
                "INSERT INTO statequeue.runners (queue, runner_id, pid, host, boot, since,"
                " command, session) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (queue, runner_id) DO UPDATE SET session = excluded.session,"
                " stopped_at = NULL",
                (
                    self.name,
                    runner.runner_id,
                    runner.pid,
                    runner.host,
                    runner.boot_id,
                    runner.started_at,
                    Jsonb(list(runner.command)),
                    self._session,
                ),
            )
            rec: Record = {"t": "run", "runner": runner.runner_id, "pid": runner.pid}
            rec.update(host=runner.host, boot=runner.boot_id, since=runner.started_at)
            writes.event(conn, self.name, {**rec, "cmd": list(runner.command)})

    def unregister_runner(self, runner_id: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE statequeue.runners SET stopped_at = %s WHERE queue = %s AND runner_id = %s",
                (time.time(), self.name, runner_id),
            )
            writes.event(conn, self.name, {"t": "stop", "runner": runner_id, "at": writes.now()})

    def active_runners(self) -> list[ActiveRunner]:
        with self._guard():
            return reads.active_runners(self._conn, self.name)

    def commands(self) -> list[list[str]]:
        with self._guard():
            rows = self._conn.execute(
                "SELECT command FROM statequeue.runners WHERE queue = %s ORDER BY since",
                (self.name,),
            ).fetchall()
        found: list[list[str]] = []
        for (command,) in rows:
            if command and (not found or found[-1] != command):
                found.append(list(command))
        return found

    # -- user actions ------------------------------------------------------------

    def retry(
        self, ids: Sequence[int] | None, *, states: Collection[ItemState] = RETRYABLE
    ) -> list[int]:
        allowed = tuple(s for s in RETRYABLE if s in states) if ids is None else RETRYABLE
        with self._tx() as conn:
            return writes.set_state(conn, self.name, ids, ItemState.PENDING, allowed, "retry")

    def cancel(self, ids: Sequence[int]) -> list[int]:
        allowed = (ItemState.PENDING, ItemState.FAILED, ItemState.HELD)
        with self._tx() as conn:
            return writes.set_state(conn, self.name, ids, ItemState.CANCELLED, allowed, "cancel")

    def set_paused(self, paused: bool) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE statequeue.queues SET paused = %s WHERE name = %s", (paused, self.name)
            )
            writes.event(conn, self.name, {"t": "pause", "paused": paused, "at": writes.now()})

    def compact(self) -> CompactResult:
        """Folds the count deltas into the counters. Moving finished items'
        events and results to an archive table comes in a later step."""
        from statequeue.views import CompactResult

        with self._guard():
            reads.roll_up_counts(self._conn, self.name)
        return CompactResult(bytes_before=0, bytes_after=0, archived=0, archive_bytes=0)

    def close(self) -> None:
        """Closing the connection drops the session lock: recovery may take
        back whatever this store still held."""
        self._conn.close()

    # -- reading -----------------------------------------------------------------

    def is_paused(self) -> bool:
        with self._guard():
            row = self._conn.execute(
                "SELECT paused FROM statequeue.queues WHERE name = %s", (self.name,)
            ).fetchone()
        return bool(row and row[0])

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        with self._guard():
            row = self._conn.execute(
                "SELECT min(coalesce(retry_at, 0)) FROM statequeue.live"
                " WHERE queue = %(q)s AND state = 'pending' AND ("
                " (%(among)s::bigint[] IS NULL AND retry_at IS NOT NULL)"
                " OR id = ANY(%(among)s::bigint[]))",
                {"q": self.name, "among": sorted(among) if among is not None else None},
            ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def status(self) -> Status:
        with self._guard():
            return reads.status(self._conn, self.name, self.is_paused())

    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        with self._guard():
            yield from reads.items(self._conn, self.name, state)

    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        with self._guard():
            yield from reads.results(self._conn, self.name, state)

    def history(self, item_id: int) -> ItemHistory:
        with self._guard():
            found = reads.history(self._conn, self.name, item_id)
        if found is None:
            raise ItemNotFound(f"no item {item_id} in queue {self.name!r}")
        return found

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        with self._guard():
            return reads.read_events(self._conn, self.name, cursor)

    def notices(self) -> list[str]:
        return []

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        from statequeue.store.postgres import stats

        with self._guard():
            yield from stats.iter_attempts(self._conn, self.name, since)
