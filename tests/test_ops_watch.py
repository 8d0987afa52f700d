"""Issue 26, point 6: `status --watch` shows what is running (by text, with
attempt, runner and running time), the run's elapsed time and, on a terminal,
a progress bar; stopped by SIGTERM (as under `timeout`) it gives the terminal
its cursor back."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from tests.conftest import STATEQUEUE
from tests.waiting import DEADLINE, gone, until

SHOW_CURSOR = b"\x1b[?25h"
HIDE_CURSOR = b"\x1b[?25l"


@pytest.fixture
def busy(tmp_path: Path, sq_env: dict[str, str]) -> Iterator[None]:
    """A runner working on item #1, report-17.pdf, until the test ends."""
    subprocess.run(
        [STATEQUEUE, "enqueue"], env=sq_env, input=b"report-17.pdf\nnext.pdf\n", check=True
    )
    job = f'touch "{tmp_path}/started"; exec sleep 60'
    runner = subprocess.Popen(
        [STATEQUEUE, "run", "--", "sh", "-c", job, "sh", "{}"],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    until(lambda: (tmp_path / "started").exists(), "the item to start")
    yield
    os.kill(runner.pid, signal.SIGTERM)
    runner.wait(timeout=60)
    assert gone(runner.pid)


def test_watch_lists_running_items_with_attempt_runner_and_time(
    busy: None, sq_env: dict[str, str]
) -> None:
    watch = subprocess.Popen(
        [STATEQUEUE, "status", "--watch", "--interval", "0.2"],
        env=sq_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        seen = ""
        while "running (longest first):" not in seen:
            line = watch.stdout.readline()
            assert line, seen
            seen += line
        row = watch.stdout.readline()
        assert row.startswith("  #1 report-17.pdf  attempt 1  on "), row
        assert "pid " in row and " for " in row, row
        assert "elapsed: " in seen, seen
    finally:
        watch.kill()  # by its pid
        watch.wait()


def _read_until(fd: int, wanted: bytes, got: bytes = b"") -> bytes:
    """What ``fd`` gave until ``wanted`` came (or it closed); fails after DEADLINE."""
    end = time.monotonic() + DEADLINE
    while wanted not in got:
        # poll, not select: in a long test session fd numbers pass FD_SETSIZE.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ready = poller.poll(max(end - time.monotonic(), 0) * 1000)
        assert ready, f"no {wanted!r} in {got[-400:]!r}"
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            chunk = b""
        if not chunk:
            break
        got += chunk
    return got


def test_watch_on_a_terminal_has_a_bar_and_restores_the_cursor_on_sigterm(
    busy: None, sq_env: dict[str, str]
) -> None:
    env = {k: v for k, v in sq_env.items() if k != "NO_COLOR"}
    env.update(COLUMNS="120", TERM="xterm")
    master, slave = pty.openpty()
    watch = subprocess.Popen(
        [STATEQUEUE, "status", "--watch", "--interval", "0.2"],
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    try:
        got = _read_until(master, b"finished")  # the progress bar: 0 of 2 finished
        assert HIDE_CURSOR in got
        assert b"] 0 of 2 finished" in got
        os.kill(watch.pid, signal.SIGTERM)
        got = _read_until(master, SHOW_CURSOR, got)
        assert got.rfind(SHOW_CURSOR) > got.rfind(HIDE_CURSOR), got[-400:]
        assert watch.wait(timeout=60) == 143
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        os.close(master)


def test_watch_lists_running_items_on_postgresql(pg_url: str, sq_env: dict[str, str]) -> None:
    pytest.importorskip("psycopg")
    # lazy: needs psycopg, which the other tests of this file do without
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(pg_url, "default")
    try:
        runner = new_runner(command=("./crawl", "{}"))
        store.register_runner(runner)
        store.enqueue(["https://example.org/a", "https://example.org/b"])
        assert store.claim(runner) is not None
        env = dict(sq_env, STATEQUEUE_STORE=pg_url)
        watch = subprocess.Popen(
            [STATEQUEUE, "status", "--watch", "--interval", "0.2"], env=env, stdout=subprocess.PIPE
        )
        try:
            assert watch.stdout is not None
            seen = _read_until(watch.stdout.fileno(), b"running (longest first):\n")
            seen = _read_until(watch.stdout.fileno(), b"\n\n", seen).decode()
            row = seen.split("running (longest first):\n", 1)[1].splitlines()[0]
            assert row.startswith("  #1 https://example.org/a  attempt 1  on "), row
            assert " for " in row and " for ?" not in row, row
        finally:
            watch.kill()  # by its pid
            watch.wait()
    finally:
        store.close()
