"""Schema version 7 (postgres/lean_writes.py): fewer writes per item, the same
queue. A database made at version 6, with items in every state and a claim
still held, migrates on open and on `db migrate` with its data intact; the
fused finish-and-claim counts one move per item (one delta row); and
the reapers of 16 runners started together do not queue on the queue's row.
Real server (tests/pg.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.errors import ClaimLost
from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome
from statequeue.core.views import RecoveryReport
from tests.conftest import STATEQUEUE
from tests.pg import sql as _sql
from tests.waiting import until

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, functions, reaping, writes  # noqa: E402
from statequeue.store.postgres import sql as statements  # noqa: E402
from statequeue.store.postgres.connection import Connection, connect  # noqa: E402
from statequeue.store.postgres.lean_writes import V7_LEAN_WRITES  # noqa: E402
from statequeue.store.postgres.schema import MIGRATIONS, migrate  # noqa: E402

OK = Outcome(ok=True, exit_code=0, result={"n": 1})
BAD = Outcome(ok=False, exit_code=3, stderr_tail="boom")
V6 = MIGRATIONS.index(V7_LEAN_WRITES)
"""The version before the lean writes (6, unless migrations are renumbered)."""


@pytest.fixture
def conn(pg_url: str) -> Iterator[Connection]:
    c = connect(pg_url)
    yield c
    c.close()


def _v6_claim(conn: Connection, runner: str) -> Claim:
    row = conn.execute(
        functions.CLAIM,
        {"q": "q", "now": time.time(), "runner": runner, "lease": 600.0, "among": None},
    ).fetchone()
    assert row is not None and row[0] is not None
    item_id, item, attempt, token, _, _ = row
    return Claim(int(item_id), bytes(item).decode(), int(attempt), runner, token=int(token))


def _v6_finish(conn: Connection, claim: Claim, outcome: Outcome, target: ItemState) -> None:
    params = writes.finish_params("q", claim, outcome, (target, None))
    row = conn.execute(functions.FINISH, {**params, "sync": True, "retried": False}).fetchone()
    assert row == (target.value,)


def _version_6_queue(conn: Connection) -> Claim:
    """Queue q at schema version 6, written by version 6's own functions: a
    done, a failed, a running (its claim returned) and a pending item."""
    assert migrate(conn, upto=V6) == (0, V6)
    conn.execute("INSERT INTO statequeue.queues (name, next_id) VALUES ('q', 5)")
    for item_id, item in enumerate("abcd", start=1):
        conn.execute(
            "INSERT INTO statequeue.items (queue, id, item) VALUES ('q', %s, %s)",
            (item_id, item.encode()),
        )
        conn.execute(
            "INSERT INTO statequeue.live (queue, id, state) VALUES ('q', %s, 'pending')",
            (item_id,),
        )
    conn.execute("INSERT INTO statequeue.count_deltas VALUES ('q', 'pending', 4)")
    _v6_finish(conn, _v6_claim(conn, "r6"), OK, ItemState.DONE)
    _v6_finish(conn, _v6_claim(conn, "r6"), BAD, ItemState.FAILED)
    return _v6_claim(conn, "r6")


def _counts(store: PostgresStore) -> dict[str, int]:
    return {k: v for k, v in store.status().counts.items() if v}


def test_a_version_6_queue_migrates_on_open_with_its_data_and_claims(
    conn: Connection, pg_url: str
) -> None:
    held = _version_6_queue(conn)
    assert held.item == "c"
    store = PostgresStore(pg_url, "q")  # migrates to 7 on open
    try:
        assert _sql(pg_url, "SELECT max(version) FROM statequeue.schema_version") == [
            (len(MIGRATIONS),)
        ]
        assert _counts(store) == {"done": 1, "failed": 1, "running": 1, "pending": 1}
        assert [(v.item, v.state) for v in store.items()] == [
            ("a", ItemState.DONE),
            ("b", ItemState.FAILED),
            ("c", ItemState.RUNNING),
            ("d", ItemState.PENDING),
        ]
        first = store.result(1)
        assert first is not None and first.result == {"n": 1}
        assert [e["t"] for e in store.history(1).events] == ["enq", "start", "end"]
        # The claim taken at version 6 finishes at version 7 with its token,
        # once; the next claim gets a newer token.
        assert store.finish(held, OK) is ItemState.DONE
        with pytest.raises(ClaimLost):
            store.finish(held, OK)
        runner = new_runner(("true",))
        store.register_runner(runner)
        nxt = store.claim(runner)
        assert nxt is not None and nxt.item == "d"
        assert held.token is not None and nxt.token is not None and nxt.token > held.token
        state, after = store.finish_and_claim(nxt, OK, runner=runner)
        assert (state, after) == (ItemState.DONE, None)
        assert _counts(store) == {"done": 3, "failed": 1}
        done = store.result(3)
        assert done is not None and done.state is ItemState.DONE
    finally:
        store.close()


def test_db_migrate_brings_a_version_6_database_up_to_date(
    conn: Connection, pg_url: str, tmp_path: Path
) -> None:
    _version_6_queue(conn)
    env = {**os.environ, "STATEQUEUE_HOME": str(tmp_path)}
    done = subprocess.run(
        [STATEQUEUE, "db", "migrate", "--store", pg_url, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    migrated = json.loads(done.stdout)
    assert (migrated["version_before"], migrated["version"]) == (V6, len(MIGRATIONS))
    counted = subprocess.run(
        [STATEQUEUE, "status", "-q", "q", "--store", pg_url, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert counted.returncode == 0, counted.stderr
    counts = json.loads(counted.stdout)["counts"]
    assert {k: v for k, v in counts.items() if v} == {
        "done": 1,
        "failed": 1,
        "running": 1,
        "pending": 1,
    }


def test_fused_finish_and_claim_counts_one_move_per_item(conn: Connection, pg_url: str) -> None:
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue([f"item-{i}" for i in range(6)])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claim = store.claim(runner)
        assert claim is not None
        conn.execute(statements.ROLL_UP_COUNTS, {"q": "q"})
        # The function itself, called as the store calls it (claims.py), so
        # that no recovery pass folds the deltas in between.
        for outcome, target in [(OK, ItemState.DONE), (BAD, ItemState.FAILED)] + [
            (OK, ItemState.DONE)
        ] * 4:
            params = writes.finish_params("q", claim, outcome, (target, None))
            row = conn.execute(
                functions.FINISH_AND_CLAIM,
                {
                    **params,
                    "retried": False,
                    "now": time.time(),
                    "runner": runner.runner_id,
                    "lease": 60.0,
                    "among": None,
                },
            ).fetchone()
            assert row is not None and row[0] == target.value
            if row[1] is not None:
                claim = Claim(int(row[1]), "", int(row[3]), runner.runner_id, token=int(row[4]))
        # Per finish-and-claim, one row: the finished item's running -1 and
        # the next one's running +1 cancel, so the move is pending -> its
        # state; the last one took nothing: running -> done.
        assert _sql(pg_url, "SELECT count(*) FROM statequeue.count_deltas") == [(0,)]
        rows = _sql(pg_url, "SELECT state, delta, moved_from FROM statequeue.count_moves")
        assert sorted(rows) == sorted(
            [("done", 1, "pending")] * 4 + [("failed", 1, "pending"), ("done", 1, "running")]
        )
        assert _counts(store) == {"done": 5, "failed": 1}
    finally:
        store.close()


def test_a_reaper_skips_while_another_ones_turn_is_open(pg_url: str) -> None:
    PostgresStore(pg_url, "q").close()
    holder, other = connect(pg_url), connect(pg_url)
    try:
        with holder.transaction():
            turn = holder.execute(
                statements.REAP_TURN, {"q": "q", "every": 0.0, "lock": reaping.REAP_LOCK}
            ).fetchone()
            assert turn is not None
            # Queued on the queue's row, this reaper would wait for the
            # turn's commit: lock_timeout turns that wait into an error.
            other.execute("SET lock_timeout = '5s'")
            report = RecoveryReport()
            rule = (OnInterrupted.RETRY, 3, None)
            with other.transaction():
                skipped = other.execute(
                    statements.REAP_TURN, {"q": "q", "every": 0.0, "lock": reaping.REAP_LOCK}
                ).fetchone()
            assert skipped is None
            reaping.reap_expired(other, "q", rule, report, reaping.ClaimLocks(None))
            assert report == RecoveryReport()
    finally:
        holder.close()
        other.close()


def test_a_finish_updates_the_items_row_in_place(pg_url: str) -> None:
    """HOT: no index names a column the finish changes, and new pages keep room."""
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue([f"https://example.com/page/{i}" for i in range(40)])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claim = store.claim(runner)
        while claim is not None:
            _, claim = store.finish_and_claim(claim, OK, runner=runner)
        assert _counts(store) == {"done": 40}
        assert store.status().rate  # the recent results, found through results_at (BRIN)
    finally:
        store.close()  # its connections end: their statistics are flushed

    def updates() -> tuple[int, int] | None:
        row = _sql(
            pg_url,
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relid = 'statequeue.items'::regclass",
        )
        upd, hot = (int(str(v)) for v in row[0])
        return (upd, hot) if upd >= 40 else None

    found = until(updates, "the items table's update statistics")
    assert isinstance(found, tuple)
    upd, hot = found
    assert hot * 10 >= upd * 9, f"{hot} of {upd} updates of items were HOT"


# Version 6's roll-up, as a runner of that version still at work after the
# upgrade runs it (its reaper folds the deltas every second).
_V6_ROLL_UP = """
WITH gone AS (
    DELETE FROM statequeue.count_deltas WHERE queue = %(q)s RETURNING state, delta
), summed AS (
    SELECT state, sum(delta) AS n FROM gone GROUP BY state
)
INSERT INTO statequeue.counts (queue, state, n) SELECT %(q)s, state, n FROM summed
ON CONFLICT (queue, state) DO UPDATE SET n = statequeue.counts.n + excluded.n
"""


def test_a_version_6_runners_roll_up_leaves_the_counts_right(conn: Connection, pg_url: str) -> None:
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a", "b", "c"])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claim = store.claim(runner)
        assert claim is not None
        _, nxt = store.finish_and_claim(claim, OK, runner=runner)
        assert nxt is not None
        conn.execute(_V6_ROLL_UP, {"q": "q"})
        assert _counts(store) == {"done": 1, "running": 1, "pending": 1}
        conn.execute(statements.ROLL_UP_COUNTS, {"q": "q"})
        assert _counts(store) == {"done": 1, "running": 1, "pending": 1}
    finally:
        store.close()
