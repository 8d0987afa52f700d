"""Issue 23: the claim of the item a persistent worker left is let go cheaply and at once.

Each item a worker finishes is released once no process of it is left (promise
4): the keeper's look for leftovers (its own children, orphans included) runs
once per item, so it is one pread of its /proc children file, held open while
it holds claims, and it runs right after the next request is sent (while the
worker works), not when the next reply has come (when it would delay that
reply's record). Real processes throughout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statequeue import Queue
from statequeue.run import keeper_children, keeper_state
from statequeue.run.keeper_state import KeeperProcess
from statequeue.run.options import RunOptions
from statequeue.run.runner import Runner
from tests.conftest import STATEQUEUE

RUN_TIMEOUT = 120


@pytest.fixture
def keeper() -> Iterator[KeeperProcess]:
    mine, theirs = socket.socketpair()
    try:
        yield KeeperProcess(mine, "q")
    finally:
        mine.close()
        theirs.close()


def _sleepers(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sleep", "300"]) for _ in range(count)]


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_each_look_reads_the_children_afresh_through_one_held_file(
    keeper: KeeperProcess,
) -> None:
    procs = _sleepers(2)
    try:
        first = keeper.own_children()
        held = keeper.children_fd
        assert {p.pid for p in procs} <= set(first) and held >= 0
        _end(procs[:1])  # exited and reaped: no child of ours any more
        second = keeper.own_children()
        assert procs[0].pid not in second and procs[1].pid in second
        assert keeper.children_fd == held  # the same file, read again from the top
    finally:
        _end(procs[1:])


def test_a_list_longer_than_one_read_is_read_whole(
    keeper: KeeperProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeper_children, "CHILDREN_READ", 4)  # fewer bytes than one pid and a space
    procs = _sleepers(3)
    try:
        assert {p.pid for p in procs} <= set(keeper.own_children())
    finally:
        _end(procs)


def test_the_children_file_is_closed_once_no_claim_is_held(keeper: KeeperProcess) -> None:
    r, w = os.pipe()
    os.close(w)
    keeper.held = {1: [r], 2: []}
    keeper.own_children()
    fd = keeper.children_fd
    keeper.release({1})
    assert keeper.children_fd == fd and _open(fd)  # item 2's claim is still held
    keeper.release({2})
    assert keeper.children_fd == keeper_state.UNOPENED and not _open(fd)


# On the second item, the worker waits for the runner (its parent) to sleep in
# its epoll wait for the reply, having done what it does after a request, then
# says whether the first item's claim (byte ID of claims.lock) is still held.
WORKER = r"""
import fcntl, os, struct, time
import statequeue

FLOCK = struct.Struct("@hhqqi4x")
CLAIMS = os.path.join(os.environ["STATEQUEUE_HOME"], os.environ["STATEQUEUE_QUEUE"], "claims.lock")
first = []

def held(item_id):
    fd = os.open(CLAIMS, os.O_RDONLY)
    try:
        probe = FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, item_id, 1, 0)
        return FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)

def runner_asleep():
    with open(f"/proc/{os.getppid()}/wchan") as f:
        return f.read() == "do_epoll_wait"

def work(item):
    me = int(os.environ["STATEQUEUE_ID"])
    if not first:
        first.append(me)
        return {"held_while_it_ran": held(me)}
    end = time.monotonic() + 60
    while not runner_asleep():
        if time.monotonic() > end:
            return "the runner never waited for this reply"
        time.sleep(0.001)
    return {"first_held": held(first[0])}

statequeue.serve(work)
"""


def test_the_item_a_worker_left_is_released_while_it_works_on_the_next(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
    argv = [STATEQUEUE, "run", "--persistent", "-j1", "--", sys.executable, str(worker)]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    with Queue(home=sq_home) as q:
        first, second = q.result("a"), q.result("b")
    assert first is not None and second is not None
    assert first.result == {"held_while_it_ran": True}  # the probe sees a held claim
    # Released before the runner waits for the second item's reply, not once it came.
    assert second.result == {"first_held": False}


def test_each_reply_is_recorded_with_the_next_claim_in_one_store_step(
    sq_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `run` per item: one locked section and one fsync per item on the journal
    (finish_and_claim), never a finish and then a separate claim."""
    worker = tmp_path / "noop.py"
    worker.write_text("import statequeue\n\nstatequeue.serve(lambda item: item.upper())\n")
    items = ["a", "b", "c", "d", "e"]
    with Queue("q", home=sq_home) as q:
        q.enqueue(items)
        calls = dict.fromkeys(("claim", "finish", "finish_and_claim"), 0)
        for name in calls:
            original = getattr(q.store, name)

            def spy(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
                calls[_name] += 1
                return _original(*args, **kw)

            monkeypatch.setattr(q.store, name, spy)
        options = RunOptions(command=(sys.executable, str(worker)), persistent=True)
        summary = Runner(q, options).run()
        results = {item: found.result for item in items if (found := q.result(item))}
    assert summary.attempts == len(items)
    assert results == {item: item.upper() for item in items}
    # Each reply's end record carries the next claim (the last one finds none, and
    # a claim then looks once more); a claim alone only for the first item.
    assert (calls["finish"], calls["finish_and_claim"]) == (0, len(items))
    assert calls["claim"] <= 2
