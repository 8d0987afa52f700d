"""The runner: claim items, run the command for each, record every result.

One loop, no threads, asleep in one selector (output_watch.py) until a child
exits, a pipe fills, a signal comes or the nearest deadline (a timeout, a kill
after the grace, a retry due, a poll with ``follow``). The runner decides; the
result recorder (recorder.py), fencing (fencing.py), the --verify step
(verify_step.py) and, with --persistent, the worker pool (persistent.py) do the rest.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.api.queue import Queue
from statequeue.core.durations import format_duration
from statequeue.core.errors import KeeperLost, StoreUnreachable
from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, Outcome, RunnerInfo
from statequeue.run.checks import check_commands
from statequeue.run.events import (
    ItemStarted,
    Notice,
    RunEvent,
    RunSummary,
    paused_text,
    stopping_text,
)
from statequeue.run.fencing import Fencing
from statequeue.run.guard import STOPS, GuardLink
from statequeue.run.held_wait import HeldWait
from statequeue.run.jobs import Job, JobSpec, OutputSink
from statequeue.run.keeper import Keeper
from statequeue.run.local_keeper import LocalKeeper
from statequeue.run.options import RunOptions
from statequeue.run.outage import OUTAGE_TICK, Outage, outage_limit
from statequeue.run.output_watch import OutputWatch
from statequeue.run.pacing import until_due
from statequeue.run.pipes import PipeStock
from statequeue.run.recorder import NOT_STARTED, ResultRecorder
from statequeue.run.registration import register_run, unregister_run
from statequeue.run.resources import RESOURCE_ERRNOS, lowered_concurrency
from statequeue.run.stopping import close_children, forward_stop, give_back_all
from statequeue.run.verify_step import VerifyStep
from statequeue.run.wakeup import follow_poll

if TYPE_CHECKING:
    from statequeue.run.persistent import WorkerPool

__all__ = ["Runner"]

FOLLOW_POLL = 0.25  # seconds between checks for new items while following
IDLE_TICK = 1.0
WAIT_SAID_FROM = 1.0
"""Seconds of waiting for a retry's due time from which a run says so (once)."""


