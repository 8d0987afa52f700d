"""Operations on a whole PostgreSQL database of queues: `queues` lists them,
`drop` deletes one, `db migrate` brings the schema up to date. None opens a
queue (which would create it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from statequeue.core.errors import RunnerActive, UnsafeFolder
from statequeue.core.identity import boot_id, host_name
from statequeue.core.views import Status
from statequeue.store.postgres import queries, reaping, writes
from statequeue.store.postgres.connection import Connection, connect, guarded
from statequeue.store.postgres.schema import migrate
from statequeue.store.postgres.scratch import open_scratch

DROP_BATCH = 5_000
"""Rows deleted per transaction by `drop`."""

# Children first, ``queues`` last: its row (marked ``dropping``) is what
# tells an interrupted drop to be run again, and keeps the queue closed.
QUEUE_TABLES = (
    "live",
    "logs",
    "results",
    "archived_results",
    "events",
    "archived_events",
    "items",
    "runners",
    "counts",
    "count_deltas",
    "rate_buckets",  # run --rate (rate_rows.py)
    "deferrals",
    "count_moves",
)


def migrate_schema(url: str) -> tuple[int, int]:
    """Create or upgrade the schema in the database at ``url``; returns the
    versions before and after (schema.py)."""
    conn = connect(url)
    try:
        with guarded(url):
            return migrate(conn)
    finally:
        conn.close()


def statuses(
    url: str,
    scratch_root: Path | None = None,
    *,
    on_unsafe: Callable[[UnsafeFolder], None] | None = None,
) -> list[Status]:
    """The status of every queue in the database, by name. With
    ``scratch_root`` (HOME/.postgres), a queue's running items whose claim
    lock a process on this host still holds (its runner dead) are told from
    the interrupted ones as the queue's own ``status`` tells them
    (``held_by_dead_runner``); a queue with no scratch folder there has none
    of its claims on this host. An unsafe scratch folder: UnsafeFolder, or
    ``on_unsafe`` and the queue left out."""
    conn = connect(url)
    try:
        with guarded(url):
            if migrate(conn, build=False)[1] == 0:
                return []  # no schema: no queues, and a look builds none
            rows = conn.execute(
                "SELECT name, paused FROM statequeue.queues WHERE NOT dropping ORDER BY name"
            ).fetchall()
            found = []
            for name, paused in rows:
                try:
                    with _claim_locks(scratch_root, str(name)) as locks:
                        found.append(queries.status(conn, str(name), bool(paused), locks))
                except UnsafeFolder as exc:
                    if on_unsafe is None:
                        raise
                    on_unsafe(exc)
            return found
    finally:
        conn.close()


@contextmanager
def _claim_locks(scratch_root: Path | None, name: str) -> Iterator[queries.HeldHere | None]:
    """Whether a process on this host holds a claim's lock (as the store's
    ``_held_here`` asks), from queue ``name``'s scratch folder under
    ``scratch_root``; None when it has none (nothing is made for a look)."""
    folder = None if scratch_root is None else scratch_root / name
    if folder is None or not os.path.lexists(folder / reaping.SUBFOLDER):
        yield None
        return
    opened = open_scratch(folder)
    locks = reaping.ClaimLocks(opened)
    try:
        yield lambda token, runner_id: locks.is_held(token, runner_id or None)
    finally:
        opened.close()


def drop(url: str, queue: str) -> None:
    """Delete queue ``queue`` and every row about it, DROP_BATCH rows per
    transaction. Refused (RunnerActive) while a runner is active on it; once
    begun, the queue can no longer be opened, and running `drop` again
    finishes an interrupted drop."""
    conn = connect(url)
    try:
        with guarded(url):
            if migrate(conn, build=False)[1] == 0:
                raise writes.no_queue(queue)
            _mark_dropping(conn, queue)
            for table in QUEUE_TABLES:
                _delete_rows(conn, table, queue)
            conn.execute("DELETE FROM statequeue.queues WHERE name = %s", (queue,))
    finally:
        conn.close()


def _mark_dropping(conn: Connection, queue: str) -> None:
    # A runner of this host whose pid is gone is not active: its row said so
    # until its lease ran out ("has an active runner (pid N)", a dead pid).
    reaping.stop_dead_runners_here(conn, queue, host=host_name(), boot=boot_id())
    with conn.transaction():
        # The row lock orders this against runner registration (which takes
        # it too): a runner registered first is seen here, a later one finds
        # the queue dropping.
        row = conn.execute(
            "SELECT 1 FROM statequeue.queues WHERE name = %s FOR UPDATE", (queue,)
        ).fetchone()
        if row is None:
            raise writes.no_queue(queue)
        runners = queries.active_runners(conn, queue)
        if runners:
            r = runners[0]
            raise RunnerActive(
                f"queue {queue!r} has an active runner (pid {r.pid} on {r.host}); stop it first"
            )
        conn.execute("UPDATE statequeue.queues SET dropping = true WHERE name = %s", (queue,))


def _delete_rows(conn: Connection, table: str, queue: str) -> None:
    # Table names come from QUEUE_TABLES only; the queue is a parameter.
    statement = (
        f"DELETE FROM statequeue.{table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM statequeue.{table} WHERE queue = %s LIMIT %s))"
    )
    while conn.execute(statement.encode(), (queue, DROP_BATCH)).rowcount:
        pass  # each statement is its own transaction (autocommit)
