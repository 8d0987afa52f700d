"""`run --follow` on PostgreSQL wakes on LISTEN/NOTIFY (issue 12, promise 10),
with polling as the fallback; notifies are throttled per process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.errors import UsageError
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.run.wakeup import follow_poll
from tests.conftest import STATEQUEUE

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, notify  # noqa: E402  (needs psycopg)

DEADLINE = 30.0  # far below the follower's poll (an hour): only a notify can wake it


def wait_for(check: object, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def listening(pg_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'LISTEN "{notify.channel("q")}"')
        yield conn


def received(conn: psycopg.Connection[tuple[object, ...]], expected: int = 1) -> int:
    """How many notifies arrived: waits (up to DEADLINE) for ``expected``,
    then a moment for any extra one."""
    found = list(conn.notifies(timeout=DEADLINE, stop_after=expected)) if expected else []
    return len(found) + len(list(conn.notifies(timeout=0.2)))


def test_follower_wakes_on_notify_long_before_its_poll(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**sq_env, "STATEQUEUE_STORE": pg_url, "STATEQUEUE_FOLLOW_POLL": "3600"}
    first, second = tmp_path / "first", tmp_path / "second"
    subprocess.run([STATEQUEUE, "enqueue", "-q", "q", str(first)], env=env, check=True)
    runner = subprocess.Popen(
        [STATEQUEUE, "run", "-q", "q", "--follow", "--", "touch", "{}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(first.exists, "the first item")
        # The follower listens before it looks for items, so once it did the
        # first item, any later enqueue reaches it.
        subprocess.run([STATEQUEUE, "enqueue", "-q", "q", str(second)], env=env, check=True)
        wait_for(second.exists, "the follower to wake on the notify")
    finally:
        os.kill(runner.pid, signal.SIGTERM)
        _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err.decode()


def test_retry_and_resume_notify_too(
    pg_url: str, listening: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "THROTTLE", 0.0)  # every write that gives work notifies
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a"])
        assert received(listening) == 1  # type: ignore[arg-type]
        claim = store.claim(new_runner())
        assert claim is not None
        store.finish(claim, Outcome(ok=False, reason="no"))
        assert store.retry([claim.item_id]) == [claim.item_id]
        assert received(listening) == 1  # type: ignore[arg-type]
        store.set_paused(True)
        assert received(listening, 0) == 0  # type: ignore[arg-type]  # pausing gives no work
        store.set_paused(False)
        assert received(listening) == 1  # type: ignore[arg-type]
    finally:
        store.close()


def test_notifies_are_throttled_per_process(
    pg_url: str, listening: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "THROTTLE", 3600.0)
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a", "b", "c"])  # one statement: one notify
        store.enqueue(["d"])
        store.enqueue(["e"])
        assert received(listening) == 1  # type: ignore[arg-type]
    finally:
        store.close()  # sends the notify the throttle held back
    assert received(listening) == 1  # type: ignore[arg-type]
    # Another process (here another store) has its own throttle.
    other = PostgresStore(pg_url, "q")
    try:
        other.retry(None)  # nothing to retry: no notify
        other.enqueue(["f"])
    finally:
        other.close()
    assert received(listening) == 1  # type: ignore[arg-type]


def test_channel_is_a_valid_identifier_for_any_queue_name(pg_url: str) -> None:
    name = "x" * 128
    assert len(notify.channel(name)) <= 63
    store = PostgresStore(pg_url, name)
    try:
        listener = notify.Listener(pg_url, name)
        assert listener.fileno() is not None
        store.enqueue(["a"])
        wait_for(lambda: _drained(listener), "the notify")
        listener.close()
    finally:
        store.close()


def _drained(listener: notify.Listener) -> bool:
    conn = listener._conn
    assert conn is not None
    return bool(list(conn.notifies(timeout=0.5)))


def test_follow_poll_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATEQUEUE_FOLLOW_POLL", raising=False)
    assert follow_poll() == 0.25
    monkeypatch.setenv("STATEQUEUE_FOLLOW_POLL", "60")
    assert follow_poll() == 60.0
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv("STATEQUEUE_FOLLOW_POLL", bad)
        with pytest.raises(UsageError):
            follow_poll()
