"""Something other than a regular file at $STATEQUEUE_RESULT (issue 21, point 7).

A FIFO there used to block the runner's open forever (SIGTERM could not end
it: the open is retried on EINTR); a directory ended the run with exit 6, and
every later run the same way. Now either is an error value for that item, as a
planted link already was, and the run goes on.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE

Env = dict[str, str]
NOT_READ = "result file not read: not a regular file"
NOBODY = 65534
# The item names the kind of thing its command leaves at $STATEQUEUE_RESULT.
SCRIPT = """
case "$1" in
  fifo) rm -f "$STATEQUEUE_RESULT"; mkfifo "$STATEQUEUE_RESULT" ;;
  dir*) rm -f "$STATEQUEUE_RESULT"; mkdir -p "$STATEQUEUE_RESULT/d"; : > "$STATEQUEUE_RESULT/d/f" ;;
  wait) echo waiting; exec sleep 600 ;;
  *) echo '{"ok": 1}' > "$STATEQUEUE_RESULT" ;;
esac
"""
RUN = ("run", "--", "sh", "-c", SCRIPT, "sh", "{}")


def results(home: Path) -> dict[str, tuple[ItemState, object]]:
    with Queue(home=home) as q:
        return {r.item: (r.state, r.result) for r in q.results()}


def enqueue(env: Env, *items: str) -> None:
    subprocess.run([STATEQUEUE, "enqueue", *items], env=env, check=True, capture_output=True)


def test_a_fifo_or_a_directory_is_an_error_value_and_the_run_goes_on(
    sq_env: Env, sq_home: Path
) -> None:
    enqueue(sq_env, "fifo", "dir", "plain")
    # A generous limit only so the old behaviour (blocked forever) fails, not hangs.
    done = subprocess.run(
        [STATEQUEUE, *RUN], env=sq_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr  # not 6 ("a write or fsync failed")
    assert "Traceback" not in done.stderr
    assert results(sq_home) == {
        "fifo": (ItemState.DONE, {"error": NOT_READ}),
        "dir": (ItemState.DONE, {"error": NOT_READ}),
        "plain": (ItemState.DONE, {"ok": 1}),
    }
    logs = sq_home / "default" / "logs"
    assert not list(logs.glob("*.result")), "what the children left is removed"
    # Later runs are fine too, with a directory left over from each attempt.
    enqueue(sq_env, "dir2", "dir3")
    again = subprocess.run(
        [STATEQUEUE, *RUN], env=sq_env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert results(sq_home)["dir3"] == (ItemState.DONE, {"error": NOT_READ})


def test_sigterm_ends_a_run_after_a_fifo_result(sq_env: Env, sq_home: Path) -> None:
    enqueue(sq_env, "fifo", "wait")
    runner = subprocess.Popen(
        [STATEQUEUE, *RUN[:1], "--live", *RUN[1:]],
        env=sq_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert runner.stdout is not None
        # The second item says it started: the runner got past the FIFO.
        with selectors.DefaultSelector() as sel:
            sel.register(runner.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 120  # fails the old code, which never gets here
            seen = b""
            while b"waiting" not in seen:
                assert sel.select(deadline - time.monotonic()), "runner stuck on the FIFO"
                chunk = runner.stdout.read1(4096)
                assert chunk, "runner ended before the second item"
                seen += chunk
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=120) == 143  # ExitCode.INTERRUPTED_TERM
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    found = results(sq_home)
    assert found["fifo"] == (ItemState.DONE, {"error": NOT_READ})


def test_a_directory_at_a_verify_hooks_result_does_not_end_the_run(
    sq_env: Env, sq_home: Path
) -> None:
    enqueue(sq_env, "a")
    hook = 'mkdir -p "$STATEQUEUE_RESULT/d"; exit 1'  # not done, and a directory left
    done = subprocess.run(
        [STATEQUEUE, "run", "--verify-first", "--verify", hook, "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr  # not 6 ("1.verify: Is a directory")
    assert results(sq_home) == {"a": (ItemState.DONE, None)}
    assert not (sq_home / "default" / "logs" / "1.verify").exists()


def test_another_users_result_file_is_not_read(sq_env: Env, sq_home: Path) -> None:
    """A regular file at $STATEQUEUE_RESULT that another user owns (planted
    there) is not the item's result: an error value, as for a FIFO, and the
    file is removed. Found by outside testing: only its type was checked."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    enqueue(sq_env, "foreign", "plain")
    plant = f'echo \'{{"planted": 1}}\' > "$STATEQUEUE_RESULT"; chown {NOBODY} "$STATEQUEUE_RESULT"'
    script = (
        f'if [ "$1" = foreign ]; then {plant}; else echo \'{{"ok": 1}}\' > "$STATEQUEUE_RESULT"; fi'
    )
    done = subprocess.run(
        [STATEQUEUE, "run", "--", "sh", "-c", script, "sh", "{}"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert results(sq_home) == {
        "foreign": (ItemState.DONE, {"error": "result file not read: not owned by this user"}),
        "plain": (ItemState.DONE, {"ok": 1}),
    }
    assert not list((sq_home / "default" / "logs").glob("*.result")), "the planted file is removed"
