"""Issue 23, one attempt on a persistent worker (unit level, real pipes, a
stand-in keeper): what the worker wrote before its reply is that attempt's
log even when the reply is read first, and what comes after is the next's."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statequeue.core.models import Claim
from statequeue.run.jobs import JobSpec
from statequeue.run.persistent import WorkerPool, WorkerSettings

F_SETPIPE_SZ = (
    1031  # fcntl.F_SETPIPE_SZ, Linux (named in fcntl from Python 3.10 on some builds only)
)


class StandInKeeper:
    """What a WorkerAttempt asks of the keeper; the worker's pipe ends are kept for the test."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self.failed: dict[int, int] = {}
        self.ends: list[int] = []

    def spawn_worker(self, *, argv: list[str], env: dict[str, str], streams: Sequence[int]) -> int:
        self.ends = [os.dup(fd) for fd in streams]  # stdout, stderr, stdin, reply
        return 1

    def assign(self, token: int, item_id: int, claim_fds: Sequence[int]) -> None:
        pass

    def signal(self, token: int, signum: int) -> None:
        pass


def test_output_written_before_the_reply_is_the_attempts_log_even_if_read_after(
    tmp_path: Path,
) -> None:
    spec = JobSpec(template=("worker",), queue="q", log_dir=tmp_path)
    pool = WorkerPool(spec, WorkerSettings(), 1)
    keeper: Any = StandInKeeper()
    first = pool.attempt(Claim(1, "a", 1, "r"), keeper, 1)
    out, _, stdin, reply = keeper.ends
    assert os.read(stdin, 1000) == b'{"id":1,"item":"a","attempt":1}\n'
    fcntl.fcntl(out, F_SETPIPE_SZ, 1 << 20)  # room for more than one read takes
    os.write(out, b"x" * 70000 + b"\nend of a\n")
    os.write(reply, b'{"id": 1, "ok": true, "result": 7}\n')
    first.read(next(fd for fd, stream in first.pipes.items() if stream == 3))
    assert first.exited()
    os.write(out, b"said after the reply\n")  # the next item's
    outcome = first.finish()
    assert (outcome.ok, outcome.result) == (True, 7)
    assert (tmp_path / "1.1.log").read_bytes() == b"x" * 70000 + b"\nend of a\n"
    second = pool.attempt(Claim(2, "b", 1, "r"), keeper, 1)
    assert second.worker is first.worker
    second.read(next(fd for fd, stream in second.pipes.items() if stream == 1))
    os.write(reply, b'{"id": 2, "ok": false}\n')
    second.read(next(fd for fd, stream in second.pipes.items() if stream == 3))
    outcome = second.finish()
    assert (outcome.ok, outcome.reason) == (False, "the worker replied ok: false")
    assert (tmp_path / "2.1.log").read_bytes() == b"said after the reply\n"


def test_the_first_workers_of_the_slots_recycle_at_staggered_counts(tmp_path: Path) -> None:
    """--recycle-after 12 with -j4: the slots' first workers go after 12, 9, 6
    and 3 items, every later one after 12, so the slots never restart together."""
    spec = JobSpec(template=("worker",), queue="q", log_dir=tmp_path)
    pool = WorkerPool(spec, WorkerSettings(recycle_after=12), 4)
    keeper: Any = StandInKeeper()
    firsts = [pool.worker_for(slot, keeper) for slot in (1, 2, 3, 4)]
    assert [w.limit for w in firsts] == [12, 9, 6, 3]
    firsts[3].done = 3
    again = pool.worker_for(4, keeper)  # due: a new worker takes the slot
    assert again is not firsts[3] and again.limit == 12
    assert pool.worker_for(1, keeper) is firsts[0]  # not due yet
