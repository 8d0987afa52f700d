"""The runner: claim items, run the command for each, record every result.

One loop, no threads: it waits on the keeper's socket (which reports the
children's exits), the children's pipes, a wakeup pipe for signals, and the
nearest deadline (a timeout, a kill after the grace period, a retry coming
due, a poll for new items with ``follow``).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from statequeue.api.queue import Queue
from statequeue.api.work import backoff
from statequeue.core import lease_clock
from statequeue.core.errors import (
    ClaimLost,
    KeeperLost,
    ResourcesExhausted,
    StoreUnreachable,
    UsageError,
)
from statequeue.core.fileio import CRASH
from statequeue.core.identity import new_runner
from statequeue.core.models import (
    Claim,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.run.attempt_logs import hand_over_log
from statequeue.run.checks import Verifier, check_command, recovery_notice
from statequeue.run.events import ItemFinished, ItemStarted, Notice, RunEvent, RunSummary
from statequeue.run.jobs import Job, JobSpec, OutputSink
from statequeue.run.keeper import Keeper
from statequeue.run.outage import OUTAGE_SLICE, OUTAGE_TICK, Outage, outage_limit
from statequeue.run.poller import Poller
from statequeue.run.wakeup import StoreWake, follow_poll
from statequeue.store.base import MIN_LEASE

__all__ = [
    "ItemFinished",
    "ItemStarted",
    "Notice",
    "RunEvent",
    "RunOptions",
    "RunSummary",
    "Runner",
    "parse_verify",
]

FOLLOW_POLL = 0.25  # seconds between checks for new items while following
IDLE_TICK = 1.0
HELD_POLL = 0.02  # seconds between claim attempts on a due retry whose claim is held
# A child's pipes are watched from this many seconds after its start: most
# short items have exited by then, and their output is read once, at their
# exit, with no wakeup of the runner for their pipes' end of file. A child
# that fills a pipe sooner waits at most this long for the runner to read it.
OUTPUT_WATCH_DELAY = 0.05
VERIFY_TIMEOUT = 600.0
# Spawn errors that say the runner (or the machine) is short of something,
# not that the item's command is wrong: the item is given back, uncounted.
# ENOBUFS and ETOOMANYREFS: passing the child's fds to the keeper failed.
RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOBUFS, errno.ETOOMANYREFS}
)
_SHORT_ADVICE = (
    "stopped, the items stay pending (raise the limit, e.g. `ulimit -n`, or lower --jobs)"
)
_SETTLED = (ItemState.DONE, ItemState.FAILED)  # recorded for good: no lease to fence
_KEEPER = object()  # selector tag of the keeper's socket
_STORE_WAKE = object()  # selector tag of the store's wake-up fd (--follow)


@dataclass(frozen=True)
class RunOptions:
    """Everything ``statequeue run`` can be told. Durations are in seconds."""

    command: tuple[str, ...]
    jobs: int = 1
    timeout: float | None = None
    grace: float = 5.0
    retries: int = 0
    retry_delay: float = 1.0
    retry_max_delay: float = 300.0
    on_interrupted: OnInterrupted = OnInterrupted.RETRY
    max_crashes: int = 3
    verify: str = ""
    """A shell script (see verify.py); "" for none. Checked before an
    interrupted item runs again, and with ``verify_first`` before every first run."""
    verify_first: bool = False
    limit: int | None = None
    max_time: float | None = None
    follow: bool = False
    halt_on_failure: bool = False
    single: bool = False
    item_on_stdin: bool = False
    log_limit: int = 1 << 20
    lease: float | None = None
    """Seconds each claim's lease lasts, for stores with leases (None: the store's default)."""
    give_up_after: float | None = None
    """Seconds the store may stay unreachable before the run stops (StoreUnreachable);
    None: the default (never with ``follow``, 10 minutes without); 0: never (run_outage.py)."""

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no command given: use `statequeue run -- COMMAND [ARG]...`")
        if self.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if self.retries < 0 or self.max_crashes < 1:
            raise UsageError("--retries must be >= 0 and --max-crashes >= 1")
        if self.limit is not None and self.limit < 0:
            raise UsageError("--limit must be >= 0")
        if self.log_limit < 0:
            raise UsageError(f"--log-limit must be >= 0 bytes, not {self.log_limit}")
        if self.lease is not None and not self.lease >= MIN_LEASE:
            raise UsageError(f"--lease must be at least {MIN_LEASE:g}s, not {self.lease:g}s")
        if self.give_up_after is not None and not self.give_up_after >= 0:
            raise UsageError(f"--give-up-after must be >= 0, not {self.give_up_after:g}s")
        if self.verify_first and not self.verify:
            raise UsageError("--verify-first needs --verify SCRIPT")


def parse_verify(script: str) -> str:
    """The ``--verify`` script as ``sh -c`` will run it (see verify.py); a
    UsageError if it is empty or not valid shell."""
    from statequeue.run.checks import check_verify_script

    return check_verify_script(script)


class Runner:
    """Runs ``options.command`` for the items of ``queue``."""

    def __init__(
        self,
        queue: Queue,
        options: RunOptions,
        *,
        on_event: Callable[[RunEvent], None] | None = None,
        live: OutputSink | None = None,
    ) -> None:
        self.queue = queue
        # Taken once: ``queue.store`` checks the process id on every use (for
        # a Queue used across a fork), a syscall the per-item path need not pay.
        self._store = queue.store
        self.options = options
        self.on_event = on_event or (lambda event: None)
        self.info: RunnerInfo = new_runner(command=options.command)
        folder = queue.path or Path(".")
        self.spec = JobSpec(
            template=options.command,
            queue=queue.name,
            log_dir=folder / "logs",
            log_dir_fd=queue.store.logs_fd,
            log_limit=options.log_limit,
            item_on_stdin=options.item_on_stdin,
            live=live,
        )
        self.summary = RunSummary()
        self.verifier: Verifier | None = None
        if options.verify:
            self.verifier = Verifier(
                script=options.verify,
                queue=queue.name,
                result_dir=str(self.spec.log_dir),
                base_env=self.spec.base_env,
                timeout=options.timeout or VERIFY_TIMEOUT,
                stopping=lambda: self._stop_signal is not None,
                log_dir_fd=self.spec.log_dir_fd,
            )
        self.jobs: dict[int, Job] = {}  # by the keeper's token (a pid may be reused)
        self._concurrency = options.jobs  # lowered when spawning runs short of resources
        self._stop_signal: int | None = None
        self._stop_count = 0
        self._taking = True
        self._taken: set[int] = set()
        self._prefetched: Claim | None = None  # claimed with the last result, not started yet
        self._max_time_at: float | None = None  # monotonic time --max-time runs out
        # Ended children whose results the store could not take yet (an
        # outage), and the events of results written but not yet synced.
        self._unrecorded: list[tuple[Job, Outcome]] = []
        self._owed_events: list[RunEvent] = []
        self.keeper: Keeper | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = Poller()
        self._selector.watch(self._wake_r, None)
        self._store_wake = StoreWake(queue.store, self._selector, _STORE_WAKE)
        self._follow_poll = follow_poll()

    # -- signals ---------------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """Stop taking items and stop the children (safe from a signal handler).

        The first call forwards ``signum`` to every child's process group and
        gives them ``grace`` seconds; a second call kills them at once.
        """
        self._stop_count += 1
        if self._stop_signal is None:
            self._stop_signal = signum
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def install_signal_handlers(self) -> None:
        """Route SIGINT and SIGTERM to ``request_stop`` (main thread only)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: self.request_stop(signum))

    # -- main loop ---------------------------------------------------------------

    def run(self) -> RunSummary:
        """Run until no item is left (or --limit, --max-time, a signal).
        Raises CommandNotFound, with nothing claimed, if the command is missing."""
        check_command(self.options.command, self.spec.base_env)
        store = self.queue.store
        if self.options.lease is not None:
            store.use_lease(self.options.lease)
        store.use_patience(OUTAGE_SLICE)  # outages are ridden out by the loop (_ride_out)
        earlier = store.commands()
        store.register_runner(self.info, exclusive=self.options.single)
        self._warn_on_command_drift(earlier)
        try:
            self._report_recovery()
        except BaseException:
            store.unregister_runner(self.info.runner_id)
            raise
        if self.options.max_time is not None:
            self._max_time_at = time.monotonic() + self.options.max_time
        try:
            self._loop()
        finally:
            self._shutdown()
            if self.keeper is not None:
                # The keeper exits, or stays until a detached leftover of an
                # item has ended, holding that item's claim.
                self.keeper.close()
            # Unreachable: its row is marked stopped once its pid or lease is seen gone.
            with contextlib.suppress(StoreUnreachable):
                store.unregister_runner(self.info.runner_id)
            self._store_wake.close()
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
        self.summary.stopped_by = self._stop_signal
        return self.summary

    def _out_of_time(self) -> bool:
        """Whether --max-time has run out."""
        return self._max_time_at is not None and time.monotonic() >= self._max_time_at

    def _loop(self) -> None:
        while True:
            try:
                if not self._pass():
                    return
            except StoreUnreachable as exc:
                # Counted from now: the call has tried for OUTAGE_SLICE at most
                # already, so the run never gives up before --give-up-after.
                limit = outage_limit(self.options.give_up_after, follow=self.options.follow)
                if not self._ride_out(Outage(time.monotonic(), limit, exc)):
                    return

    def _ride_out(self, outage: Outage) -> bool:
        """Wait for the store to come back, fencing the claims whose leases
        run out meanwhile (see run_outage.py). True once it answers again;
        False if a signal stopped the run meanwhile (its children have ended).
        StoreUnreachable once the run gives up."""
        self.on_event(Notice(outage.start_text(), warning=True))
        while True:
            outage.check(time.monotonic(), out_of_time=self._out_of_time())
            self._handle_stop()
            self._fence()
            with contextlib.suppress(StoreUnreachable):  # their results wait in _unrecorded
                self._reap()
            if self._stop_signal is not None:
                if not self.jobs:
                    for job, _ in self._unrecorded:  # left to recovery, as if in flight
                        self.summary.hand_back(job.claim.item_id)
                    self._unrecorded.clear()
                    self._owed_events.clear()
                    return False
            else:
                try:
                    self._store.is_paused()  # any call: it reconnects, with backoff
                except StoreUnreachable as exc:
                    outage.error = exc
                else:
                    self.on_event(Notice(outage.end_text(time.monotonic())))
                    return True
            self._wait(OUTAGE_TICK)

    def _pass(self) -> bool:
        """One pass of the loop; False when the run is over."""
        self._handle_stop()
        self._record_owed()
        if self._taking and self._out_of_time():
            self._taking = False
            self.on_event(Notice("--max-time reached: taking no new items"))
        if self.options.follow:
            # Listening before claiming: work added after this claim
            # finds nothing still wakes the runner.
            self._store_wake.watch()
        if self._taking:
            self._fill_slots()
        self._give_back_prefetched()
        if not self.jobs:
            wait = self._idle_wait()
            if wait is None:
                return False
        else:
            wait = self._next_deadline()
        until = time.monotonic() + wait
        while not self._wait(wait):
            # Only children's output came: nothing the loop acts on has
            # changed, so wait on for what it was waiting for (a child's
            # exit comes from the keeper, after its pipes' end of file).
            wait = until - time.monotonic()
            if wait <= 0:
                break
        self._fence()
        self._reap()
        return True

    def _report_recovery(self) -> None:
        """Recover what dead runners left in flight now, to say so (``claim``
        would do it silently)."""
        opts = self.options
        report = self.queue.store.recover(
            on_interrupted=opts.on_interrupted, max_crashes=opts.max_crashes
        )
        notes = recovery_notice(
            report.retried, report.failed, report.held, opts.on_interrupted, bool(opts.verify)
        )
        for text, warning in notes:
            self.on_event(Notice(text, warning=warning))

    def _scope(self) -> set[int] | None:
        """Which items this run may still claim: None for any, else only these
        (with --limit reached, just retries of the items it already took)."""
        limit = self.options.limit
        if limit is None or len(self._taken) < limit:
            return None
        return {i for i in self._taken if i not in self._running_ids()}

    def _running_ids(self) -> set[int]:
        return {job.claim.item_id for job in self.jobs.values()}

    def _fill_slots(self) -> None:
        while len(self.jobs) < self._concurrency and self._taking:
            scope = self._scope()
            if scope is not None and not scope:
                return
            try:
                claim = self._take_prefetched() or self.queue.claim(
                    self.info,
                    on_interrupted=self.options.on_interrupted,
                    max_crashes=self.options.max_crashes,
                    among=scope,
                )
            except OSError as exc:  # the claim's lock file could not be opened
                if exc.errno not in RESOURCE_ERRNOS:
                    raise
                self._short_of_resources(exc)
                return
            if claim is None:
                return
            self._taken.add(claim.item_id)
            if self._verify_wanted(claim) and self._verified(claim):
                continue
            if self._stop_signal is not None:  # a signal arrived during --verify
                self.queue.store.release(claim, "interrupted: runner stopped by a signal")
                self.summary.hand_back(claim.item_id)
                return
            self._start(claim)

    def _take_prefetched(self) -> Claim | None:
        claim, self._prefetched = self._prefetched, None
        return claim

    def _give_back_prefetched(self) -> None:
        """A claim taken along with the last result that no slot started (the
        run stopped taking items meanwhile) goes back as if never claimed."""
        claim = self._take_prefetched()
        if claim is not None:
            reason = "not started: the run stopped taking items"
            try:
                self.queue.store.release(claim, reason, uncounted=True)
            except StoreUnreachable:
                self._prefetched = claim  # given back once the store is back
                raise

    def _prefetch_scope(self) -> tuple[bool, set[int] | None]:
        """Whether a result may be recorded together with the next claim (a
        slot is free and the run goes on), and the ids that claim may take."""
        if (
            not self._taking
            or self._stop_signal is not None
            or self.options.halt_on_failure  # this very result may stop the run
            or self._prefetched is not None
            or len(self.jobs) >= self._concurrency
            or self._out_of_time()  # the loop stops taking items on its next pass
        ):
            return False, None
        scope = self._scope()
        return scope is None or bool(scope), scope

    def _free_slot(self) -> int:
        """The lowest job slot (1 to --jobs) no running child holds: ``{%}``."""
        if not self.jobs:
            return 1
        used = {job.slot for job in self.jobs.values()}
        return next(n for n in range(1, self.options.jobs + 1) if n not in used)

    def _start(self, claim: Claim) -> None:
        try:
            job = Job(claim, self.spec, self._keeper(), slot=self._free_slot())
        except KeeperLost:
            # Nothing of the item runs without the keeper: give it back as if
            # never claimed, then stop (the run cannot watch its children).
            self.queue.store.release(claim, "not started: the keeper is gone", uncounted=True)
            raise
        except OSError as exc:
            if self._not_started(claim, exc):
                self._short_of_resources(exc)
            return
        self.jobs[job.token] = job
        self._store.handed_over(claim)  # the keeper has the claim lock: a frozen runner has not
        self._lease_backstop(job)
        self.summary.attempts += 1
        if self.options.timeout is not None:
            job.deadline = job.started + self.options.timeout
        job.watch_at = job.started + OUTPUT_WATCH_DELAY
        self.on_event(ItemStarted(claim))

    def _watch_output(self, job: Job) -> None:
        """Read ``job``'s pipes as output arrives (its start was a while ago)."""
        job.watch_at = None
        for fd in job.pipes:
            self._selector.watch(fd, job)

    def _verify_wanted(self, claim: Claim) -> bool:
        """Check --verify first for an item whose runner died mid-attempt, and
        with --verify-first for an item's very first run."""
        if self.verifier is None:
            return False
        return claim.interrupted or (self.options.verify_first and claim.attempt == 1)

    def _not_started(self, claim: Claim, exc: OSError) -> bool:
        """The command could not be started for ``claim``: the item fails,
        unless the runner was short of resources (then it goes back, uncounted,
        and this returns True: the caller lowers the concurrency once every
        such claim is back)."""
        if exc.errno in RESOURCE_ERRNOS:
            reason = f"not started: {exc.strerror or exc}"
            self.queue.store.release(claim, reason, uncounted=True)
            return True
        # Specific to this item (the program was checked before the run): e.g.
        # a program named by the item, or an argv too long.
        what = exc.filename or self.options.command[0]
        reason = f"cannot start command {what!r}: {exc.strerror or exc}"
        outcome = Outcome(ok=False, reason=reason)
        # The store records this as an attempt (an end record, attempt N), as
        # list, show and stats count it: the summary counts it the same way.
        self.summary.attempts += 1
        self.on_event(self._record(claim, outcome, None))
        return False

    def _short_of_resources(self, exc: OSError) -> None:
        """Run fewer items at once: as many as run now, which fit. With none
        running there is nothing to wait for: stop (the items stay pending)."""
        reason = exc.strerror or str(exc)
        if not self.jobs:
            raise ResourcesExhausted(f"cannot start any command: {reason}; {_SHORT_ADVICE}")
        if len(self.jobs) < self._concurrency:
            self._concurrency = len(self.jobs)
            self.on_event(
                Notice(f"warning: {reason}: running at most {self._concurrency} items at once")
            )

    def _verified(self, claim: Claim) -> bool:
        """Run --verify for ``claim``; on exit 0 record it done without running it.
        A broken script (exit 126/127) gives the item back and stops the run."""
        assert self.verifier is not None
        try:
            verdict, notes = self.verifier.check(claim, self._free_slot())
        except BaseException:
            self.queue.store.release(claim, "interrupted: the --verify script is broken")
            raise
        for text in notes:
            self.on_event(Notice(text, warning=True))
        if not verdict.done:
            return False
        if claim.interrupted:
            outcome = Outcome(ok=True, reason="verified: finished before its runner died")
        else:
            outcome = Outcome(ok=True, reason="verified before run")
        state = self.queue.finish(claim, outcome)
        self.summary.record(claim.item_id, state)
        self.summary.verified_ids.add(claim.item_id)
        self.on_event(ItemFinished(claim, outcome, state, verified=True))
        return True

    def _idle_wait(self) -> float | None:
        """How long to sleep with no child running, or None to end the run."""
        if not self._taking:
            return None
        scope = self._scope()
        if self.queue.store.is_paused() and (scope is None or scope):
            return FOLLOW_POLL  # `resume` lets this runner go on, without a restart
        due = self._next_retry(scope)
        if due is not None:
            return min(_until(due), IDLE_TICK)
        if self.options.follow and scope is None:
            return self._follow_poll
        return None

    def _next_retry(self, scope: set[int] | None) -> float | None:
        """When the next deferred retry this run may take comes due."""
        return self._store.next_due(scope)

    def _next_deadline(self) -> float:
        now = time.monotonic()
        wait = IDLE_TICK
        if self._taking and len(self.jobs) < self.options.jobs:
            # A free slot: look again soon for new items (--follow) or due retries.
            scope = self._scope()
            due = self._next_retry(scope)
            if due is not None:
                wait = min(wait, _until(due))
            if self.options.follow and scope is None:
                wait = min(wait, self._follow_poll)
        fence = self._store.fence_at()  # a lease that needs renewing soon (lease clock)
        if fence is not None and self.jobs:
            wait = min(wait, max(0.0, fence - lease_clock.now()))
        for job in self.jobs.values():
            for t in (job.deadline, job.kill_at, job.watch_at):
                if t is not None:
                    wait = min(wait, max(0.0, t - now))
        return wait

    def _fence(self) -> None:
        """Stop at once the children of claims whose lease this runner can
        no longer vouch for (promise 4 across hosts); nothing is recorded for them."""
        store = self._store
        if store.fence_at() is not None:
            for job in self.jobs.values():
                self._lease_backstop(job)
        lost = store.lost_claims()
        if not lost:
            return
        now = time.monotonic()
        grace = self.queue.store.fence_grace(self.options.grace)
        for job in self.jobs.values():
            if job.claim.token in lost:
                job.stop_reason = "fenced"
                job.signal_group(signal.SIGTERM)
                job.kill_at = now + grace
                text = (
                    f"item {job.claim.item_id}: lease lost (not renewed in time, or taken "
                    "over by another runner); its child is stopped and nothing is recorded"
                )
                self.on_event(Notice(text, warning=True))

    def _lease_backstop(self, job: Job) -> None:
        """Tell the keeper when ``job``'s lease ends as last renewed: it kills
        the child then even if this runner is frozen (SIGSTOP, a paused VM)."""
        at = self._store.kill_by(job.claim.token)
        if at is not None and at != job.lease_kill_at:
            job.lease_kill_at = at
            with contextlib.suppress(KeeperLost):
                job.keeper.deadline(job.token, at)

    def _keeper(self) -> Keeper:
        if self.keeper is None:
            # Started with the first child, not before; it is the parent of
            # every child, so nothing of an item ever runs unwatched.
            self.keeper = Keeper(self.queue.name, environ=self.spec.base_env)
            self._selector.watch(self.keeper.fileno(), _KEEPER)
        return self.keeper

    def _wait(self, timeout: float) -> bool:
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
                self._keeper().receive()  # exits, recorded in keeper.exits
                news = True
            elif job is _STORE_WAKE:
                self._store_wake.woke()  # the next pass of the loop claims
                news = True
            elif fd in job.pipes and not job.read(fd):
                self._selector.forget(fd)  # closing it takes it out of the epoll set
                job.close_pipe(fd)
        return news

    def _reap(self) -> None:
        now = time.monotonic()
        finished: list[Job] = []
        for job in self.jobs.values():
            if job.watch_at is not None and now >= job.watch_at and not job.exited():
                self._watch_output(job)
            if job.exited():
                finished.append(job)
            elif job.kill_at is not None and now >= job.kill_at:
                job.killed = True  # the grace ran out: said in the reason, and on stop
                job.signal_group(signal.SIGKILL)
            elif job.deadline is not None and now >= job.deadline and not job.stop_reason:
                job.stop_reason = "timeout"
                job.signal_group(signal.SIGTERM)
                job.grace = self.options.grace
                job.kill_at = now + self.options.grace
        if not finished:
            return
        results = []
        unstarted: list[tuple[Job, OSError]] = []
        for job in finished:
            if (error := job.spawn_error()) is not None:
                del self.jobs[job.token]
                self._forget_output(job)
                job.close()
                self.summary.attempts -= 1
                unstarted.append((job, error))
                continue
            if job.stop_reason:
                # Stopped or timed out: what is left of its process group (a
                # descendant that ignored TERM) must not outlive the attempt.
                job.signal_group(signal.SIGKILL)
            del self.jobs[job.token]
            self._forget_output(job)  # finish() closes the pipes
            results.append((job, job.finish()))
        self._record_batch(results)
        # Every claim that did not start goes back (or fails) before the run
        # may stop for want of resources: none may be left claimed.
        short = [error for job, error in unstarted if self._not_started(job.claim, error)]
        if short:
            self._short_of_resources(short[0])

    def _forget_output(self, job: Job) -> None:
        if job.watch_at is None:  # watched: pipes at end of file were forgotten already
            for fd in job.pipes:
                self._selector.forget(fd)

    def _record_batch(self, results: list[tuple[Job, Outcome]]) -> None:
        # Nothing is reported, and no slot refilled, before every end record is
        # fsynced. One result (always, with -j1) is written and fsynced in one
        # locked section; several share one fsync (group commit).
        store = self._store
        ended = []
        for job, outcome in results:
            for text in job.warnings:
                self.on_event(Notice(f"item {job.claim.item_id}: {text}", warning=True))
            if job.stop_reason == "stopped" and job.killed:
                self.summary.killed_on_stop += 1
            if job.stop_reason == "fenced":
                continue  # its lease is lost: the item is another runner's now
            if job.stop_reason == "stopped" and not outcome.ok:
                # Taken over: nothing to give back. Unreachable: left to recovery.
                with contextlib.suppress(ClaimLost, StoreUnreachable):
                    store.release(  # fsynced by release itself
                        job.claim, f"interrupted: runner stopped by signal {self._stop_signal}"
                    )
                self.summary.hand_back(job.claim.item_id)
                continue
            ended.append((job, outcome))
        self._unrecorded += ended
        self._record_owed(fuse=True)

    def _record_owed(self, *, fuse: bool = False) -> None:
        """Write the end records of ``_unrecorded``, then report them. The
        last one is written with the next claim in one locked section (with
        ``fuse``), whose fsync covers the others too (group commit). If the
        store cannot be reached, StoreUnreachable: what is left stays owed,
        and what was written waits to be synced (see ``_ride_out``)."""
        if not self._unrecorded and not self._owed_events:
            return
        if self._owed_events:  # written before an outage: durable (or redone) first
            self._store.sync()
        pending = self._unrecorded
        while pending:
            job, outcome = pending[0]
            last = len(pending) == 1
            event = self._record(job.claim, outcome, job, sync=last, fuse=fuse and last)
            del pending[0]
            self._owed_events.append(event)
        events, self._owed_events = self._owed_events, []
        for _ in events:
            CRASH.hit("recorded")  # test-only: die right after a durable result
        for event in events:
            self.on_event(event)

    def _record(
        self,
        claim: Claim,
        outcome: Outcome,
        job: Job | None,
        *,
        sync: bool = True,
        fuse: bool = False,
    ) -> RunEvent:
        """Write the end record of ``claim`` (fsynced when ``sync``); with
        ``fuse``, claim the next item in the same locked section and fsync
        (kept for ``_fill_slots``). The caller reports the event once the
        record is durable."""
        retry_at = None
        # --retries counts failures in this episode of the item's life (since
        # it was enqueued, retried by a user, or handed back on a stop), not
        # its attempts: runner crashes count against --max-crashes instead.
        if not outcome.ok and claim.failures < self.options.retries:
            retry_at = time.time() + self._backoff(claim.failures + 1)
        if job is not None:  # a store shared by hosts keeps the log (PostgreSQL)
            hand_over_log(self._store, claim, job.log_path)
        fused, scope = self._prefetch_scope() if fuse else (False, None)
        try:
            if fused:
                state, self._prefetched = self.queue.finish_and_claim(
                    claim,
                    outcome,
                    retry_at=retry_at,
                    runner=self.info,
                    on_interrupted=self.options.on_interrupted,
                    max_crashes=self.options.max_crashes,
                    among=scope,
                )
            else:
                state = self.queue.finish(claim, outcome, retry_at=retry_at, sync=sync)
        except ClaimLost:  # its lease expired and another runner took the item
            text = f"item {claim.item_id} was taken over by another runner; nothing recorded"
            return Notice(text, warning=True)
        self.summary.record(claim.item_id, state)
        if state is ItemState.FAILED and self.options.halt_on_failure:
            self._taking = False
        log = job.log_path if job is not None else None
        if job is not None and job.lease_kill_at is not None and state in _SETTLED:
            # Settled for good: a detached leftover of it may go on (keeper_process.py).
            with contextlib.suppress(KeeperLost):
                job.keeper.deadline(job.token, math.inf)
        return ItemFinished(claim, outcome, state, log_path=log, retries=self.options.retries)

    def _backoff(self, retry: int) -> float:
        """The wait before the ``retry``-th retry of this episode."""
        return backoff(retry, self.options.retry_delay, self.options.retry_max_delay)

    # -- stopping ------------------------------------------------------------------

    def _handle_stop(self) -> None:
        if self._stop_signal is None:
            return
        if self._taking:
            self._taking = False
            now = time.monotonic()
            for job in self.jobs.values():
                job.stop_reason = job.stop_reason or "stopped"
                job.signal_group(self._stop_signal)
                job.kill_at = now + self.options.grace
        if self._stop_count > 1:
            for job in self.jobs.values():
                job.killed = True
                job.signal_group(signal.SIGKILL)

    def _shutdown(self) -> None:
        """On an unexpected error: kill children and give their items back."""
        with contextlib.suppress(Exception):
            self._give_back_prefetched()
        for job in list(self.jobs.values()):
            job.signal_group(signal.SIGKILL)
            job.reap()
            job.close()
            # Best effort: if this fails too, recovery finds the item on the next run.
            with contextlib.suppress(Exception):
                self.queue.store.release(job.claim, "interrupted: runner stopped on an error")
        self.jobs.clear()

    def _warn_on_command_drift(self, earlier: list[list[str]]) -> None:
        if earlier and tuple(earlier[-1]) != self.options.command:
            self.on_event(
                Notice(
                    "warning: this queue was last run with a different command: "
                    f"{shlex.join(earlier[-1])!s} (now: {shlex.join(self.options.command)})"
                )
            )


@contextlib.contextmanager
def stop_when_short_of_resources() -> Iterator[None]:
    """Turn running out of fds, processes or memory anywhere in a run (opening
    the queue, the runner's own pipes and locks, not only a spawn) into
    ResourcesExhausted: one line and exit 10, not exit 6 ("a write or fsync
    failed"). What the run claimed was given back (``Runner.run`` on an error)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in RESOURCE_ERRNOS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        reason = exc.strerror or str(exc)
        raise ResourcesExhausted(f"cannot run: {reason}{where}; {_SHORT_ADVICE}") from None


def _until(due: float) -> float:
    """Seconds until a retry is due. One due already was not claimable just
    now: its claim is still held (by a detached leftover of its last attempt,
    or by the keeper about to let go), so look again soon, without spinning."""
    wait = due - time.time()
    return wait if wait > 0 else HELD_POLL


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
