"""Issue 21 point 14 (``Queue.work()`` on PostgreSQL against the psycopg
floor): what the changes for it must keep doing, each shown on a real server
(tests/pg.py). The speed itself is measured by scripts/bench_pg.py, never here.

- Opening a queue whose schema is up to date takes no migration lock: sixteen
  runners starting together no longer wait on each other for it, and an open
  is not held up by a migration another process has under way elsewhere.
- Schema version 10: the results' BRIN index (results_at) has no summary of
  its first page range while that range is not full, so a finish there does
  not widen one (a WAL record each, on one index page every runner locks).
  A version 9 database migrates with its data and held claims.
- Results and events go to the server encoded by orjson, as the journal
  writes them: a result the library accepts (a datetime, a UUID) is stored
  as on the journal store (the stdlib encoder raised TypeError), and a NaN
  is still refused by the server.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import StateQueueError
from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, ItemState, Outcome
from tests.pg import sql as _sql
from tests.waiting import until

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, functions, writes  # noqa: E402
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
        # The open polls the lock (a try-lock loop, bounded: test_pg_advisory_locks):
        # given time enough to have migrated, it has not, while the lock is held.
        time.sleep(1.0)
        assert not done.is_set()
        old = _sql(pg_url, "SELECT max(version) FROM statequeue.schema_version")
        assert old == [(len(MIGRATIONS) - 1,)]
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, MIGRATION_LOCK))
    opener.join(timeout=60)
    assert done.is_set()
    versions = _sql(pg_url, "SELECT max(version) FROM statequeue.schema_version")
    assert versions == [(len(MIGRATIONS),)]


OK = Outcome(ok=True, exit_code=0, result={"n": 1})
V9 = 9
"""The version before the results' first range lost its summary (10)."""
SUMMARIZE_FIRST_RANGE = "SELECT brin_summarize_range('statequeue.results_at', 0)"
"""1 when the first range had no summary (it has one now), 0 when it had one."""


def _first_range_summarized(url: str) -> bool:
    return _sql(url, SUMMARIZE_FIRST_RANGE) == [(0,)]


def test_a_new_database_s_first_results_widen_no_summary(pg_url: str) -> None:
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a", "b", "c"])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claim = store.claim(runner)
        while claim is not None:
            _, claim = store.finish_and_claim(claim, OK, runner=runner)
        assert _counts(store) == {"done": 3}
        assert store.status().rate  # the recent results, found through results_at
    finally:
        store.close()
    assert not _first_range_summarized(pg_url)


def _v9_claim(conn: psycopg.Connection[tuple[object, ...]], runner: str) -> Claim:
    row = conn.execute(
        functions.CLAIM,
        {"q": "q", "now": time.time(), "runner": runner, "lease": 600.0, "among": None},
    ).fetchone()
    assert row is not None and row[0] is not None
    item_id, item, attempt, token, _, _ = row
    return Claim(int(item_id), bytes(item).decode(), int(attempt), runner, token=int(token))


def _version_9_queue(url: str, *, filler: int = 0) -> Claim:
    """Queue q at schema version 9, written by its own functions: a done item
    (its result summarized in results_at's first range), a running one (its
    claim returned) and a pending one; ``filler`` results of another queue
    before them."""
    conn = connect(url)
    try:
        assert migrate(conn, upto=V9) == (0, V9)
        conn.execute(
            "INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, at)"
            " SELECT -n, 'filler', n, 1, 'done', true, n FROM generate_series(1, %s) n",
            (filler,),
        )
        conn.execute("INSERT INTO statequeue.queues (name, next_id) VALUES ('q', 4)")
        for item_id, item in enumerate("abc", start=1):
            conn.execute(
                "INSERT INTO statequeue.items (queue, id, item) VALUES ('q', %s, %s)",
                (item_id, item.encode()),
            )
            conn.execute(
                "INSERT INTO statequeue.live (queue, id, state) VALUES ('q', %s, 'pending')",
                (item_id,),
            )
        conn.execute("INSERT INTO statequeue.count_deltas VALUES ('q', 'pending', 3)")
        done = _v9_claim(conn, "r9")
        params = writes.finish_params("q", done, OK, (ItemState.DONE, None))
        row = conn.execute(functions.FINISH, {**params, "sync": True, "retried": False})
        assert row.fetchone() == ("done",)
        return _v9_claim(conn, "r9")
    finally:
        conn.close()


def _counts(store: PostgresStore) -> dict[str, int]:
    return {k: v for k, v in store.status().counts.items() if v}


def test_a_version_9_database_migrates_with_its_data_and_claims(pg_url: str) -> None:
    held = _version_9_queue(pg_url)
    assert held.item == "b"
    assert _first_range_summarized(pg_url)  # version 9's build left it one
    store = PostgresStore(pg_url, "q")  # migrates to the newest on open
    try:
        versions = _sql(pg_url, "SELECT max(version) FROM statequeue.schema_version")
        assert versions == [(len(MIGRATIONS),)]
        assert _counts(store) == {"done": 1, "running": 1, "pending": 1}
        first = store.result(1)
        assert first is not None and first.result == {"n": 1}
        assert [e["t"] for e in store.history(1).events] == ["enq", "start", "end"]
        # The claim taken at version 9 finishes at version 10 with its token, once.
        runner = new_runner(("true",))
        store.register_runner(runner)
        state, after = store.finish_and_claim(held, OK, runner=runner)
        assert state is ItemState.DONE and after is not None and after.item == "c"
        assert after.token is not None and held.token is not None and after.token > held.token
        store.finish(after, OK)
        assert _counts(store) == {"done": 3}
        assert store.status().rate
    finally:
        store.close()
    assert not _first_range_summarized(pg_url)


def test_a_full_first_range_keeps_its_summary(pg_url: str) -> None:
    # 15,000 results fill more than the first 128 pages.
    _version_9_queue(pg_url, filler=15_000)
    pages = _sql(pg_url, "SELECT pg_relation_size('statequeue.results') / 8192")
    assert pages[0][0] > 128  # type: ignore[operator]  # a number
    PostgresStore(pg_url, "q").close()  # migrates to 10
    assert _first_range_summarized(pg_url)


ODD = {"when": datetime.datetime(2026, 1, 2, 3, 4, 5), "id": uuid.UUID(int=5), "s": "ü\n"}


def test_a_result_is_stored_as_the_journal_stores_it(pg_url: str, tmp_path: Path) -> None:
    results = []
    for store in (pg_url, None):
        with Queue("q", store=store, home=tmp_path / "home") as q:
            q.enqueue(["a"])
            for item in q.work():
                item.done(ODD)
            found = q.result("a")
            assert found is not None and found.state is ItemState.DONE
            results.append(found.result)
    assert (
        results[0]
        == results[1]
        == {
            "when": "2026-01-02T03:04:05",
            "id": "00000000-0000-0000-0000-000000000005",
            "s": "ü\n",
        }
    )


def test_a_nan_result_is_still_refused_by_the_server(pg_url: str) -> None:
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a"])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claim = store.claim(runner)
        assert claim is not None
        with pytest.raises(StateQueueError):
            store.finish(claim, Outcome(ok=True, result={"x": float("nan")}))
        assert _counts(store) == {"running": 1}
    finally:
        store.close()
