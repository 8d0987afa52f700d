"""Persistent workers (``run --persistent``): one long-lived worker per slot, fed items in turn.

A worker (worker_process.py) is started by the keeper like an item's command (its parent, so
promise 4 holds as for per-item children: the keeper makes it, and whatever
it starts, the processes of the item it works on, holding that item's claim
while any of them lives). The runner writes one request per item on its
stdin and reads the reply on a pipe of its own (protocol.py). Each request is
one attempt (``WorkerAttempt``): to the runner's loop it is a ``Job`` that
ends when the reply comes, whose log is what the worker wrote on stdout and
stderr between the request and the reply. The worker stays for the next
item unless it died, was stopped (a timeout, a stop), broke the protocol or
is due for recycling; then the slot gets a new one.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from statequeue.core.errors import CommandCannotStart, KeeperLost, WorkerBroken
from statequeue.core.models import Claim
from statequeue.core.views import WorkerView
from statequeue.run.jobs import JobSpec
from statequeue.run.keeper import Keeper
from statequeue.run.options import RunOptions
from statequeue.run.worker_attempt import WorkerAttempt
from statequeue.run.worker_process import Worker, wait_for
from statequeue.store.base import Store

__all__ = ["WorkerAttempt", "WorkerPool", "WorkerSettings"]

PUBLISH_EVERY = 1.0  # seconds between updates of the workers `status` shows
START_FAILURES = 2  # workers in a row that die before their first reply: the run stops
RESERVE_BELOW = 0.05  # seconds: attempts this short have the next claim made ready as they run


@dataclass(frozen=True)
class WorkerSettings:
    """How the workers of a persistent run are recycled (RunOptions)."""

    recycle_after: int | None = None
    recycle_rss: int | None = None  # bytes


class WorkerPool:
    """The workers of a persistent run, one per slot, started when a slot first needs one."""

    def __init__(
        self,
        spec: JobSpec,
        settings: WorkerSettings,
        jobs: int,
        *,
        on_broken: Callable[[], None] = lambda: None,
    ) -> None:
        self.spec = spec
        self._on_broken = on_broken  # the run takes no new item (then ``tend`` raises)
        self.settings = settings
        self.jobs = jobs
        self.workers: dict[int, Worker] = {}  # slot -> its worker
        self._leaving: list[Worker] = []  # retired, exit not yet collected
        self._slots_seen: set[int] = set()  # slots that had a worker (see _limit)
        self.start_failures = 0  # workers in a row that ended before their first reply
        self._durations: list[float] = []  # of the last attempts (the last batch, and 3 before)
        self.last_item = 0  # the item the last of them was given (its log says why)
        self._publish_at = 0.0
        self._keeper: Keeper | None = None  # the run's (the workers' parent), once one started
        self.cannot_start = ""  # why its command cannot start (the run stops: ``check``)
        self.in_flight = 0  # attempts started and not finished

    def attempt(self, claim: Claim, keeper: Keeper, slot: int) -> WorkerAttempt:
        """Start ``claim`` on ``slot``'s worker (a new one if it has none)."""
        return WorkerAttempt(claim, self.spec, keeper, slot=slot, pool=self)

    def worker_for(self, slot: int, keeper: Keeper) -> Worker:
        """``slot``'s worker: the live one, or a new one in place of one that
        ended, was retired, reads no more requests, or is due for recycling."""
        self._keeper = keeper
        self._collect(keeper)
        worker = self.workers.get(slot)
        if worker is None or worker.retired or worker.dead() or worker.stdin < 0:
            return self.renew(slot, keeper)
        return self.renew(slot, keeper) if self._due(worker) else worker

    def renew(self, slot: int, keeper: Keeper) -> Worker:
        """A new worker for ``slot`` in place of the one there (stopped)."""
        old = self.workers.get(slot)
        if old is not None:
            self._drop(old)
        worker = self.workers[slot] = Worker(keeper, self.spec, slot, self._limit(slot))
        return worker

    def _limit(self, slot: int) -> int | None:
        """Items before recycling: the first worker of slot k goes (k-1)/jobs
        of the way early, so the slots' restarts stay spread out."""
        every = self.settings.recycle_after
        if every is None:
            return None
        if slot in self._slots_seen:
            return every
        self._slots_seen.add(slot)
        return max(1, every - (slot - 1) * every // self.jobs)

    def _due(self, worker: Worker) -> bool:
        """Whether ``worker`` (between items) is to be replaced now."""
        if worker.limit is not None and worker.done >= worker.limit:
            return True
        limit = self.settings.recycle_rss
        if limit is None:
            return False
        rss = worker.rss()
        if rss is None or rss < limit:
            return False
        # One restart at a time: while another slot's new worker has not
        # answered yet, this one works on (so the slots never all restart at once).
        return not any(w.done == 0 for w in self.workers.values() if w is not worker)

    def _drop(self, worker: Worker) -> None:
        """``worker`` leaves its slot: stopped (if it still runs), its exit collected later."""
        # Between items: end of file on its stdin, and SIGTERM (a worker that
        # ignored the end of its requests would otherwise outlive the run).
        worker.stdin_eof()
        worker.retire(signal.SIGTERM)
        worker.close()
        if self.workers.get(worker.slot) is worker:
            del self.workers[worker.slot]
        self._leaving.append(worker)  # its exit report is dropped once it comes

    def _collect(self, keeper: Keeper) -> None:
        """Forget the exits of retired workers (they are not any attempt's)."""
        if not self._leaving:
            return
        for worker in list(self._leaving):
            if worker.dead():
                for reports in (keeper.exits, keeper.failed, keeper.pids):
                    reports.pop(worker.token, None)
                self._leaving.remove(worker)

    def attempts_ended(self, durations: list[float]) -> None:
        """The seconds the attempts that just ended took (``reserving`` reads them)."""
        if durations:
            self._durations = [*self._durations[-3:], *durations]

    @property
    def reserving(self) -> bool:
        """Whether the next item is worth holding ready while the workers work
        (Store.reserve, Runner._start): while the items are short (the
        shortest of the last few attempts took under RESERVE_BELOW; a slow one
        now and then, as the first, which waited for its worker to start, does
        not stop it). A long item gains nothing, and would keep its successor
        from other runners. Not with per-item children: a new child starts on
        the runner's CPU, so work done after its spawn delays it (measured:
        -j1 7% slower), where a woken worker runs on another."""
        return bool(self._durations) and min(self._durations) < RESERVE_BELOW

    def ended(self, worker: Worker, *, answered: bool) -> None:
        """``worker`` ended during an attempt (``answered``: after its first
        reply). Once START_FAILURES in a row ended before their first reply,
        the run takes no new item, and ``tend`` raises WorkerBroken."""
        worker.retire()
        if self.workers.get(worker.slot) is worker:
            del self.workers[worker.slot]
        if not worker.dead() and worker not in self._leaving:
            self._leaving.append(worker)  # its exit comes later: collected, not reaped
        self.start_failures = 0 if answered else self.start_failures + 1
        if self.start_failures >= START_FAILURES:
            self._on_broken()

    @classmethod
    def for_run(
        cls, spec: JobSpec, options: RunOptions, on_broken: Callable[[], None]
    ) -> WorkerPool | None:
        """The pool of a run with ``persistent`` (None without); ``on_broken``
        stops the run taking items once the workers keep dying at start."""
        if not options.persistent:
            return None
        settings = WorkerSettings(options.recycle_after, options.recycle_rss)
        return cls(spec, settings, options.jobs, on_broken=on_broken)

    def tend(self, store: Store, runner_id: str) -> None:
        """After the slots were filled: WorkerBroken if the workers keep dying
        at start; a worker that answered and got no new item is no process of
        that item any more (the keeper lets its claim go: a retry of it may
        run), nor is one of the item it left for a new one (the keeper looks
        for leftovers now); and `status` shows the workers (pid, items done,
        RSS), updated at most once a PUBLISH_EVERY."""
        self.check()
        for worker in self.workers.values():
            if worker.owes_idle and not worker.busy:
                worker.idle()
        if self._keeper is not None:
            # The item each worker just left is released now, while the
            # workers work on their new requests, rather than when the next
            # reply wakes the runner (then the look would delay its record).
            self._keeper.tend()
        now = time.monotonic()
        if now < self._publish_at:
            return
        self._publish_at = now + PUBLISH_EVERY
        views = [
            WorkerView(slot, pid, worker.done, worker.rss())
            for slot, worker in sorted(self.workers.items())
            if (pid := worker.pid) is not None
        ]
        store.publish_workers(runner_id, views)

    def unstartable(self, error: OSError) -> None:
        """A worker's command could not start (``error``, not a shortage):
        every worker would fail alike, so the run takes no new item, and
        ``tend`` raises CommandCannotStart (exit 2, as for a missing program)."""
        what = error.filename or self.spec.template[0]
        self.cannot_start = f"cannot start command {what!r}: {error.strerror or error}"
        self._on_broken()

    def check(self) -> None:
        """CommandCannotStart if a worker's command could not start;
        WorkerBroken if the workers keep dying before their first reply."""
        if self.cannot_start and not self.in_flight:  # the others ended first: none cut short
            raise CommandCannotStart(
                f"{self.cannot_start}; the items it was given went back to pending, uncounted"
            )
        if self.start_failures >= START_FAILURES:
            doc = (WorkerBroken.__doc__ or "").rstrip(".")
            raise WorkerBroken(f"{doc}; its output: `statequeue logs {self.last_item}`")

    def close(self, keeper: Keeper | None, grace: float) -> None:
        """The run is over: end every worker (end of file on its stdin, then
        SIGTERM, then SIGKILL after ``grace``), waiting for them."""
        workers = list(self.workers.values())
        self.workers.clear()
        for worker in workers:
            worker.stdin_eof()
        if keeper is None:
            return
        try:
            wait_for(keeper, [w for w in workers if not w.dead()], grace)
        except KeeperLost:
            for worker in workers:
                worker.kill_directly()
        for worker in workers:
            worker.close()
            keeper.exits.pop(worker.token, None)
