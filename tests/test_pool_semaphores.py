"""A kill -9 of a program in ``statequeue.map(..., processes=True)`` leaves
no warning from multiprocessing's resource tracker on its stderr.

It used to say "resource_tracker: There appear to be 5 leaked semaphore
objects to clean up at shutdown": the pool's queues use named semaphores,
registered with the tracker, which unlinked them after the kill and said so.
The pool now unlinks their names once every worker has them open
(api/pool_semaphores.py), so nothing is left to clean up or to say."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import statequeue
from statequeue.api import pool_guard, pool_semaphores
from tests.waiting import until

SCRIPT = """
import os, sys, time
import statequeue

def work(item):
    with open(sys.argv[1], "a") as log:
        log.write(f"start {item}\\n")
    time.sleep(60)

if __name__ == "__main__":
    statequeue.map(work, ["a", "b", "c"], queue="sem", jobs=2, processes=True)
"""

pytestmark = pytest.mark.skipif(not pool_guard.SUPPORTED, reason="Linux pool guard only")


def test_kill_of_the_program_leaves_no_leaked_semaphore_warning(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    log = tmp_path / "log"
    program = tmp_path / "program.py"  # a file: the pool's workers import its fn
    program.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(program), str(log)],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        until(lambda: log.exists() and len(log.read_text().split("\n")) > 2, "two items to start")
        os.kill(proc.pid, signal.SIGKILL)
        # EOF once every process of the program is gone: workers, forkserver, tracker.
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "leaked semaphore" not in err and "resource_tracker" not in err, err


def test_the_names_are_gone_while_the_pool_runs(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[set[str]] = []
    real = pool_semaphores.unlink_once_open

    def watched(executor: ProcessPoolExecutor) -> bool:
        names = pool_semaphores._names(executor)
        done = real(executor)
        seen.append({n for n in names if os.path.exists(f"/dev/shm/sem.{n.lstrip('/')}")})
        assert len(names) == 5 and done
        return done

    monkeypatch.setattr(pool_guard, "unlink_once_open", watched)
    got = statequeue.map(str.upper, ["a", "b", "c"], queue="names", jobs=2, processes=True)
    assert got == ["A", "B", "C"]
    assert seen == [set()]  # unlinked, and the map still ran on them
