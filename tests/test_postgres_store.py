"""The PostgreSQL store beyond the shared contract: bytes, dedupe, fencing,
schema versions, and how the CLI reaches it (real server, see tests/pg.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import ClaimLost, InvalidStoreUrl, SchemaTooNew, StoreUnreachable
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from tests.conftest import STATEQUEUE
from tests.pg import PgCluster
from tests.pg import sql as _sql
from tests.test_store_contract import age_leases

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)
from statequeue.store.postgres.schema import MIGRATIONS  # noqa: E402

OK = Outcome(ok=True)
PASSWORD = "s3cretPW"
UNREACHABLE = 11
SCHEMA_TOO_NEW = 12
USAGE = 2


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url, "q")
    yield s
    s.close()


def test_non_utf8_item_round_trips_as_bytea(store: PostgresStore, pg_url: str) -> None:
    text = b"bad\xff".decode("utf-8", "surrogateescape")
    assert store.enqueue([text, "ok"]).added == 2
    assert _sql(pg_url, "SELECT item FROM statequeue.items ORDER BY id")[0] == (b"bad\xff",)
    claim = store.claim(new_runner())
    assert claim is not None and claim.item == text
    assert [v.item for v in store.items()] == [text, "ok"]
    assert store.enqueue([text]).added == 0


def test_dedupe_holds_across_calls_and_connections(store: PostgresStore, pg_url: str) -> None:
    assert store.enqueue(["a", "b"]).added == 2
    other = PostgresStore(pg_url, "q")
    try:
        result = other.enqueue(["b", "c", "a", "d"])
    finally:
        other.close()
    assert (result.added, result.skipped) == (2, 2)
    assert [(v.item_id, v.item) for v in store.items()] == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    # Another queue in the same database has its own items.
    third = PostgresStore(pg_url, "other")
    try:
        assert third.enqueue(["a"]).added == 1
    finally:
        third.close()


def test_items_that_would_break_naive_sql_are_plain_data(store: PostgresStore) -> None:
    nasty = ["'; DROP TABLE statequeue.items; --", "%(q)s", "\\x00", 'a"b']
    assert store.enqueue(nasty).added == 4
    assert [v.item for v in store.items()] == nasty


def test_stale_token_finish_changes_nothing(pg_url: str) -> None:
    first = PostgresStore(pg_url, "q")
    first.enqueue(["a"])
    stale = first.claim(new_runner())
    assert stale is not None and stale.token is not None
    first.close()  # its runner is gone: the item may be taken over once its lease ran out
    age_leases(pg_url)
    second = PostgresStore(pg_url, "q")
    try:
        fresh = second.claim(new_runner())
        assert fresh is not None and fresh.item_id == stale.item_id
        assert fresh.token != stale.token and fresh.attempt == 2
        with pytest.raises(ClaimLost):
            second.finish(stale, OK)
        with pytest.raises(ClaimLost):
            second.release(stale, "stopped")
        assert _sql(pg_url, "SELECT count(*) FROM statequeue.results") == [(0,)]
        assert second.status().counts["running"] == 1
        assert second.finish(fresh, OK) is ItemState.DONE
    finally:
        second.close()
    # The database itself allows at most one result per token.
    with pytest.raises(psycopg.errors.UniqueViolation):
        _sql(
            pg_url,
            "INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, at)"
            " VALUES (%s, 'q', 1, 2, 'done', true, 0)",
            fresh.token,
        )


def test_newer_schema_is_refused(pg_url: str, sq_env: dict[str, str]) -> None:
    PostgresStore(pg_url, "q").close()
    _sql(pg_url, "INSERT INTO statequeue.schema_version (version) VALUES (99)")
    with pytest.raises(SchemaTooNew, match="version 99"):
        PostgresStore(pg_url, "q")
    done = _cli(sq_env, "--store", pg_url, "status")
    assert done.returncode == SCHEMA_TOO_NEW
    assert done.stderr.count("\n") == 1 and "upgrade statequeue" in done.stderr


def test_empty_database_is_migrated_by_db_migrate(pg_url: str, sq_env: dict[str, str]) -> None:
    done = _cli(sq_env, "db", "migrate", "--store", pg_url, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version_before"] == 0
    again = _cli(sq_env, "db", "migrate", "--store", pg_url)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_password_is_masked_in_errors(pg_cluster: object, sq_env: dict[str, str]) -> None:
    socket_dir = pg_cluster.socket_dir  # type: ignore[attr-defined]
    url = f"postgresql://postgres:{PASSWORD}@/no_such_db?host={socket_dir}"
    with pytest.raises(StoreUnreachable) as caught:
        PostgresStore(url, "q")
    assert PASSWORD not in caught.value.message and "***" in caught.value.message
    done = _cli(sq_env, "--store", url, "status")
    assert done.returncode == UNREACHABLE
    assert PASSWORD not in done.stderr + done.stdout
    assert done.stderr.startswith("statequeue: ") and done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://postgres:{PASSWORD}@/db?host=/nonexistent/sq",  # nothing listens
        f"host=/nonexistent/sq dbname=db password={PASSWORD}",
    ],
)
def test_unreachable_server_is_one_line_and_exit_11(url: str, sq_env: dict[str, str]) -> None:
    done = _cli(sq_env, "enqueue", "--store", url, "x")
    assert done.returncode == UNREACHABLE, done.stderr
    assert done.stderr.startswith("statequeue: cannot reach the PostgreSQL store")
    assert done.stderr.count("\n") == 1 and PASSWORD not in done.stderr


@pytest.mark.parametrize(
    "url", ["nonsense", f"dbname=x no_such_option=1 password={PASSWORD}", "postgresql://[::1"]
)
def test_malformed_url_is_a_usage_error(url: str, sq_env: dict[str, str]) -> None:
    with pytest.raises(InvalidStoreUrl):
        Queue("q", store=url)
    for args in (["--store", url, "status"], ["list", "--store", url]):
        done = _cli(sq_env, *args)
        assert done.returncode == USAGE, done.stderr
        assert done.stderr.startswith("statequeue: invalid store URL")
        assert done.stderr.count("\n") == 1 and PASSWORD not in done.stderr


def test_run_end_to_end_through_the_environment(pg_url: str, sq_env: dict[str, str]) -> None:
    env = {**sq_env, "STATEQUEUE_STORE": pg_url}
    assert _cli(env, "enqueue", "a", "b", "c").returncode == 0
    done = _cli(env, "run", "--", "true")
    assert done.returncode == 0, done.stderr
    status = json.loads(_cli(env, "status", "--json").stdout)
    assert status["counts"]["done"] == 3 and status["total"] == 3
    results = _cli(env, "results", "--json").stdout.splitlines()
    assert [json.loads(r)["item"] for r in results] == ["a", "b", "c"]
    # Nothing went to the local journal; this host's scratch folders are private.
    home = Path(env["STATEQUEUE_HOME"])
    assert not (home / "default").exists()
    for folder in (home, home / ".postgres", home / ".postgres" / "default"):
        assert folder.stat().st_mode & 0o077 == 0, folder


def test_queue_api_takes_a_store_url(pg_url: str) -> None:
    with Queue("crawl", store=pg_url) as q:
        q.enqueue(["x", "y"])
        for item in q.work():
            item.done({"len": len(item.item)})
        assert [r.result for r in q.results()] == [{"len": 1}, {"len": 1}]
    with Queue("crawl", store=pg_url, create=False) as q:
        assert q.status().counts["done"] == 2


def test_host_override_is_recorded(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEQUEUE_HOST", "node-7")
    runner = new_runner()
    store.register_runner(runner)
    assert [(r.host, r.pid) for r in store.active_runners()] == [("node-7", runner.pid)]


def test_cold_enqueue_does_not_import_psycopg(sq_env: dict[str, str]) -> None:
    code = (
        "import sys; from statequeue.cli.main import main; from statequeue.api.queue import Queue\n"
        "with Queue('q') as q: q.enqueue(['x'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=sq_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120)


def test_killed_runner_item_is_recovered_by_the_next_run(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**sq_env, "STATEQUEUE_STORE": pg_url}
    assert _cli(env, "enqueue", "slow").returncode == 0
    pid_file = tmp_path / "child.pid"
    job = f"echo $$ > {pid_file}; exec sleep 60"
    runner = subprocess.Popen(
        # A short lease: the dead runner's claim expires in 2 s, not the default 30 s.
        [STATEQUEUE, "run", "--lease", "2s", "--", "sh", "-c", job],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    child = 0
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        child = int(pid_file.read_text())
        os.kill(runner.pid, signal.SIGKILL)  # the whole host dies: runner, then child
        runner.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # the run's keeper may have stopped it
            os.kill(child, signal.SIGKILL)
        with Queue(store=pg_url) as q:
            _wait_for(lambda: q.status().interrupted == (1,))
    finally:
        for pid in (runner.pid, child):
            with contextlib.suppress(ProcessLookupError):
                if pid:
                    os.kill(pid, signal.SIGKILL)
        runner.wait(timeout=30)
    done = _cli(env, "run", "--", "true")
    assert done.returncode == 0, done.stderr
    with Queue(store=pg_url) as q:
        [result] = q.results()
        assert (result.state, result.attempt) == (ItemState.DONE, 2)
        assert q.history(1).events[-1]["t"] == "end"


def _wait_for(condition: Callable[[], bool], deadline: float = 60.0) -> None:
    """Poll ``condition`` until it holds (a generous deadline, not a timing assertion)."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.05)


