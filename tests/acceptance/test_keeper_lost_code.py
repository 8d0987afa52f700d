"""A run whose keeper is killed stops (test_guard.py shows how) and exits 1;
`statequeue help exit-codes` says so, where it used to give exit 1 only as
"at least one item failed", and a script looking for the failed items found
none: the run's items are all pending again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.acceptance.test_guard import shape
from tests.acceptance.test_runner import Procs, finish, pids_in, wait_for

HANG = 'echo $$ >> "$SQT_DIR/pids/$STATEQUEUE_ID"\nexec sleep 30\n'


def test_a_killed_keeper_gives_the_documented_exit_code(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    with Queue(home=env["STATEQUEUE_HOME"]) as q:
        q.enqueue(["a"])
    waiter = procs.start("run", "--", "sh", "-c", HANG)
    wait_for(lambda: pids_in(work / "pids" / "1"), "the item to start")
    keeper, _ = shape(waiter.pid)
    os.kill(keeper, signal.SIGKILL)
    code, _, err = finish(waiter)
    assert code == ExitCode.FAILED, err
    assert err.splitlines()[-1].startswith("statequeue: the run's keeper process ended"), err
    assert "keeper process died" in ExitCode.FAILED.meaning
    with Queue(home=env["STATEQUEUE_HOME"], create=False) as q:
        assert q.status().counts["pending"] == 1
