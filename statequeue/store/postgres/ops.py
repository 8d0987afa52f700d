"""Operations on a whole PostgreSQL database of queues: `queues` lists them,
`drop` deletes one, `db migrate` brings the schema up to date. None opens a
queue (which would create it)."""

from __future__ import annotations

from statequeue.core.errors import QueueNotFound, UsageError
from statequeue.core.identity import boot_id, host_name
from statequeue.core.views import Status
from statequeue.store.postgres import queries, reaping
from statequeue.store.postgres.connection import Connection, connect, guarded
from statequeue.store.postgres.schema import migrate

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


def statuses(url: str) -> list[Status]:
    """The status of every queue in the database, by name."""
    conn = connect(url)
    try:
        with guarded(url):
            migrate(conn)
            rows = conn.execute(
                "SELECT name, paused FROM statequeue.queues WHERE NOT dropping ORDER BY name"
            ).fetchall()
            return [queries.status(conn, str(name), bool(paused)) for name, paused in rows]
    finally:
        conn.close()


def drop(url: str, queue: str) -> None:
    """Delete queue ``queue`` and every row about it, DROP_BATCH rows per
    transaction. Refused (UsageError) while a runner is active on it; once
    begun, the queue can no longer be opened, and running `drop` again
    finishes an interrupted drop."""
    conn = connect(url)
    try:
        with guarded(url):
            migrate(conn)
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
            raise QueueNotFound(f"no queue {queue!r} in the PostgreSQL store")
        runners = queries.active_runners(conn, queue)
        if runners:
            r = runners[0]
            raise UsageError(
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
