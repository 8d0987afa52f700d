"""The runner in a process that holds more than 1,024 files (a library user's
server, or a long test session): select() refuses an fd past 1023, so each
wait on the keeper, the wake-up pipe or a worker's pidfd uses poll
(run/keeper.py ``readable``). A run of plain items and a persistent run, with
every fd below 1,100 taken first."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.run.options import RunOptions
from statequeue.run.runner import Runner

HIGH = 1100


@pytest.fixture
def low_fds_taken() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * HIGH:
        pytest.skip(f"the hard fd limit ({hard}) is too low")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * HIGH), hard))
    null = os.open(os.devnull, os.O_RDONLY)
    held = [os.dup(null) for _ in range(HIGH)]  # the lowest free fds: all below HIGH
    try:
        yield
    finally:
        for fd in [null, *held]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.usefixtures("low_fds_taken")
def test_a_run_with_every_low_fd_taken(sq_home: Path, tmp_path: Path) -> None:
    worker = tmp_path / "upper.py"
    worker.write_text("import statequeue\n\nstatequeue.serve(lambda item: item.upper())\n")
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        assert Runner(q, RunOptions(command=("true",), limit=2)).run().attempts == 2
        persistent = RunOptions(command=(sys.executable, str(worker)), persistent=True)
        assert Runner(q, persistent).run().attempts == 1
        assert q.status().counts["done"] == 3
