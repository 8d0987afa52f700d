"""The runner: claim items, run the command for each, record every result.

One loop, no threads: it waits on the keeper's socket (which reports the
children's exits), the children's pipes, a wakeup pipe for signals, and the
nearest deadline (a timeout, a kill after the grace period, a retry coming
due, a poll for new items with ``follow``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import selectors
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from statequeue.errors import ResourcesExhausted, UsageError
from statequeue.fileio import CRASH
from statequeue.identity import new_runner
from statequeue.jobs import Job, JobSpec, OutputSink, build_argv, child_env
from statequeue.keeper import Keeper
from statequeue.models import (
    Claim,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.queue import Queue

FOLLOW_POLL = 0.25  # seconds between checks for new items while following
IDLE_TICK = 1.0
HELD_POLL = 0.02  # seconds between claim attempts on a due retry whose claim is held
VERIFY_TIMEOUT = 600.0
# Spawn errors that say the runner (or the machine) is short of something,
# not that the item's command is wrong: the item is given back, uncounted.
# ENOBUFS and ETOOMANYREFS: passing the child's fds to the keeper failed.
RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOBUFS, errno.ETOOMANYREFS}
)
_KEEPER = object()  # selector tag of the keeper's socket


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
    verify: tuple[str, ...] = ()
    limit: int | None = None
    max_time: float | None = None
    follow: bool = False
    halt_on_failure: bool = False
    single: bool = False
    item_on_stdin: bool = False
    log_limit: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no command given: use `statequeue run -- COMMAND [ARG]...`")
        if self.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if self.retries < 0 or self.max_crashes < 1:
            raise UsageError("--retries must be >= 0 and --max-crashes >= 1")
        if self.limit is not None and self.limit < 0:
            raise UsageError("--limit must be >= 0")


@dataclass(frozen=True)
class ItemStarted:
    claim: Claim


@dataclass(frozen=True)
class ItemFinished:
    claim: Claim
    outcome: Outcome
    state: ItemState
    log_path: Path | None = None
    verified: bool = False


@dataclass(frozen=True)
class Notice:
    """Something the user should read (a warning, a recovery)."""

    text: str


RunEvent = ItemStarted | ItemFinished | Notice


@dataclass
class RunSummary:
    """What one ``run`` did."""

    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    verified: int = 0
    released: int = 0
    stopped_by: int | None = None

    @property
    def settled(self) -> int:
        return self.succeeded + self.failed + self.verified


def parse_verify(command: str) -> tuple[str, ...]:
    """Split a --verify command as a shell would (no shell runs it)."""
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise UsageError(f"invalid --verify command: {exc}") from None
    if not argv:
        raise UsageError("--verify needs a command")
    return argv


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
        self.options = options
        self.on_event = on_event or (lambda event: None)
        self.info: RunnerInfo = new_runner(command=options.command)
        folder = queue.path or Path(".")
        self.spec = JobSpec(
            template=options.command,
            queue=queue.name,
            log_dir=folder / "logs",
            log_limit=options.log_limit,
            item_on_stdin=options.item_on_stdin,
            live=live,
        )
        self.summary = RunSummary()
        self.jobs: dict[int, Job] = {}  # by the keeper's token (a pid may be reused)
        self._concurrency = options.jobs  # lowered when spawning runs short of resources
        self._stop_signal: int | None = None
        self._stop_count = 0
        self._taking = True
        self._taken: set[int] = set()
        self.keeper: Keeper | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)

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
        store = self.queue.store
        earlier = store.commands()
        store.register_runner(self.info, exclusive=self.options.single)
        self._warn_on_command_drift(earlier)
        deadline = None
        if self.options.max_time is not None:
            deadline = time.monotonic() + self.options.max_time
        try:
            self._loop(deadline)
        finally:
            self._shutdown()
            if self.keeper is not None:
                # The keeper exits, or stays until a detached leftover of an
                # item has ended, holding that item's claim.
                self.keeper.close()
            store.unregister_runner(self.info.runner_id)
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
        self.summary.stopped_by = self._stop_signal
        return self.summary

    def _loop(self, deadline: float | None) -> None:
        while True:
            self._handle_stop()
            if self._taking and deadline is not None and time.monotonic() >= deadline:
                self._taking = False
                self.on_event(Notice("--max-time reached: taking no new items"))
            if self._taking:
                self._fill_slots()
            if not self.jobs:
                wait = self._idle_wait()
                if wait is None:
                    return
            else:
                wait = self._next_deadline()
            self._wait(wait)
            self._reap()

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
                claim = self.queue.claim(
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
            if claim.interrupted and self.options.verify and self._verified(claim):
                continue
            if self._stop_signal is not None:  # a signal arrived during --verify
                self.queue.store.release(claim, "interrupted: runner stopped by a signal")
                self.summary.released += 1
                return
            self._start(claim)

    def _start(self, claim: Claim) -> None:
        try:
            job = Job(claim, self.spec, self._keeper())
        except OSError as exc:
            self._not_started(claim, exc)
            return
        self.jobs[job.token] = job
        self.summary.started += 1
        if self.options.timeout is not None:
            job.deadline = job.started + self.options.timeout
        for fd in job.pipes:
            self._selector.register(fd, selectors.EVENT_READ, job)
        self.on_event(ItemStarted(claim))

    def _not_started(self, claim: Claim, exc: OSError) -> None:
        """The command could not be started for ``claim``: the item fails,
        unless the runner was short of resources (then it goes back, uncounted)."""
        if exc.errno in RESOURCE_ERRNOS:
            reason = f"not started: {exc.strerror or exc}"
            self.queue.store.release(claim, reason, uncounted=True)
            self._short_of_resources(exc)
            return
        outcome = Outcome(ok=False, reason=f"cannot start command: {exc.strerror or exc}")
        self.on_event(self._record(claim, outcome, None))

    def _short_of_resources(self, exc: OSError) -> None:
        """Run fewer items at once: as many as run now, which fit. With none
        running there is nothing to wait for: stop (the items stay pending)."""
        reason = exc.strerror or str(exc)
        if not self.jobs:
            raise ResourcesExhausted(
                f"cannot start any command: {reason}; stopped, the items stay pending "
                "(raise the limit, e.g. `ulimit -n`, or lower --jobs)"
            )
        if len(self.jobs) < self._concurrency:
            self._concurrency = len(self.jobs)
            self.on_event(
                Notice(f"warning: {reason}: running at most {self._concurrency} items at once")
            )

    def _verified(self, claim: Claim) -> bool:
        """Run --verify for an interrupted item; on exit 0 record it done.

        The hook runs in its own process group and is waited for in small
        steps, so a signal to the runner stops it too.
        """
        import subprocess

        argv = build_argv(self.options.verify, claim.item)
        result = str(self.spec.log_dir / f"{claim.item_id}.verify")
        env = child_env(claim, self.queue.name, result, self.spec.base_env)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                pass_fds=claim.inherit_fds,
            )
        except OSError as exc:
            self.on_event(Notice(f"item {claim.item_id}: --verify could not run: {exc}"))
            return False
        limit = time.monotonic() + (self.options.timeout or VERIFY_TIMEOUT)
        while (code := _wait_step(proc)) is None:
            if self._stop_signal is not None or time.monotonic() >= limit:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if self._stop_signal is None:
                    self.on_event(Notice(f"item {claim.item_id}: --verify timed out"))
                return False
        if code != 0:
            return False
        outcome = Outcome(ok=True, reason="verified: finished before its runner died")
        state = self.queue.finish(claim, outcome)
        self.summary.verified += 1
        self.on_event(ItemFinished(claim, outcome, state, verified=True))
        return True

    def _idle_wait(self) -> float | None:
        """How long to sleep with no child running, or None to end the run."""
        if not self._taking:
            return None
        state = self.queue.store.state
        scope = self._scope()
        if state.paused and (scope is None or scope):
            return FOLLOW_POLL  # `resume` lets this runner go on, without a restart
        due = self._next_retry(scope)
        if due is not None:
            return min(_until(due), IDLE_TICK)
        if self.options.follow and scope is None:
            return FOLLOW_POLL
        return None

    def _next_retry(self, scope: set[int] | None) -> float | None:
        """When the next deferred retry this run may take comes due."""
        state = self.queue.store.state
        if scope is None:
            return state.next_due()
        waits = [
            item.not_before
            for i in scope
            if (item := state.items.get(i)) is not None and item.state.value == "pending"
        ]
        return min(waits) if waits else None

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
                wait = min(wait, FOLLOW_POLL)
        for job in self.jobs.values():
            for t in (job.deadline, job.kill_at):
                if t is not None:
                    wait = min(wait, max(0.0, t - now))
        return wait

    def _keeper(self) -> Keeper:
        if self.keeper is None:
            # Started with the first child, not before; it is the parent of
            # every child, so nothing of an item ever runs unwatched.
            self.keeper = Keeper(self.queue.name)
            self._selector.register(self.keeper.fileno(), selectors.EVENT_READ, _KEEPER)
        return self.keeper

    def _wait(self, timeout: float) -> None:
        for key, _ in self._selector.select(timeout):
            job = key.data
            if job is None:
                _drain_pipe(self._wake_r)
            elif job is _KEEPER:
                self._keeper().receive()  # exits, recorded in keeper.exits
            elif key.fd in job.pipes and not job.read(key.fd):
                self._selector.unregister(key.fd)
                job.close_pipe(key.fd)

    def _reap(self) -> None:
        now = time.monotonic()
        finished: list[Job] = []
        for job in self.jobs.values():
            if job.exited():
                finished.append(job)
            elif job.kill_at is not None and now >= job.kill_at:
                job.signal_group(signal.SIGKILL)
            elif job.deadline is not None and now >= job.deadline and not job.stop_reason:
                job.stop_reason = "timeout"
                job.signal_group(signal.SIGTERM)
                job.kill_at = now + self.options.grace
        if not finished:
            return
        results = []
        unstarted: list[tuple[Job, OSError]] = []
        for job in finished:
            if (error := job.spawn_error()) is not None:
                del self.jobs[job.token]
                for fd in job.pipes:
                    self._selector.unregister(fd)
                job.close()
                self.summary.started -= 1
                unstarted.append((job, error))
                continue
            if job.stop_reason:
                # Stopped or timed out: what is left of its process group (a
                # descendant that ignored TERM) must not outlive the attempt.
                job.signal_group(signal.SIGKILL)
            del self.jobs[job.token]
            for fd in job.pipes:  # pipes at end of file were unregistered already
                self._selector.unregister(fd)
            results.append((job, job.finish()))
        self._record_batch(results)
        # After the batch: this may stop the run (no child could start).
        for job, error in unstarted:
            self._not_started(job.claim, error)

    def _record_batch(self, results: list[tuple[Job, Outcome]]) -> None:
        # Nothing is reported, and no slot refilled, before every end record is
        # fsynced. One result (always, with -j1) is written and fsynced in one
        # locked section; several share one fsync (group commit).
        store = self.queue.store
        ended = []
        for job, outcome in results:
            if job.stop_reason == "stopped" and not outcome.ok:
                store.release(  # fsynced by release itself
                    job.claim, f"interrupted: runner stopped by signal {self._stop_signal}"
                )
                self.summary.released += 1
                continue
            ended.append((job, outcome))
        single = len(ended) == 1
        events = [self._record(job.claim, outcome, job, sync=single) for job, outcome in ended]
        if len(ended) > 1:
            store.sync()
        for _ in events:
            CRASH.hit("recorded")  # test-only: die right after a durable result
        for event in events:
            self.on_event(event)

    def _record(
        self, claim: Claim, outcome: Outcome, job: Job | None, *, sync: bool = True
    ) -> ItemFinished:
        """Write the end record of ``claim`` (fsynced when ``sync``); the
        caller reports the event once the record is durable."""
        retry_at = None
        if not outcome.ok and claim.attempt <= self.options.retries:
            retry_at = time.time() + self._backoff(claim.attempt)
        state = self.queue.finish(claim, outcome, retry_at=retry_at, sync=sync)
        if state is ItemState.DONE:
            self.summary.succeeded += 1
        elif state is ItemState.PENDING:
            self.summary.retried += 1
        else:
            self.summary.failed += 1
            if self.options.halt_on_failure and self._taking:
                self._taking = False
        log = job.log_path if job is not None else None
        return ItemFinished(claim, outcome, state, log_path=log)

    def _backoff(self, attempt: int) -> float:
        growth = 2.0 ** (attempt - 1)
        base = min(self.options.retry_max_delay, self.options.retry_delay * growth)
        return base * random.uniform(0.5, 1.0)  # jitter, not security

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
                job.signal_group(signal.SIGKILL)

    def _shutdown(self) -> None:
        """On an unexpected error: kill children and give their items back."""
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


def _wait_step(proc: Any) -> int | None:
    """Wait up to 50 ms for ``proc``; its exit code, or None if it still runs."""
    import subprocess

    try:
        code: int = proc.wait(timeout=0.05)
    except subprocess.TimeoutExpired:
        return None
    return code


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
