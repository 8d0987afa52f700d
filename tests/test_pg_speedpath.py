"""The PostgreSQL store's one-statement hot path (issue 12, Performance):
claim, finish and finish-and-claim as server-side functions keep fencing,
the idempotent retried finish, retry outcomes, group commit and the counts."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from statequeue.core.errors import ClaimLost
from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, ItemState, Outcome, RunnerInfo
from tests.conftest import STATEQUEUE
from tests.pg import PgCluster
from tests.pg import sql as _sql
from tests.waiting import until

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, writes  # noqa: E402  (needs psycopg)
from tests.pg_proxy import proxy_for  # noqa: E402

OK = Outcome(ok=True, exit_code=0)
FAILED = Outcome(ok=False, exit_code=3, stderr_tail="boom")


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url, "q")
    yield s
    s.close()


def _claimed(store: PostgresStore, items: list[str]) -> tuple[RunnerInfo, Claim]:
    store.enqueue(items)
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    assert claim is not None
    return runner, claim


def _events(url: str, kind: str) -> list[dict[str, object]]:
    rows = _sql(url, "SELECT body FROM statequeue.events WHERE body->>'t' = %s ORDER BY seq", kind)
    return [dict(r[0]) for r in rows]  # type: ignore[call-overload]


def _live(url: str) -> list[tuple[object, ...]]:
    return _sql(url, "SELECT id, state, token FROM statequeue.live ORDER BY id")


def test_finish_and_claim_records_the_result_and_claims_the_next(
    store: PostgresStore, pg_url: str
) -> None:
    runner, claim = _claimed(store, ["a", "b", "c"])
    state, nxt = store.finish_and_claim(claim, OK, runner=runner)
    assert state is ItemState.DONE
    assert nxt is not None and (nxt.item_id, nxt.item, nxt.attempt) == (2, "b", 1)
    assert nxt.token is not None and nxt.token > (claim.token or 0)
    assert _live(pg_url) == [(2, "running", nxt.token), (3, "pending", None)]
    assert _sql(pg_url, "SELECT id, state, token FROM statequeue.results") == [
        (1, "done", claim.token)
    ]
    counts = store.status().counts
    assert (counts.get("done"), counts.get("running"), counts.get("pending")) == (1, 1, 1)
    assert [e["id"] for e in _events(pg_url, "start")] == [1, 2]
    assert [e["id"] for e in _events(pg_url, "end")] == [1]
    assert store.finish(nxt, OK) is ItemState.DONE  # the new claim's lease is the store's


def test_a_stale_finish_and_claim_records_nothing_and_claims_nothing(
    store: PostgresStore, pg_url: str
) -> None:
    runner, claim = _claimed(store, ["a", "b"])
    _sql(pg_url, "UPDATE statequeue.live SET token = nextval('statequeue.tokens') WHERE id = 1")
    with pytest.raises(ClaimLost):
        store.finish_and_claim(claim, OK, runner=runner)
    assert _sql(pg_url, "SELECT count(*) FROM statequeue.results") == [(0,)]
    assert _live(pg_url)[1] == (2, "pending", None)
    assert _events(pg_url, "end") == []
    assert store.status().counts.get("running") == 1  # item 1, still another's


def test_a_retry_outcome_puts_the_item_back_and_claims_another(
    store: PostgresStore, pg_url: str
) -> None:
    runner, claim = _claimed(store, ["a", "b"])
    later = time.time() + 3600
    state, nxt = store.finish_and_claim(claim, FAILED, retry_at=later, runner=runner)
    assert state is ItemState.PENDING
    assert nxt is not None and nxt.item_id == 2  # item 1 is not due yet
    row = _sql(
        pg_url,
        "SELECT state, retry_at, failures, token, last_err FROM statequeue.live WHERE id = 1",
    )
    assert row == [("pending", later, 1, None, "boom")]
    assert store.finish(nxt, FAILED) is ItemState.FAILED
    assert _sql(pg_url, "SELECT state, retry_at FROM statequeue.live WHERE id = 2") == [
        ("failed", None)
    ]
    assert store.status().counts.get("failed") == 1


def test_a_retry_due_at_once_is_claimed_again_by_the_same_call(
    store: PostgresStore, pg_url: str
) -> None:
    """The claim is a statement of its own after the finish (fused_statement.py):
    it sees the finished item pending and due, as a later call would."""
    runner, claim = _claimed(store, ["a"])
    state, nxt = store.finish_and_claim(claim, FAILED, retry_at=time.time() - 1, runner=runner)
    assert state is ItemState.PENDING
    assert nxt is not None and (nxt.item_id, nxt.attempt) == (1, 2)
    assert _live(pg_url) == [(1, "running", nxt.token)]
    counts = store.status().counts
    assert (counts.get("running"), counts.get("pending")) == (1, 0)
    assert store.finish(nxt, OK) is ItemState.DONE
    assert store.status().counts.get("done") == 1


def test_finish_and_claim_claims_nothing_from_a_paused_queue(
    store: PostgresStore, pg_url: str
) -> None:
    runner, claim = _claimed(store, ["a", "b"])
    store.set_paused(True)
    assert store.finish_and_claim(claim, OK, runner=runner) == (ItemState.DONE, None)
    assert _live(pg_url) == [(2, "pending", None)]


def test_a_retried_finish_and_claim_adopts_the_claim_its_first_try_committed(
    pg_cluster: PgCluster, pg_url: str
) -> None:
    """The acknowledgement of the fused statement is lost: the retry finds the
    result recorded and hands back the claim the first try made, rather than
    claiming a second item and leaving the first to expire as interrupted."""
    with proxy_for(pg_cluster) as proxy:
        s = PostgresStore(proxy.url(pg_url), "q")
        try:
            runner, claim = _claimed(s, ["a", "b", "c"])
            # The call's Bind message (the statement's name, then no format
            # codes): its Parse, sent once per connection before it, ends the
            # name with the query's text instead. Cut after the statement ran.
            proxy.cut_after(b"statequeue_finish_and_claim\x00\x00")
            state, nxt = s.finish_and_claim(claim, OK, runner=runner)
            assert proxy.cuts == 1
            assert state is ItemState.DONE
            assert nxt is not None and nxt.item_id == 2
            assert _live(pg_url) == [(2, "running", nxt.token), (3, "pending", None)]
            assert s.finish(nxt, OK) is ItemState.DONE
        finally:
            s.close()
    assert [e["id"] for e in _events(pg_url, "start")] == [1, 2]
    assert _sql(pg_url, "SELECT id FROM statequeue.results ORDER BY id") == [(1,), (2,)]


def _waiting_on_a_lock(url: str, pid: int) -> bool:
    rows = _sql(url, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid)
    return bool(rows) and rows[0][0] == "Lock"


@pytest.mark.parametrize("fused", [True, False], ids=["finish_and_claim", "finish"])
def test_a_retry_that_overtakes_its_still_running_first_try_finds_its_result(
    store: PostgresStore, pg_url: str, fused: bool
) -> None:
    """The connection was cut while the first try still ran on the server: the
    retry began before the first try committed. It used to wait for the first
    try's row lock, find the running row gone and call the token stale
    (ClaimLost, "nothing was recorded") though the result was recorded, and
    leave the next item the first try claimed to expire as a crash. Now it
    finds the result, and the fused retry adopts that claim (schema v11)."""
    runner, claim = _claimed(store, ["a", "b", "c"])
    params = {
        **writes.finish_params("q", claim, OK, (ItemState.DONE, None)),
        "now": time.time(),
        "runner": runner.runner_id,
        "lease": 60.0,
        "among": None,
        "sync": True,
    }
    from statequeue.store.postgres import functions

    sql = functions.FINISH_AND_CLAIM if fused else functions.FINISH
    if not fused:
        for key in ("now", "runner", "lease", "among"):
            del params[key]
    answers: dict[str, object] = {}

    def call(name: str, retried: bool, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        try:
            answers[name] = conn.execute(sql, {**params, "retried": retried}).fetchall()
        except Exception as exc:  # reported by the assertions below
            answers[name] = exc

    import threading

    with (
        psycopg.connect(pg_url) as blocker,
        psycopg.connect(pg_url, autocommit=True) as first,
        psycopg.connect(pg_url, autocommit=True) as retry,
    ):
        # The first try stops after deleting the running row, at the items
        # row this transaction holds: as if still running when cut off.
        blocker.execute("SELECT 1 FROM statequeue.items WHERE queue = 'q' AND id = 1 FOR UPDATE")
        threads = [threading.Thread(target=call, args=("first", False, first))]
        threads[0].start()
        until(lambda: _waiting_on_a_lock(pg_url, first.info.backend_pid), "the first try to wait")
        threads.append(threading.Thread(target=call, args=("retry", True, retry)))
        threads[1].start()
        until(lambda: _waiting_on_a_lock(pg_url, retry.info.backend_pid), "the retry to wait")
        blocker.commit()
        for t in threads:
            t.join(timeout=60)
    first_rows, retry_rows = answers["first"], answers["retry"]
    assert isinstance(first_rows, list) and isinstance(retry_rows, list), answers
    if fused:
        # The retry answers as the first try did: done, and the same next claim.
        assert retry_rows[0][0] == "done", retry_rows
        assert retry_rows[0][1:] == first_rows[0][1:] and first_rows[0][1] == 2, answers
        assert _live(pg_url) == [(2, "running", first_rows[0][4]), (3, "pending", None)]
    else:
        assert retry_rows == first_rows == [("done",)], answers
    assert _sql(pg_url, "SELECT id FROM statequeue.results ORDER BY id") == [(1,)]


def test_a_retried_finish_finds_a_result_already_archived(
    store: PostgresStore, pg_url: str
) -> None:
    _, claim = _claimed(store, ["a"])
    assert store.finish(claim, OK) is ItemState.DONE
    assert store.compact().archived == 1
    assert _sql(pg_url, "SELECT count(*) FROM statequeue.results") == [(0,)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        again = writes.finish_once(
            conn, "q", claim, OK, (ItemState.DONE, None), sync=True, retried=True
        )
        assert again is ItemState.DONE
        with pytest.raises(ClaimLost):  # not a retry: the token is simply stale
            writes.finish_once(
                conn, "q", claim, OK, (ItemState.DONE, None), sync=True, retried=False
            )
    assert _sql(pg_url, "SELECT count(*) FROM statequeue.archived_results") == [(1,)]


def test_group_commit_lowers_synchronous_commit_for_its_own_transaction_only(
    pg_url: str,
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        s = PostgresStore(pg_url, "q")
        try:
            _, claim = _claimed(s, ["a"])
        finally:
            s.close()
        writes.finish_once(conn, "q", claim, OK, (ItemState.DONE, None), sync=False, retried=False)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_save_log_is_fenced_by_the_token(store: PostgresStore, pg_url: str) -> None:
    _, claim = _claimed(store, ["a"])
    assert store.save_log(claim, b"out \x00\xff") is True
    assert store.save_log(claim, b"again") is True  # already stored for this token
    _sql(pg_url, "UPDATE statequeue.live SET token = nextval('statequeue.tokens') WHERE id = 1")
    stale = dataclasses.replace(claim, attempt=2)
    assert store.save_log(stale, b"stale") is False
    assert _sql(pg_url, "SELECT attempt, data FROM statequeue.logs") == [(1, b"out \x00\xff")]


def test_run_records_each_result_with_the_fused_statement(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    """`statequeue run` against PostgreSQL takes the one-statement path: the
    server counts calls of finish_and_claim (track_functions)."""
    dbname = pg_url.split("@/", 1)[1].split("?", 1)[0]
    _sql(pg_url, f"ALTER DATABASE \"{dbname}\" SET track_functions = 'pl'")
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "a", "b", "c"], env=env, check=True, timeout=60)
    code = "import sys; print(sys.argv[1])"
    run = [STATEQUEUE, "run", "--quiet", "--", sys.executable, "-c", code, "{}"]
    subprocess.run(run, env=env, check=True, timeout=120)
    done = subprocess.run(
        [STATEQUEUE, "status", "--json"], env=env, check=True, timeout=60, capture_output=True
    )
    assert json.loads(done.stdout)["counts"]["done"] == 3
    calls = _sql(
        pg_url,
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE schemaname = 'statequeue' AND funcname = 'finish_and_claim'",
    )
    assert calls[0][0] == 3  # every result, each with the next claim (none after c)