class Runner:
    """Runs ``options.command`` for the items of ``queue``."""

    def __init__(
        self,
        queue: Queue,
        options: RunOptions,
        *,
        on_event: Callable[[RunEvent], None] | None = None,
        live: OutputSink | None = None,
        guard: GuardLink | None = None,
    ) -> None:
        self.queue = queue
        self.guard = guard  # the CLI's shape (guard.py): we start each child ourselves
        # Taken once: ``queue.store`` checks the pid on every use (a syscall per item).
        self._store = queue.store
        self.options = options
        self._sink = on_event or (lambda event: None)
        # Every event goes out through _emit: after the results the recorder
        # holds back until the next child is started (order kept).
        self.on_event = self._emit
        self.info: RunnerInfo = new_runner(command=options.shown_command, guarded=guard is not None)
        folder = queue.path or Path(".")
        self.spec = JobSpec(
            template=options.command,
            queue=queue.name,
            log_dir=folder / "logs",
            log_dir_fd=queue.store.logs_fd,
            log_limit=options.log_limit,
            item_on_stdin=options.item_on_stdin,
            live=live,
            # -j1 only: with one slot the next start waits on them; with more,
            # other children run meanwhile, and spare fds would count against
            # a tight fd limit (the run lowers its concurrency instead).
            pipes=PipeStock() if options.jobs == 1 else None,
        )
        self.summary = RunSummary()
        self.verify = VerifyStep(
            queue,
            options,
            self.spec,
            self.summary,
            self.on_event,
            stopping=lambda: self._stop_signal is not None,
            on_broken=self._stop_taking,
        )
        self.jobs: dict[int, Job] = {}  # by the keeper's token (a pid may be reused)
        self._concurrency = options.jobs  # lowered when spawning runs short of resources
        self._stop_signal: int | None = None
        self._stop_count = 0
        self._stop_forwarded = False
        self._taking = True
        self._taken: set[int] = set()  # with --limit only: a run must not grow per item
        self._max_time_at: float | None = None  # monotonic time --max-time runs out
        self._said_paused = False  # the wait for `resume` was announced
        self._said_waiting = False  # the wait for a retry's due time was announced
        self._drift = ""  # "last run with a different command": said at the first attempt
        self.recorder = ResultRecorder(
            queue,
            options,
            self.info,
            self.summary,
            self.on_event,
            fuse_scope=self._prefetch_scope,
            on_halt=self._stop_taking,
        )
        self.fencing = Fencing(queue, options.grace, self.on_event)
        self.keeper: Keeper | None = None
        self._watch = OutputWatch(queue.store)
        self._held = HeldWait(queue.store, self.on_event)  # says what a held claim waits for
        self._follow_poll = follow_poll()
        self.workers: WorkerPool | None = None
        if options.persistent:
            from statequeue.run.persistent import WorkerPool  # lazy: start-up (--persistent only)

            self.workers = WorkerPool.for_run(self.spec, options, self._stop_taking)
        if guard is not None:  # the keeper's death wakes the loop (it stops: _pass)
            guard.wake = self._watch.wake

    # -- signals ---------------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """Stop taking items and stop the children (safe from a signal handler).

        The first call forwards ``signum`` to every child's process group and
        gives them ``grace`` seconds; a second call kills them at once.
        """
        self._stop_count += 1
        if self._stop_signal is None:
            self._stop_signal = signum
        self._watch.wake()

    def install_signal_handlers(self) -> None:
        """Route SIGINT, SIGTERM and SIGHUP (main thread only): the children's
        own sessions hear a closed terminal only this way, with --grace."""
        for sig in STOPS:
            signal.signal(sig, lambda signum, frame: self.request_stop(signum))

    # -- main loop ---------------------------------------------------------------

    def run(self) -> RunSummary:
        """Run until no item is left (or --limit, --max-time, a signal, a broken
        --verify: VerifyBroken). CommandNotFound, nothing claimed, for a missing command."""
        opts = self.options
        shell = opts.given_command[-1] if opts.given_command else ""  # run --shell's words
        check_commands(opts.command, opts.verify, self.spec.base_env, shell=shell)
        store = self.queue.store
        # Before this run's first record: on a full disk it frees the room
        # to give the items in flight back (give_back_all).
        store.keep_space_reserve()
        self._drift = register_run(
            self.queue, self.info, self.options, self.guard, self.on_event, self.summary
        )
        if self.options.max_time is not None:
            self._max_time_at = time.monotonic() + self.options.max_time
        failure: BaseException | None = None
        try:
            self._loop()
            if self.verify.broken is not None:  # once the items in flight have ended
                raise self.verify.broken
        except BaseException as exc:
            failure = exc  # what stopped the run decides how its items go back
            raise
        finally:
            self._report_ready()
            with contextlib.suppress(Exception):  # best effort: its lock dies with us anyway
                self.queue.unreserve()
            # In flight, or ended with its result not recorded: they run again.
            cut = [*self.jobs.values(), *(job for job, _ in self.recorder.unrecorded)]
            self.summary.cut_short.update(job.claim.item_id for job in cut)
            # Written, but the fsync meant to cover them failed (or never came).
            self.summary.cut_short.update(item for item, _, _ in self.recorder.unsynced)
            give_back_all(self.jobs, store, self.recorder, self.keeper, failure)
            close_children(self.workers, self.keeper, self.guard, self.options.grace)
            unregister_run(store, self.info)
            self._watch.close()
            if self.spec.pipes is not None:
                self.spec.pipes.close()
        self.summary.ended(self._store, self._stop_signal)
        return self.summary

    def _out_of_time(self) -> bool:  # --max-time has run out
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
        run out meanwhile (outage.py). True once it answers again;
        False if a signal stopped the run meanwhile (its children have ended).
        StoreUnreachable once the run gives up."""
        self.on_event(Notice(outage.start_text(), warning=True))
        while True:
            outage.check(time.monotonic(), out_of_time=self._out_of_time())
            self._handle_stop()
            self._fence()
            with contextlib.suppress(StoreUnreachable):  # their results wait in the recorder
                self._reap()
            if self._stop_signal is not None:
                if not self.jobs:
                    self.recorder.drop_owed()
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
        if self.guard is not None and GuardLink.lost:
            raise KeeperLost()  # nothing would keep promise 4 after our death: stop
        self._handle_stop()
        self.recorder.record_owed()
        if self._taking and self._out_of_time():
            self._taking = False
            self.summary.out_of_time = True
            self.on_event(Notice("--max-time reached: taking no new items"))
        if self.options.follow:
            # Listening before claiming: work added after this claim
            # finds nothing still wakes the runner.
            self._watch.watch_store()
        if self._taking:
            self._fill_slots()
        if self.workers is not None:  # stops if they die at start; figures for `status`
            self.workers.tend(self._store, self.info.runner_id)
        self.recorder.give_back_prefetched()
        if not self._taking or self._stop_signal is not None:
            self.queue.unreserve()
        if not self.jobs:
            wait = self._idle_wait()
            if wait is None:
                return False
        else:
            wait = self._next_deadline()
        until = time.monotonic() + wait
        while not self._wait(wait):
            # Only children's output came: wait on for what it was waiting
            # for (a child's exit comes from the keeper, after its pipes' EOF).
            wait = until - time.monotonic()
            if wait <= 0:
                break
        self._fence()
        self._reap()
        return True

    def _scope(self) -> set[int] | None:
        """Which items this run may still claim: None for any, else only these
        (with --limit reached, just retries of the items it already took)."""
        limit = self.options.limit
        if limit is None or len(self._taken) < limit:
            return None
        return self._taken - {job.claim.item_id for job in self.jobs.values()}

    def _fill_slots(self) -> None:
        while len(self.jobs) < self.recorder.pacing.slots(self._concurrency) and self._taking:
            scope = self._scope()
            if (scope is not None and not scope) or not self.recorder.pacing.may_start():
                return
            try:
                claim = self.recorder.take_prefetched() or self.queue.claim(
                    self.info,
                    on_interrupted=self.options.recovery_policy,
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
            if self.options.limit is not None:
                self._taken.add(claim.item_id)
            checked = self.verify.wanted(claim)
            if checked and self.verify.verified(claim, self._free_slot()):
                continue
            if self._stop_signal is not None:  # a signal came during the claim or --verify
                if checked:  # its --verify hook ran: an attempt of it, stopped
                    reason = f"interrupted: runner stopped by signal {self._stop_signal}"
                    self.queue.store.release(claim, reason)
                    self.summary.hand_back(claim.item_id)
                else:  # nothing of it ran: as if never claimed (recorder.give_back_prefetched)
                    self.queue.store.release(claim, NOT_STARTED, uncounted=True)
                return
            self._start(claim)

    def _prefetch_scope(self, *, reserving: bool = False) -> tuple[bool, set[int] | None]:
        """Whether a result may be recorded together with the next claim (a
        slot is free and the run goes on), and the ids that claim may take;
        ``reserving``: whether that claim may be made ready now (every slot busy)."""
        if (
            not self._taking
            or self._stop_signal is not None
            or self.options.halt_on_failure  # this very result may stop the run
            or self.recorder.pacing.limited  # each start is taken from the rate first
            or self.recorder.prefetched is not None
            or (len(self.jobs) >= self._concurrency and not reserving)
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
            if self.workers is not None:
                job: Job = self.workers.attempt(claim, self._keeper(), self._free_slot())
            else:
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
        self._said_waiting = False  # a later wait for a retry is said again
        self._store.handed_over(claim)  # the keeper has the claim lock: a frozen runner has not
        self.fencing.backstop(job)
        self.summary.attempts += 1
        if self.options.timeout is not None:
            job.deadline = job.started + self.options.timeout
        self._watch.started(job)
        self._say_drift()
        self.on_event(ItemStarted(claim))
        if self.spec.pipes is not None:  # the next child's, now that this one runs
            self.spec.pipes.refill()
        workers = self.workers
        if workers is not None and workers.reserving and len(self.jobs) >= self._concurrency:
            # Every worker busy with short items: the item the next claim would take is
            # held ready while they work (Store.reserve), so that claim needs no search.
            may, scope = self._prefetch_scope(reserving=True)
            if may:
                with contextlib.suppress(OSError):  # the claim meets it again, and handles it
                    self.queue.reserve(among=scope)

    def _say_drift(self) -> None:
        """Once, at the first attempt: the queue was last run with another
        command (not said by a run that has nothing to do)."""
        if self._drift:
            self.on_event(Notice(self._drift))
            self._drift = ""

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
        self._say_drift()
        self.on_event(self.recorder.record(claim, outcome, None))
        return False

    def _short_of_resources(self, exc: OSError) -> None:
        """Run fewer items at once (resources.py): as many as truly started."""
        started = sum(not job.start_failed() for job in self.jobs.values())
        now = lowered_concurrency(exc, started, self._concurrency, jobs=self.options.jobs)
        self._concurrency, warning = now
        if warning:
            self.on_event(Notice(warning))

    def _idle_wait(self) -> float | None:
        """How long to sleep with no child running, or None to end the run."""
        if not self._taking:
            return None
        scope = self._scope()
        if self.queue.store.is_paused() and (scope is None or scope):
            if not self._said_paused:  # once per pause: a silent wait looks like a hang
                self._said_paused = True
                self.on_event(Notice(paused_text(self.queue.name)))
            return FOLLOW_POLL  # `resume` lets this runner go on, without a restart
        self._said_paused = False
        for text in self.queue.store.notices():  # e.g. recovery waits for a lock: said
            self.on_event(Notice(text, warning=True))
        return self._look_again(scope)

    def _look_again(self, scope: set[int] | None) -> float | None:
        """With a slot free, when to look again (None: no need): at the next
        deferred retry this run may take, or its next start under --rate
        (pacing.py), and every poll with --follow."""
        next_due = self._held.next_due(scope)
        if next_due is not None:
            self._say_waiting(next_due, scope)
        due = self.recorder.pacing.due(next_due)
        if (said := self.recorder.pacing.wait_notice()) is not None:
            self.on_event(Notice(said))
        wait = None if due is None else min(until_due(due), IDLE_TICK)
        if self.options.follow and scope is None:
            wait = self._follow_poll if wait is None else min(wait, self._follow_poll)
        return wait

    def _say_waiting(self, due: float, scope: set[int] | None) -> None:
        """Once per wait (again after an item started): no item is due, and
        the run waits for a retry's backoff (up to 5 min) or a deferral;
        silent, it would look hung."""
        left = due - time.time()
        if self._said_waiting or left < WAIT_SAID_FROM:
            return
        self._said_waiting = True
        count, _ = self.queue.store.retry_waiting()
        if scope is not None:
            count = min(count, len(scope))
        items = f"{max(count, 1)} item" + ("" if max(count, 1) == 1 else "s")
        in_ = format_duration(math.ceil(left))
        self.on_event(Notice(f"waiting for {items} due in {in_} (retry backoff or deferral)"))

    def _next_deadline(self) -> float:
        now = time.monotonic()
        wait = IDLE_TICK
        free = self._taking and len(self.jobs) < self.options.jobs
        if free and (again := self._look_again(self._scope())) is not None:
            wait = min(wait, again)
        fence = self.fencing.wait_bound()  # a lease that needs renewing soon (lease clock)
        if fence is not None and self.jobs:
            wait = min(wait, fence)
        for job in self.jobs.values():
            if (t := job.next_time()) is not None:
                wait = min(wait, max(0.0, t - now))
        return wait

    def _fence(self) -> None:
        self.fencing.fence(self.jobs.values())

    def _keeper(self) -> Keeper:
        if self.keeper is None:  # with the first child, not before: nothing runs unwatched
            env = self.spec.base_env
            if self.guard is None:
                self.keeper = Keeper(self.queue.name, environ=env)
            else:  # under a guard, this process starts the children
                self.keeper = LocalKeeper(self.queue.name, environ=env, guard=self.guard)
            self._watch.watch_keeper(self.keeper)
        return self.keeper

    def _wait(self, timeout: float) -> bool:
        if self.recorder.ready:  # nothing is held back while the loop sleeps
            self._report_ready()
        return self._watch.wait(timeout)

    def _emit(self, event: RunEvent) -> None:
        """Report ``event``, after the results still held back (recorder.py: a
        result is reported once the next child is started, off that child's path)."""
        if self.recorder.ready:
            self._report_ready()
        self._sink(event)

    def _report_ready(self) -> None:
        for event in self.recorder.take_ready():
            self._sink(event)

    def _reap(self) -> None:
        if self.keeper is not None:
            self.keeper.tend()
        self.verify.reap_leftovers(self.keeper)  # what --verify hooks left in the background
        now = time.monotonic()
        finished: list[Job] = []
        for job in self.jobs.values():
            if job.watch_at is not None and now >= job.watch_at and not job.exited():
                self._watch.watch_output(job)
            if job.exited():
                finished.append(job)
            else:
                job.enforce_times(now, self.options.grace)
        if not finished:
            return
        results = []
        unstarted: list[tuple[Job, OSError]] = []
        for job in finished:
            if (error := job.spawn_error()) is not None:
                del self.jobs[job.token]
                self._watch.forget_output(job)
                job.close()
                self.summary.attempts -= 1
                unstarted.append((job, error))
                continue
            if job.stop_reason:  # stopped or timed out: nothing of it may live on
                job.cut()
            del self.jobs[job.token]
            self._watch.forget_output(job)  # finish() closes the pipes
            outcome = job.finish()
            if (
                not (job.stop_reason or outcome.ok)
                and job.process_per_attempt
                and self.queue.store.has_leases
            ):
                # A failed attempt's item may run again (a retry, a deferral,
                # `retry`), here or on another host: with leases its claim is
                # no lock that attempt waits for (a new token; another host
                # sees no lock of ours), so nothing of this one may outlive
                # it. A detached leftover ran beside the retry until the
                # old lease's fencing killed it.
                job.cut()
            results.append((job, outcome))
        if self.workers is not None:  # what its `reserving` asks
            self.workers.attempts_ended([outcome.duration for _, outcome in results])
        self.recorder.record_batch(results, self._stop_signal)
        # Every claim not started goes back (or fails) first: none left claimed.
        short = [error for job, error in unstarted if self._not_started(job.claim, error)]
        if short:
            self._short_of_resources(short[0])

    # -- stopping ------------------------------------------------------------------

    def _stop_taking(self) -> None:
        """A failure with --halt-on-failure (or broken workers): the run takes no new item."""
        self._taking = False

    def _handle_stop(self) -> None:
        if self._stop_signal is None:
            return
        # Forwarded once, even when the run had stopped taking items already
        # (--max-time, --halt-on-failure): its children must hear it too.
        first, self._stop_forwarded = not self._stop_forwarded, True
        self._taking = False
        if first:  # said at once: the wait for --grace may be long
            text = stopping_text(self._stop_signal, len(self.jobs), self.options.grace)
            self.on_event(Notice(text, stopping=True))
        forward_stop(
            self.jobs.values(),
            self._stop_signal,
            self.options.grace,
            first=first,
            hard=self._stop_count > 1,
        )
