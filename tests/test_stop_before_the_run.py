"""A stop (SIGTERM, SIGHUP) that comes while `run` is still starting,
before its runner has set its handlers (outside tester: a TERM 0.1-0.7 s after
the start): the run exits as a stop does, 128 + the signal, and says it was
stopped before it began. Before, the process died by the signal and said "the
run's runner was killed by SIGTERM; its keeper stopped what it had started,
and the next run recovers the items it held": a crash, where the user had
stopped a run that had taken nothing.

The runner is held in that window by the queue's lock, taken here: it waits
for it while opening the queue, before it sets its handlers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE
from tests.waiting import until

DEADLINE = 60.0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in os.listdir(f"/proc/{parent}/task"):
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
                found += [int(c) for c in children]
                todo += [int(c) for c in children]
    return found


# SIGINT is Python's KeyboardInterrupt in that window ("statequeue: interrupted",
# exit 130), as it always was: not this test's.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_before_the_run_began_is_a_stop_not_a_crash(
    sq_env: dict[str, str], sq_home: Path, sig: signal.Signals
) -> None:
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=True, timeout=DEADLINE)
    lock = os.open(sq_home / "default" / "lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = subprocess.Popen(
            [STATEQUEUE, "run", "--no-live", "--", "true"],
            env=sq_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # The waiter, its keeper and the runner (waiting for the lock).
            until(lambda: len(_descendants(run.pid)) >= 2, "the run's keeper and runner")
            run.send_signal(sig)
            _, err = run.communicate(timeout=DEADLINE)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    finally:
        os.close(lock)
    assert run.returncode == 128 + sig, err
    expected = f"statequeue: stopped by {sig.name} before the run began; no item was taken"
    assert err.strip().splitlines() == [expected], err
    # Nothing was taken: the next run does the item, with no recovery.
    done = subprocess.run(
        [STATEQUEUE, "run", "--no-live", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0 and "recovered" not in done.stderr, done.stderr
