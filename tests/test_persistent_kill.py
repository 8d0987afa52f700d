"""Issue 23, promise 4 with persistent workers: kill -9 of the runner, of its keeper, of both.

A real `statequeue run --persistent -j2` is SIGKILLed (or its keeper is)
while both workers are inside an item. Then (a) no worker outlives it, (b) a
second run completes, running again only the two items that were in flight,
and (c) no item ever runs twice at once: each item holds an flock on a file
of its own while it runs, and a copy that finds it taken writes ``overlap``
(tests/persistent_worker.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker
from tests.waiting import gone, until

ITEMS = ["slow-a", "slow-b", "ok-1", "ok-2", "ok-3"]
RUN_TIMEOUT = 120


def _pid_of(marks: Path, item: str) -> int:
    path = marks / f"{item}.pid"
    found = until(lambda: path.exists() and path.read_text().split(), f"{item} to start")
    return int(found[0])  # type: ignore[index]


def _keeper_of(runner: int) -> int:
    """The runner's keeper: its child running keeper_process.py."""
    kids = Path(f"/proc/{runner}/task/{runner}/children").read_text().split()
    for kid in kids:
        with open(f"/proc/{kid}/cmdline", "rb") as f:
            if b"keeper_process" in f.read():
                return int(kid)
    raise AssertionError(f"no keeper among {kids}")


@pytest.mark.parametrize("victim", ["runner", "keeper", "both"])
def test_after_kill9_no_worker_lives_on_and_only_the_items_in_flight_run_again(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path, victim: str, store_url: str
) -> None:
    program, marks = write_worker(tmp_path)
    if store_url:
        sq_env = dict(sq_env, STATEQUEUE_STORE=store_url)
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(ITEMS)
    argv = [STATEQUEUE, "run", "--persistent", "-j2", "--", sys.executable, program, str(marks)]
    with subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        workers = [_pid_of(marks, "slow-a"), _pid_of(marks, "slow-b")]
        if victim == "both":
            # As a kill -9 of the job's process group: the runner is stopped
            # first, so it cannot stop the workers when its keeper dies; only
            # the workers' parent-death signal is left to (keeper_os.spawn_bound).
            keeper = _keeper_of(run.pid)
            os.kill(run.pid, signal.SIGSTOP)
            os.kill(keeper, signal.SIGKILL)
            os.kill(run.pid, signal.SIGKILL)
        else:
            os.kill(run.pid if victim == "runner" else _keeper_of(run.pid), signal.SIGKILL)
        for pid in workers:
            until(lambda pid=pid: gone(pid), f"worker {pid} to be stopped")  # type: ignore[misc]
        run.communicate(timeout=RUN_TIMEOUT)
    with Queue(home=sq_home, store=store_url or None) as q:
        first = {v.item: (v.state, v.attempts) for v in q.items()}
    assert first["slow-a"][1] == first["slow-b"][1] == 1
    assert all(first[i] == (ItemState.PENDING, 0) for i in ITEMS[2:]), first
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    with Queue(home=sq_home, store=store_url or None) as q:
        states = {v.item: (v.state, v.attempts) for v in q.items()}
    assert states == {
        "slow-a": (ItemState.DONE, 2),
        "slow-b": (ItemState.DONE, 2),
        "ok-1": (ItemState.DONE, 1),
        "ok-2": (ItemState.DONE, 1),
        "ok-3": (ItemState.DONE, 1),
    }
    assert not (marks / "overlap").exists()


def test_ctrl_c_hands_back_the_items_in_flight_and_stops_every_worker(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    program, marks = write_worker(tmp_path)
    with Queue(home=sq_home) as q:
        q.enqueue(ITEMS)
    argv = [STATEQUEUE, "run", "--persistent", "-j2", "--", sys.executable, program, str(marks)]
    with subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        workers = [_pid_of(marks, "slow-a"), _pid_of(marks, "slow-b")]
        os.kill(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=RUN_TIMEOUT)
    assert run.returncode == 130, err
    assert all(gone(pid) for pid in workers)
    with Queue(home=sq_home) as q:
        states = {v.item: v.state for v in q.items()}
    assert states == dict.fromkeys(ITEMS, ItemState.PENDING)
