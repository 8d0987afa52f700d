"""Issue 23, one attempt on a persistent worker (unit level, real pipes, the
runner's real selector, a stand-in keeper): what the worker wrote before its
reply is that attempt's log even when the reply is read first, and what comes
after is the next's; its pipes stay in the epoll set for its life."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statequeue.core.models import Claim
from statequeue.run.jobs import JobSpec
from statequeue.run.output_watch import OutputWatch
from statequeue.run.persistent import WorkerAttempt, WorkerPool, WorkerSettings
from statequeue.store.memory import MemoryStore

F_SETPIPE_SZ = (
    1031  # fcntl.F_SETPIPE_SZ, Linux (named in fcntl from Python 3.10 on some builds only)
)


class StandInKeeper:
    """What a WorkerAttempt asks of the keeper; the worker's pipe ends are kept for the test."""

    in_process = False  # as a keeper process: the claim is assigned before the request

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


def _new_watch() -> tuple[OutputWatch, int]:
    """An OutputWatch and its epoll fd (found as the one it added to this process)."""
    known = _epoll_fds()
    watch = OutputWatch(MemoryStore())
    (epoll_fd,) = _epoll_fds() - known
    return watch, epoll_fd


def _epoll_fds() -> set[int]:
    return {
        fd for fd in map(int, os.listdir("/proc/self/fd"))
        if _link(fd) == "anon_inode:[eventpoll]"
    }  # fmt: skip


def _epoll_set(epoll_fd: int) -> set[int]:
    """The fds in that epoll set, as the kernel has them."""
    info = Path(f"/proc/self/fdinfo/{epoll_fd}").read_text()
    return {int(line.split()[1]) for line in info.splitlines() if line.startswith("tfd:")}


def _link(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _until_replied(watch: OutputWatch, attempt: WorkerAttempt) -> None:
    for _ in range(100):
        if watch.wait(5.0) and attempt.exited():
            return
    raise AssertionError("no reply came")


def _pipe(attempt: WorkerAttempt, stream: int) -> int:
    return next(fd for fd, s in attempt.pipes.items() if s == stream)


def test_output_written_before_the_reply_is_the_attempts_log_even_if_read_after(
    tmp_path: Path,
) -> None:
    """The output comes in the reply's batch of the selector (or an earlier
    one) and is read whole (more than one read holds) before the attempt
    ends, with no read of the pipes after the reply."""
    spec = JobSpec(template=("worker",), queue="q", log_dir=tmp_path)
    pool = WorkerPool(spec, WorkerSettings(), 1)
    keeper: Any = StandInKeeper()
    watch = OutputWatch(MemoryStore())
    first = pool.attempt(Claim(1, "a", 1, "r"), keeper, 1)
    watch.started(first)
    out, _, stdin, reply = keeper.ends
    assert os.read(stdin, 1000) == b'{"id":1,"item":"a","attempt":1}\n'
    fcntl.fcntl(out, F_SETPIPE_SZ, 1 << 20)  # room for more than one read takes
    os.write(out, b"x" * 70000 + b"\nend of a\n")
    os.write(reply, b'{"id": 1, "ok": true, "result": 7}\n')
    _until_replied(watch, first)
    os.write(out, b"said after the reply\n")  # the next item's
    watch.forget_output(first)
    outcome = first.finish()
    assert (outcome.ok, outcome.result) == (True, 7)
    assert (tmp_path / "1.1.log").read_bytes() == b"x" * 70000 + b"\nend of a\n"
    second = pool.attempt(Claim(2, "b", 1, "r"), keeper, 1)
    assert second.worker is first.worker
    watch.started(second)
    os.write(reply, b'{"id": 2, "ok": false}\n')
    _until_replied(watch, second)
    watch.forget_output(second)
    outcome = second.finish()
    assert (outcome.ok, outcome.reason) == (False, "the worker replied ok: false")
    assert (tmp_path / "2.1.log").read_bytes() == b"said after the reply\n"
    watch.close()


def test_a_workers_pipes_stay_in_the_epoll_set_between_its_items(tmp_path: Path) -> None:
    """Watched once for the worker's life, not added and removed per attempt
    (six epoll_ctl calls an item); a worker that leaves takes them out (its
    pipes close), and the next worker's, on the same fd numbers, are watched."""
    spec = JobSpec(template=("worker",), queue="q", log_dir=tmp_path)
    pool = WorkerPool(spec, WorkerSettings(), 1)
    keeper: Any = StandInKeeper()
    watch, epoll_fd = _new_watch()
    before = _epoll_set(epoll_fd)
    for item_id in (1, 2, 3):
        attempt = pool.attempt(Claim(item_id, "a", 1, "r"), keeper, 1)
        watch.started(attempt)
        pipes = set(attempt.pipes)
        assert _epoll_set(epoll_fd) == before | pipes
        os.write(keeper.ends[3], b'{"id": %d, "ok": true}\n' % item_id)
        _until_replied(watch, attempt)
        watch.forget_output(attempt)
        assert attempt.finish().ok
        assert _epoll_set(epoll_fd) == before | pipes, "the pipes left the set at the attempt's end"
    old = attempt.worker
    old_ends = keeper.ends
    os.write(old_ends[3], b"not json\n")  # unsolicited: the worker is replaced
    fresh = pool.attempt(Claim(4, "a", 1, "r"), keeper, 1)
    assert fresh.worker is not old and fresh.warnings and not fresh.bad
    for end in old_ends:
        os.close(end)
    watch.started(fresh)
    assert _epoll_set(epoll_fd) == before | set(fresh.pipes)
    os.write(keeper.ends[3], b'{"id": 4, "ok": true}\n')
    _until_replied(watch, fresh)
    watch.close()


def test_output_between_items_waits_in_the_pipe_for_the_next_attempt(tmp_path: Path) -> None:
    """Nobody reads a worker between its items: a pipe it writes to then leaves
    the epoll set (else the runner's wait would wake at once, again and again)
    and the text goes to its next attempt's log."""
    spec = JobSpec(template=("worker",), queue="q", log_dir=tmp_path)
    pool = WorkerPool(spec, WorkerSettings(), 1)
    keeper: Any = StandInKeeper()
    watch, epoll_fd = _new_watch()
    first = pool.attempt(Claim(1, "a", 1, "r"), keeper, 1)
    watch.started(first)
    out_fd = _pipe(first, 1)
    os.write(keeper.ends[3], b'{"id": 1, "ok": true}\n')
    _until_replied(watch, first)
    watch.forget_output(first)
    first.finish()
    os.write(keeper.ends[0], b"idle talk\n")
    assert not watch.wait(5.0)  # only output came
    assert out_fd not in _epoll_set(epoll_fd)
    second = pool.attempt(Claim(2, "b", 1, "r"), keeper, 1)
    watch.started(second)
    assert out_fd in _epoll_set(epoll_fd)
    os.write(keeper.ends[3], b'{"id": 2, "ok": true}\n')
    _until_replied(watch, second)
    watch.forget_output(second)
    second.finish()
    assert (tmp_path / "2.1.log").read_bytes() == b"idle talk\n"
    watch.close()


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
