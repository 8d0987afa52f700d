"""Issue 21 point 14 (``Queue.work()`` on PostgreSQL against the psycopg
floor): what the changes for it must keep doing, each shown on a real server
(tests/pg.py). The speed itself is measured by scripts/bench_pg.py, never here.

- Opening a queue whose schema is up to date takes no migration lock: sixteen
  runners starting together no longer wait on each other for it, and an open
  is not held up by a migration another process has under way elsewhere.
"""

from __future__ import annotations

import threading

import pytest

from tests.pg import sql as _sql
from tests.waiting import until

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402
from statequeue.store.postgres.connection import connect  # noqa: E402
from statequeue.store.postgres.schema import (  # noqa: E402
    LOCK_CLASS,
    MIGRATION_LOCK,
    MIGRATIONS,
    migrate,
)


def _waiting_on_advisory_locks(url: str) -> int:
    rows = _sql(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    return int(rows[0][0])  # type: ignore[call-overload]  # count(*): an int


def test_an_up_to_date_schema_opens_while_the_migration_lock_is_held(pg_url: str) -> None:
    PostgresStore(pg_url, "q").close()  # migrated: the schema is up to date
    opened = threading.Event()
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            PostgresStore(pg_url, "q").close()
            opened.set()
        except BaseException as exc:  # shown by the assertion below
            errors.append(exc)

    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
        opener = threading.Thread(target=open_store)
        opener.start()
        # Either the open finishes or it queues on the lock: whichever comes first.
        until(
            lambda: opened.is_set() or errors or _waiting_on_advisory_locks(pg_url) > 0,
            "the open to finish or to wait on the migration lock",
        )
        blocked = not opened.is_set() and not errors
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
    opener.join(timeout=60)
    assert errors == []
    assert not blocked, "an open of an up-to-date schema waited on the migration lock"


def test_an_older_schema_is_still_migrated_under_the_lock(pg_url: str) -> None:
    conn = connect(pg_url)
    try:
        assert migrate(conn, upto=len(MIGRATIONS) - 1) == (0, len(MIGRATIONS) - 1)
    finally:
        conn.close()
    done = threading.Event()

    def open_store() -> None:
        PostgresStore(pg_url, "q").close()
        done.set()

    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
        opener = threading.Thread(target=open_store)
        opener.start()
        until(lambda: _waiting_on_advisory_locks(pg_url) > 0, "the open to wait on the lock")
        assert not done.is_set()
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
    opener.join(timeout=60)
    assert done.is_set()
    versions = _sql(pg_url, "SELECT max(version) FROM statequeue.schema_version")
    assert versions == [(len(MIGRATIONS),)]