def test_concurrent_opens_of_an_empty_database_migrate_once(pg_url: str) -> None:
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            PostgresStore(pg_url, "q").close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    versions = _sql(pg_url, "SELECT version FROM statequeue.schema_version ORDER BY version")
    assert versions == [(n,) for n in range(1, len(MIGRATIONS) + 1)]


def test_concurrent_enqueues_neither_deadlock_nor_interleave(pg_url: str) -> None:
    items = [f"item-{i}" for i in range(3000)]
    inputs = [items, list(reversed(items))]
    barrier = threading.Barrier(2)
    added: list[int] = []
    errors: list[BaseException] = []

    def enqueue(batch: list[str]) -> None:
        s = PostgresStore(pg_url, "q")
        try:
            barrier.wait()
            added.append(s.enqueue(batch).added)
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=enqueue, args=(b,)) for b in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and sorted(added) == [0, 3000]
    rows = _sql(pg_url, "SELECT id, item FROM statequeue.items ORDER BY id")
    assert [r[0] for r in rows] == list(range(1, 3001))
    # One enqueuer took all of them, in its own input order.
    order = [bytes(r[1]).decode() for r in rows]  # type: ignore[arg-type]
    assert order in inputs


def test_acknowledged_results_survive_an_immediate_server_stop(
    pg_cluster: PgCluster, pg_url: str
) -> None:
    # A database whose default trades durability away: the store must not inherit it.
    dbname = pg_url.split("@/")[1].split("?")[0]
    _sql(pg_url, f'ALTER DATABASE "{dbname}" SET synchronous_commit = off')
    # Everything the session's earlier tests wrote (each CREATE DATABASE logs a
    # whole template) is flushed now, so the restart replays only this test's
    # WAL: the results below are still in WAL alone when the server dies.
    _sql(pg_url, "CHECKPOINT")
    store = PostgresStore(pg_url, "q")
    store.enqueue(["a", "b", "c"])
    runner = new_runner()
    while (claim := store.claim(runner)) is not None:
        store.finish(claim, OK)
    store.close()
    pg_cluster.stop("immediate")  # no checkpoint, no flush: as a power cut for the server
    pg_cluster.start()
    store = PostgresStore(pg_url, "q")
    try:
        assert [r.item for r in store.results()] == ["a", "b", "c"]
        assert store.status().counts["done"] == 3
    finally:
        store.close()
