"""A runner killed by a signal is said, not only coded.

`kill -9` of the runner's own pid (or the OOM killer) made the pid the
shell knows exit 137 with no word; the shell shows a code at most. The
waiter now says, in one line, that the runner was killed, by which signal,
and what becomes of the run (its keeper stopped the children; the next run
recovers the items). It still dies by the same signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.waiting import until


def test_a_killed_runner_is_said(sq_env: dict[str, str], sq_home: Path, tmp_path: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    err_path = tmp_path / "err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [STATEQUEUE, "run", "--", "sh", "-c", "sleep 30"],
            env=sq_env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        with Queue(home=sq_home, create=False) as q:
            until(
                lambda: q.status().counts["running"] == 1 and bool(q.status().runners),
                "the item to start",
            )
            (runner,) = q.status().runners
        assert runner.pid != proc.pid  # the runner is below the pid the shell knows
        os.kill(runner.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    err = err_path.read_text()
    assert "the run's runner was killed by SIGKILL" in err, err
    assert "the next run recovers the items it held" in err
