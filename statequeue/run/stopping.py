"""How a run stops its children: on a signal (with --grace), and on an error.

A first SIGINT, SIGTERM or SIGHUP is forwarded to every child's process
group, and each gets ``--grace`` seconds before SIGKILL (the runner's loop
enforces that time, jobs.py: ``enforce_times``); a second one kills them at
once. On an unexpected error every child is killed and its item given back
(recovery finds it on the next run if even that fails; on a full disk the
store's space reserve makes room for it) -- unless the error
is the keeper's death and a process of the item may live on without it
(orphans.py): then the item stays claimed, and recovery takes it once its
claim lock is free.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from statequeue.run.guard import GuardLink
from statequeue.run.jobs import Job
from statequeue.run.keeper import Keeper
from statequeue.run.orphans import end_orphans
from statequeue.run.recorder import ResultRecorder
from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.run.persistent import WorkerPool

__all__ = ["DISK_FULL", "close_children", "forward_stop", "give_back_all"]

# Why an item in flight went back when its run stopped on a full disk: the
# truth, where recovery would say its runner died (and count a crash).
DISK_FULL = "interrupted: runner stopped: disk full"


def forward_stop(
    jobs: Iterable[Job], signum: int, grace: float, *, first: bool, hard: bool
) -> None:
    """Send ``signum`` to each job's group and give it ``grace`` seconds
    (``first``: the first signal, seen now); ``hard`` (a second
    signal): SIGKILL every group now."""
    jobs = list(jobs)
    if first:
        now = time.monotonic()
        for job in jobs:
            job.stop_reason = job.stop_reason or "stopped"
            job.signal_group(signum)
            job.kill_at = now + grace
    if hard:
        for job in jobs:
            job.killed = True
            job.signal_group(signal.SIGKILL)


def give_back_all(
    jobs: dict[int, Job],
    store: Store,
    recorder: ResultRecorder,
    keeper: Keeper | None = None,
    failure: BaseException | None = None,
) -> None:
    """On an unexpected error (``failure``): kill every child and give its
    item back. Every child is killed before anything is written: on a full
    disk none of them may take the room the store frees for these records
    (``Store.space_reserve_freed``). Then the items go back as a signal's
    stop gives them back, counting no crash, and say the disk was full."""
    held = _may_live_on(store, keeper)
    ended = list(jobs.values())
    jobs.clear()
    for job in ended:
        job.signal_group(signal.SIGKILL)
    for job in ended:
        job.reap()
        job.cut()  # its detached leftovers too: the item goes back to the queue
        job.close()
    with contextlib.ExitStack() as stack:
        full_disk = failure is not None and stack.enter_context(store.space_reserve_freed(failure))
        # Best effort, each: what cannot go back, recovery finds on the next run.
        with contextlib.suppress(Exception):
            recorder.give_back_prefetched()
        if full_disk:  # ended, but their results could not be written
            for job, _ in recorder.unrecorded:
                with contextlib.suppress(Exception):
                    store.release(job.claim, f"{DISK_FULL}; its result was not recorded")
            recorder.unrecorded.clear()
        if held:  # its claim lock file tells recovery when nothing of it is left
            return
        reason = DISK_FULL if full_disk else "interrupted: runner stopped on an error"
        for job in ended:
            with contextlib.suppress(Exception):
                store.release(job.claim, reason)


def _may_live_on(store: Store, keeper: Keeper | None) -> bool:
    """Whether a process of an item may outlive the run: the keeper process,
    their parent, died, and what it left could not all be killed here
    (orphans.py). A lost keeper's children are killed first, every one,
    before any claim goes back. The local store's claims are locks that a
    retry waits for anyway: its items go back as before."""
    if keeper is None or keeper.in_process or not keeper.lost:
        return False
    return not end_orphans() and store.has_leases


def close_children(
    workers: WorkerPool | None, keeper: Keeper | None, guard: GuardLink | None, grace: float
) -> None:
    """At a run's end, once every item is settled or given back (``give_back_all``):
    persistent workers are stopped (with ``grace``), and the keeper closes. It
    exits, or stays until a detached leftover of an item has ended, holding that
    item's claim; with no child ever started the guard holds nothing."""
    if workers is not None:
        workers.close(keeper, grace)
    if keeper is not None:
        keeper.close()
    elif guard is not None:
        guard.close({})
