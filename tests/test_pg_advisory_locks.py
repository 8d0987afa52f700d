"""Advisory locks any role can take: another session holding statequeue's
migration lock makes the first open wait at most STATEQUEUE_LOCK_TIMEOUT and
exit 8 naming the holder (it hung forever, silently); one holding a queue's
reap lock makes a runner say, once, who holds it, and go on (it never
recovered a crashed item, saying nothing).

Real server and real roles (tests/pg.py).
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from statequeue.core.identity import new_runner
from statequeue.store.postgres.schema import LOCK_CLASS, MIGRATION_LOCK
from tests.conftest import STATEQUEUE
from tests.pg import sql
from tests.test_pg_security import _db, _one_line, _role

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, reaping  # noqa: E402  (needs psycopg)


@contextmanager
def _holding(url: str, key1: int, key2: str) -> Iterator[int]:
    """A session of its own holding the advisory lock (key1, key2); yields its pid."""
    with psycopg.connect(url, autocommit=True, application_name="bobs-psql") as conn:
        conn.execute(f"SELECT pg_advisory_lock({key1}, {key2})")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        yield int(row[0])


def test_a_held_migration_lock_exits_8_naming_the_holder(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    alice, alice_url = _role(pg_url, "alice")
    bob, bob_url = _role(pg_url, "bob")
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{alice}"')
    env = {**sq_env, "STATEQUEUE_LOCK_TIMEOUT": "1"}
    with _holding(bob_url, LOCK_CLASS, str(MIGRATION_LOCK)) as pid:
        started = time.monotonic()
        done = subprocess.run(
            [STATEQUEUE, "enqueue", "a", "--store", alice_url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
    assert done.returncode == 8, done.stderr
    line = _one_line(done.stderr)
    assert "migration lock" in line and f"pid {pid} (role {bob}" in line, line
    assert "bobs-psql" in line, line
    assert took < 30
    # Let go: the same command works, and nothing was half made before.
    again = subprocess.run(
        [STATEQUEUE, "enqueue", "a", "--store", alice_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr


def test_a_reap_lock_held_for_long_is_said_once_and_recovery_goes_on_after(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reaping, "REAP_LOCK_SAID_AFTER", 0.5)
    bob, bob_url = _role(pg_url, "bob")
    s = PostgresStore(pg_url, "private")
    try:
        s.enqueue(["a"])
        dead = PostgresStore(pg_url, "private", lease=30.0)
        assert dead.claim(new_runner()) is not None
        dead.close()
        sql(pg_url, "UPDATE statequeue.live SET lease_until = clock_timestamp() - interval '1s'")
        sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
        with _holding(bob_url, reaping.REAP_LOCK, "hashtext('private')") as pid:
            said: list[str] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                assert s.recover().retried == []  # blocked, never an error
                said += s.notices()
                time.sleep(0.1)
        assert len(said) == 1, said  # once, however long it is held
        assert "held for" in said[0] and f"by pid {pid} (role {bob}" in said[0], said
        assert "'private'" in said[0] and "reap lock" in said[0], said
        sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
        assert s.recover().retried == [1]  # let go: recovered
        assert s.notices() == []
    finally:
        s.close()


def test_a_follow_run_says_who_holds_the_reap_lock_and_recovers_once_let_go(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    bob, bob_url = _role(pg_url, "bob")
    s = PostgresStore(pg_url, "private")
    try:
        s.enqueue(["a"])
        dead = PostgresStore(pg_url, "private", lease=30.0)
        assert dead.claim(new_runner()) is not None
        dead.close()
    finally:
        s.close()
    sql(pg_url, "UPDATE statequeue.live SET lease_until = clock_timestamp() - interval '1s'")
    sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
    cmd = [STATEQUEUE, "run", "-q", "private", "--follow", "--store", pg_url, "--", "true", "{}"]
    with _holding(bob_url, reaping.REAP_LOCK, "hashtext('private')") as pid:
        run = subprocess.Popen(cmd, env=sq_env, stderr=subprocess.PIPE, text=True)
        try:
            assert run.stderr is not None
            seen = ""
            deadline = time.monotonic() + 40
            os.set_blocking(run.stderr.fileno(), False)
            ready = select.poll()  # not select(): a worker's fds may pass FD_SETSIZE
            ready.register(run.stderr.fileno(), select.POLLIN)
            while "reap lock" not in seen and time.monotonic() < deadline:
                if ready.poll(500):
                    seen += run.stderr.read() or ""
            assert "held for" in seen and f"by pid {pid} (role {bob}" in seen, seen
            assert run.poll() is None  # it goes on
        except BaseException:
            run.kill()
            run.wait()
            raise
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if sql(pg_url, "SELECT state FROM statequeue.items WHERE id = 1") == [("done",)]:
                break
            time.sleep(0.2)
        assert sql(pg_url, "SELECT state FROM statequeue.items WHERE id = 1") == [("done",)]
    finally:
        run.terminate()
        run.wait(30)
