"""The end of a process pool's workers: SIGTERM, a grace, then SIGKILL.

When one worker dies, the executor fails every task in flight, SIGTERMs the
other workers and joins them, with no timeout. A worker whose ``fn`` ignores
SIGTERM (``signal.signal(SIGTERM, SIG_IGN)``, a library's handler, a long C
call that handles it late) would hold that join, and with it the map, for as
long as ``fn`` runs: forever, for a call that never returns. As
``multiprocessing.Pool.terminate``, GNU parallel's ``--termseq`` and our own
``run --grace`` do, the workers still alive ``TERM_GRACE`` seconds after the
break are SIGKILLed; each one's sentinel then kills what its ``fn`` started,
as for any worker that dies, and its item is counted or given back only once
they are all gone (``pool_guard``: end of file on the item's loan pipe).

The same bound holds where the pool ends otherwise: at the normal end of a
map, a worker that does not exit once told to (a thread ``fn`` left running)
is ended so after ``TERM_GRACE`` seconds (``end_idle``); and a Ctrl-C while
the calls in flight run on, after a first one, ends them so (``shut_down``,
and ``mapping`` for a map with several slots).

Workers are watched through pidfds opened as the pool starts, while each is
surely alive, so a pid reused after a worker ended is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

TERM_GRACE = 5.0
"""Seconds a pool's workers get after SIGTERM, before SIGKILL (and, at the
normal end, to exit before SIGTERM)."""


class Workers:
    """The worker processes of one pool, by pid, each watched through a pidfd."""

    def __init__(self, pids: list[int]) -> None:
        self._fds: dict[int, int] = {}
        for pid in pids:
            with contextlib.suppress(AttributeError, OSError):  # no pidfds: nothing to escalate
                self._fds[pid] = os.pidfd_open(pid)
        self._killed: set[int] = set()
        self._deadline: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, executor: ProcessPoolExecutor) -> Workers:
        """The workers ``executor`` has started (call it once they all are)."""
        # Python has no public call for these; where it is missing, none are watched.
        processes = getattr(executor, "_processes", None)
        pids = list(processes) if isinstance(processes, dict) else []
        return cls([pid for pid in pids if isinstance(pid, int)])

    def end_broken(self, grace: float = TERM_GRACE) -> None:
        """The pool broke, and the executor SIGTERMs its workers: wait until
        each has exited, or until ``grace`` seconds after the first call, and
        SIGKILL the rest. Every slot whose call broke calls it; it returns
        once the last worker has exited or been sent SIGKILL."""
        with self._lock:
            if self._deadline is None:
                self._deadline = time.monotonic() + grace
            left = _still_alive(self._fds, self._deadline)
            for pid in left:
                self._killed.add(pid)  # before the signal: a reader after it sees the mark
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._fds[pid], signal.SIGKILL)

    def exited(self, within: float) -> bool:
        """Whether every worker has exited, waiting up to ``within`` seconds."""
        with self._lock:
            return not _still_alive(self._fds, time.monotonic() + within)

    def stop(self, grace: float = TERM_GRACE) -> None:
        """SIGTERM every worker, then as ``end_broken``: SIGKILL those still
        alive ``grace`` seconds later (a second Ctrl-C, see ``pool_guard``)."""
        with self._lock:
            for fd in self._fds.values():
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGTERM)
        self.end_broken(grace)

    def killed(self, pid: int | None) -> bool:
        """Whether worker ``pid`` was SIGKILLed here, by the end of a broken
        pool (its death is then the pool's doing, not its item's)."""
        with self._lock:
            return pid in self._killed

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def shut_down(executor: ProcessPoolExecutor, workers: Workers) -> None:
    """Let the calls in flight end (after a Ctrl-C, too: they hold their
    items' claims); a Ctrl-C while they run ends the workers instead, as a
    second Ctrl-C does for ``run``: SIGTERM, a grace, SIGKILL."""
    try:
        executor.shutdown(wait=True, cancel_futures=True)
    except KeyboardInterrupt:
        workers.stop()
        executor.shutdown(wait=True, cancel_futures=True)
        raise


def end_idle(executor: ProcessPoolExecutor, workers: Workers) -> None:
    """The end of a pool with no call in flight: each worker is told to exit;
    one that does not within the grace (a thread ``fn`` left running keeps
    its process) is ended as a broken pool's workers are. Its sentinel had
    its goodbye: what ``fn`` started goes on, as after any normal end."""
    executor.shutdown(wait=False, cancel_futures=True)
    if not workers.exited(TERM_GRACE):
        workers.stop()
    executor.shutdown(wait=True)


def _still_alive(fds: dict[int, int], deadline: float) -> list[int]:
    """The pids of ``fds`` whose process has not exited by ``deadline``."""
    left = dict(fds)
    while left:
        wait = deadline - time.monotonic()
        poller = select.poll()  # not select: fds past FD_SETSIZE are possible
        for fd in left.values():
            poller.register(fd, select.POLLIN)  # a pidfd is readable once its process exits
        exited = {fd for fd, _ in poller.poll(max(0.0, wait) * 1000)}
        left = {pid: fd for pid, fd in left.items() if fd not in exited}
        if wait <= 0:
            break
    return list(left)
