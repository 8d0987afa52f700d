"""One persistent worker process (``run --persistent``) and the runner's ends of its pipes.

The keeper starts it (WORKER: stdin, stdout, stderr and the reply pipe at
REPLY_FD) and reports its pid; ``send`` gives it an item (its claim fds to
the keeper, then the request line, protocol.py). The attempts and the slots
are persistent.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable

from statequeue.core.errors import KeeperLost
from statequeue.core.models import Claim
from statequeue.run import keeper_process as kp
from statequeue.run.jobs import Job, JobSpec
from statequeue.run.keeper import Keeper, readable
from statequeue.run.pipes import READ_SIZE
from statequeue.run.protocol import ReplyReader, request_line
from statequeue.run.replacements import SLOT, JobItem, replace, template_tokens

__all__ = ["Worker", "wait_for", "worker_argv"]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
ANSWERED_KEPT = 64  # items of its last answered requests, known as such in a later reply
STDIN_PIPE_SIZE = 1 << 20  # the default pipe-max-size: an unprivileged process may ask this much


def worker_argv(template: tuple[str, ...], slot: int) -> list[str]:
    """The worker's command: ``template`` with ``{%}`` replaced by its slot
    (the only replacement string a persistent command may hold)."""
    if SLOT not in template_tokens(template):
        return list(template)
    job = JobItem("", 0, slot)
    return [replace(arg, job) for arg in template]


class Worker:
    """One running worker process and the runner's ends of its pipes."""

    def __init__(self, keeper: Keeper, spec: JobSpec, slot: int, limit: int | None) -> None:
        self.keeper = keeper
        self.slot = slot
        self.limit = limit  # items before it is recycled (None: never)
        self.done = 0  # requests answered
        # The items of the last requests it answered: a reply naming one is a second reply.
        self.answered: deque[int] = deque(maxlen=ANSWERED_KEPT)
        self.retired = False
        self.busy = False  # an attempt of the runner's is on it
        self.owes_idle = False  # answered, and the keeper not told it left the item
        self.attempt: Job | None = None  # its attempt of the moment (persistent.py)
        # Told of each of our pipe ends before it is closed: the runner's
        # selector watches them for the worker's life (output_watch.py).
        self.on_close: Callable[[int], None] = lambda fd: None
        self.reader = ReplyReader()
        env = {
            "STATEQUEUE_QUEUE": spec.queue,
            "STATEQUEUE_WORKER": "1",
            "STATEQUEUE_REPLY_FD": str(kp.REPLY_FD),
        }
        ends: list[int] = []  # ours, then theirs
        try:
            for _ in range(4):
                ends += os.pipe2(os.O_CLOEXEC)
            out_r, out_w, err_r, err_w, in_r, in_w, reply_r, reply_w = ends
            theirs = [out_w, err_w, in_r, reply_w]
            self.token = keeper.spawn_worker(
                argv=worker_argv(spec.template, slot), env=env, streams=theirs
            )
        except BaseException:
            for fd in ends:
                os.close(fd)
            raise
        for fd in theirs:
            os.close(fd)
        self.stdin = in_w
        with contextlib.suppress(OSError):  # else the default 64 KiB: still room for most
            # Room for any request (an item is at most 64 KiB, more once JSON-escaped),
            # so that a short write means the worker does not read, never that it is slow.
            fcntl.fcntl(in_w, getattr(fcntl, "F_SETPIPE_SZ", 1031), STDIN_PIPE_SIZE)
        self._pidfd = -1  # held once its pid is known: a kill by pid then hits no other process
        for fd in (out_r, err_r, reply_r, in_w):
            os.set_blocking(fd, False)
        # Those not at EOF. Its stdin (stream 0) is watched too: the selector
        # reports it (EPOLLERR) only once no process reads it any more.
        self.pipes: dict[int, int] = {out_r: 1, err_r: 2, reply_r: 3, in_w: 0}
        self._sent = 0  # bytes of the request in flight
        self.unread: bool | None = None  # whether it never read that request (None: not known)
        self._reply_r = reply_r
        # Asked before each request whether a reply came without one: a poll
        # that finds nothing costs no exception, where a read would (EAGAIN).
        self._reply_ready = select.poll()
        self._reply_ready.register(reply_r, select.POLLIN)

    @property
    def pid(self) -> int | None:
        """The worker's pid, once the keeper has reported it."""
        return self.keeper.pids.get(self.token)

    def rss(self) -> int | None:
        """The worker's resident memory in bytes (None if unknown)."""
        pid = self.pid
        if pid is None:
            return None
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * PAGE_SIZE
        except (OSError, IndexError, ValueError):
            return None

    def hold_pid(self) -> None:
        """Open a pidfd of the worker once its pid is known (see ``kill_directly``)."""
        pid = self.pid
        # Not once its exit is reported: the keeper reaped it, so its pid may be another's.
        if self._pidfd < 0 and pid is not None and not self.dead():
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(pid)

    def kill_directly(self) -> None:
        """SIGKILL its process group without the keeper (which is gone, and
        would have done it): promise 4, as no process holds the claim for it."""
        self.hold_pid()
        if self._pidfd < 0:
            return
        # Unexited (its pidfd is not readable), it leads its group: the group id is its pid.
        if not readable(self._pidfd, 0):
            with contextlib.suppress(OSError):
                os.killpg(self.keeper.pids[self.token], signal.SIGKILL)

    def dead(self) -> bool:
        """Whether its exit (or failed spawn) has been reported."""
        return self.token in self.keeper.exits or self.token in self.keeper.failed

    def send(self, claim: Claim) -> str:
        """Give it ``claim``: its claim fds to the keeper, and the request.
        Returns why the request could not be written ("" when it was; a
        worker that reads no more requests is stopped, and ``unread`` set).

        A keeper process is given the claim first: if the runner died between
        the two, it alone would hold the claim while the worker works. The
        runner's own keeper (guarded shape) is given it just after the request,
        off the worker's path: the guard holds the runner's liveness lock, so
        the item stays claimed until it has killed the worker (guard.py).
        A reply it sent unasked is looked for first (``replied_unasked``)."""
        if self.keeper.in_process:
            problem = self._request(claim)
            self._assign(claim)
        else:
            self._assign(claim)
            problem = self._request(claim)
        if self._pidfd < 0:
            self.hold_pid()
        return problem

    def _assign(self, claim: Claim) -> None:
        self.keeper.assign(self.token, claim.item_id, claim.inherit_fds)
        self.owes_idle = False  # it left the last item with this

    def _request(self, claim: Claim) -> str:
        """Write the request for ``claim``; why it could not be ("" when it was)."""
        line = request_line(claim)
        self._sent, self.unread = len(line), None
        try:
            written = os.write(self.stdin, line)
        except BrokenPipeError:
            # Nobody reads its stdin: it is ending, or closed it and lives on
            # (it would wait for a request that never comes, and the run for it).
            self.unread = True
            self.retire()
            return ""
        except BlockingIOError:
            written = 0
        if written < len(line):
            return "the worker does not read its requests (its stdin is full)"
        return ""

    def replied_unasked(self) -> bool:
        """Whether it wrote a reply while it had no request (before a new one)."""
        return self._unsolicited() or self.reader.pending()

    def _unsolicited(self) -> bool:
        """Whether it wrote a reply while it had no request (read now, before the next)."""
        if self._reply_r not in self.pipes:  # at end of file already
            return False
        if not self._reply_ready.poll(0):
            return False
        try:
            data = os.read(self._reply_r, READ_SIZE)
        except BlockingIOError:
            return False
        self.reader.feed(data)
        return bool(data)

    def request_unread(self) -> bool:
        """Whether it never read the request in flight: once it ended, or no
        process reads its stdin any more, all of it is still in the pipe.
        What is left there is taken out (through a read end of our own), so
        that nothing left of the worker can read it later. Decided once per
        request; a request that cannot be looked at counts as read."""
        if self.unread is None:
            self.unread = self._sent > 0 and self._take_back() >= self._sent
        return self.unread

    def _take_back(self) -> int:
        """Read what is left in its stdin pipe; the number of bytes."""
        if self.stdin < 0:
            return 0
        try:
            fd = os.open(f"/proc/self/fd/{self.stdin}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return 0
        taken = 0
        try:
            while data := os.read(fd, READ_SIZE):
                taken += len(data)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        return taken

    def stdin_eof(self) -> None:
        """Close its stdin: a worker ends when its requests do."""
        if self.stdin >= 0:
            if self.pipes.pop(self.stdin, None) is not None:
                self.on_close(self.stdin)  # out of the runner's selector
            os.close(self.stdin)
            self.stdin = -1

    def idle(self) -> None:
        """It answered: no process of it belongs to the item any more."""
        self.owes_idle = False
        with contextlib.suppress(KeeperLost):
            self.keeper.assign(self.token, kp.NO_ITEM, ())

    def retire(self, signum: int = signal.SIGKILL) -> None:
        """Stop it (its process group, through the keeper): it gets no more
        items. Our ends of its pipes stay open until ``close`` (the runner's
        selector may still watch them)."""
        if not self.retired:
            self.retired = True
            with contextlib.suppress(KeeperLost):
                self.keeper.signal(self.token, signum)

    def close(self) -> None:
        """Close our ends of its pipes."""
        self.stdin_eof()
        for fd in self.pipes:
            self.on_close(fd)
            os.close(fd)
        self.pipes.clear()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def wait_for(keeper: Keeper, live: list[Worker], grace: float) -> None:
    """Wait for ``live`` workers to exit after the end of their stdin: half
    of ``grace``, then SIGTERM and the other half, then SIGKILL."""
    for signum, wait in ((0, grace / 2), (signal.SIGTERM, grace / 2), (signal.SIGKILL, 5.0)):
        for worker in live if signum else ():
            keeper.signal(worker.token, signum)
        end = time.monotonic() + wait
        while live and time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                keeper.receive_within(end - time.monotonic())
            live = [w for w in live if not w.dead()]
        if not live:
            return
