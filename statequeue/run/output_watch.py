"""What the runner's one loop waits on, and the reading of children's output.

The runner has no threads: it sleeps in one selector on the keeper's socket
(children's exits), the children's pipes, a wake-up pipe for signals and, with
``follow``, the store's wake-up fd. This module owns those fds, so the runner
keeps only the decisions (what to claim, stop, record).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, cast

from statequeue.run.jobs import Job
from statequeue.run.keeper import Keeper
from statequeue.run.poller import Poller
from statequeue.run.wakeup import StoreWake
from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.run.persistent import WorkerAttempt
    from statequeue.run.worker_process import Worker  # --persistent only

__all__ = ["OUTPUT_WATCH_DELAY", "OutputWatch"]

# A child's pipes are watched from this many seconds after its start: most
# short items have exited by then, and their output is read once, at their
# exit, with no wakeup of the runner for their pipes' end of file. A child
# that fills a pipe sooner waits at most this long for the runner to read it.
OUTPUT_WATCH_DELAY = 0.05
_KEEPER = object()  # selector tag of the keeper's socket
_STORE_WAKE = object()  # selector tag of the store's wake-up fd (--follow)


class OutputWatch:
    """The runner's selector and the fds in it."""

    def __init__(self, store: Store) -> None:
        self._keeper: Keeper | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = Poller()
        self._selector.watch(self._wake_r, None)
        self._store_wake = StoreWake(store, self._selector, _STORE_WAKE)

    def wake(self) -> None:
        """Make the next (or current) ``wait`` return at once (safe from a signal handler)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def watch_store(self) -> None:
        """Listen for the store's news of new work (--follow), if not yet."""
        self._store_wake.watch()

    def watch_keeper(self, keeper: Keeper) -> None:
        """Take in the exits ``keeper`` reports from now on."""
        self._keeper = keeper
        self._selector.watch(keeper.fileno(), _KEEPER)

    def started(self, job: Job) -> None:
        """``job`` has just started: its pipes are watched after OUTPUT_WATCH_DELAY
        (a persistent worker's at once, and for the worker's life)."""
        if not job.result_by_file:  # a persistent worker's attempt (persistent.py)
            self._watch_worker(cast("WorkerAttempt", job).worker)
        elif job.watch_now:
            self.watch_output(job)
        else:
            job.watch_at = job.started + OUTPUT_WATCH_DELAY

    def watch_output(self, job: Job) -> None:
        """Read ``job``'s pipes as output arrives (its start was a while ago)."""
        job.watch_at = None
        for fd in job.pipes:
            self._selector.watch(fd, job)

    def _watch_worker(self, worker: Worker) -> None:
        """Watch a persistent worker's pipes, once for its life: they outlive
        each attempt, and what they report goes to its attempt of the moment
        (``_worker_output``). Only a pipe set aside between its items (or a
        new worker's) is added: most attempts cost the selector no syscall."""
        for fd in worker.pipes:
            if self._selector.tag(fd) is not worker:
                self._selector.watch(fd, worker)
        worker.on_close = self._selector.forget  # its close takes them out of the set

    def forget_output(self, job: Job) -> None:
        """``job`` is over: its pipes leave the selector (before they are closed);
        a persistent worker's stay, for its next attempt."""
        if job.watch_at is None and job.result_by_file:  # not a persistent worker's
            for fd in job.pipes:  # pipes at end of file were forgotten already
                self._selector.forget(fd)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds and take in what came. False if only
        children's output came (no exit, signal or wake-up: the loop need not
        look again at its slots, deadlines and items)."""
        ready = self._selector.ready(timeout)
        news = not ready  # the wait timed out: a deadline may have come
        for fd, job in ready:
            if job is None:
                _drain_pipe(self._wake_r)
                news = True
            elif job is _KEEPER:
                assert self._keeper is not None  # watched only once there is one
                self._keeper.receive()  # exits, recorded in keeper.exits
                news = True
            elif job is _STORE_WAKE:
                self._store_wake.woke()  # the next pass of the loop claims
                news = True
            elif not isinstance(job, Job):  # a persistent worker (its pipes outlive attempts)
                news = self._worker_output(fd, cast("Worker", job)) or news
            elif fd in job.pipes and not job.read(fd):
                self._selector.forget(fd)  # closing it takes it out of the epoll set
                job.close_pipe(fd)
        return news

    def _worker_output(self, fd: int, worker: Worker) -> bool:
        """Read a persistent worker's pipe for its attempt of the moment;
        True once that attempt has its reply (it ends the attempt).

        All of a batch's ready fds are read before the runner ends an attempt,
        and the worker wrote its output before its reply: so what it wrote
        before replying is in this attempt's log with no read that finds the
        pipes empty. Between its items nobody reads: the pipe leaves the set
        (its data waits for the next attempt, the next request's check finds
        a reply sent without one) and comes back with the next attempt."""
        attempt = worker.attempt
        if attempt is None or fd not in attempt.pipes:
            self._selector.unwatch(fd)
            return False
        if not attempt.read(fd):
            self._selector.forget(fd)  # closing it takes it out of the epoll set
            attempt.close_pipe(fd)
        return attempt.exited()

    def close(self) -> None:
        """Close the selector and the wake-up pipe (the run is over)."""
        self._store_wake.close()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
