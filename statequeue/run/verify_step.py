"""The --verify step of a run: ask the user's script before an item runs again.

An item whose runner died mid-attempt (and, with --verify-first, every item's
first run) is checked first; on exit 0 it is recorded done without running
(promise 3: none of the in-flight items re-run where a verify hook says they
finished). Apart from the runner, which only asks whether a claim was settled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from statequeue.api.queue import Queue
from statequeue.core.errors import VerifyBroken
from statequeue.core.models import (
    VERIFIED_AFTER_CRASH,
    VERIFIED_BEFORE_RUN,
    Claim,
    ItemState,
    OnInterrupted,
    Outcome,
)
from statequeue.run.checks import Verifier
from statequeue.run.events import ItemFinished, Notice, RunEvent, RunSummary
from statequeue.run.jobs import JobSpec
from statequeue.run.options import RunOptions
from statequeue.run.orphans import is_subreaper, reap_adopted

if TYPE_CHECKING:
    from statequeue.run.keeper import Keeper

__all__ = ["VERIFY_TIMEOUT", "VerifyStep"]

VERIFY_TIMEOUT = 600.0


class VerifyStep:
    """Runs --verify for the claims that want it, and records those it finds done."""

    def __init__(
        self,
        queue: Queue,
        options: RunOptions,
        spec: JobSpec,
        summary: RunSummary,
        on_event: Callable[[RunEvent], None],
        *,
        stopping: Callable[[], bool],
        on_broken: Callable[[], None] = lambda: None,
    ) -> None:
        self.queue = queue
        self.broken: VerifyBroken | None = None
        """Set when the script could not run on an item: the run takes no new
        item, lets those in flight end, and raises it at its end."""
        self._on_broken = on_broken
        self._stopping = stopping
        self.options = options
        self.summary = summary
        self.on_event = on_event
        self.verifier: Verifier | None = None
        self._leftovers = False  # a check's leftover may be ours to reap (reap_leftovers)
        if options.verify:
            self.verifier = Verifier(
                script=options.verify,
                queue=queue.name,
                result_dir=str(spec.log_dir),
                base_env=spec.base_env,
                timeout=options.timeout or VERIFY_TIMEOUT,
                stopping=stopping,
                log_dir_fd=spec.log_dir_fd,
            )

    def wanted(self, claim: Claim) -> bool:
        """Check --verify first for an item whose runner died mid-attempt, and
        with --verify-first for an item's very first run."""
        if self.verifier is None:
            return False
        return claim.interrupted or (self.options.verify_first and claim.attempt == 1)

    def verified(self, claim: Claim, slot: int) -> bool:
        """Run --verify for ``claim`` (in job slot ``slot``); on exit 0 record it
        done without running it (True: not to be started). A broken script
        (exit 126/127) gives the item back and stops the run taking items (``broken``)."""
        assert self.verifier is not None
        self._leftovers = self._leftovers or is_subreaper()
        try:
            # A check is no attempt of the command: if the runner dies during
            # it, the item goes back uncounted, with no crash (Store.check_starts).
            self.queue.store.check_starts(claim)
            verdict, notes = self.verifier.check(claim, slot)
        except VerifyBroken as exc:
            # Nothing of the item ran: as if it had never been claimed, so the
            # next run (script fixed) counts no attempt and still verifies it first.
            self.queue.store.release(
                claim, "not started: the --verify script is broken", uncounted=True
            )
            # The items in flight end as they would (their results are kept);
            # nothing new starts, and the run then stops with this error.
            self.broken = exc
            self._on_broken()
            return True
        except BaseException:
            self.queue.store.release(claim, "interrupted: the --verify check did not complete")
            raise
        for text, warning in notes:
            self.on_event(Notice(text, warning=warning))
        if not verdict.done:
            # A check stopped by a signal decided nothing: the item is not
            # settled by the policy (the runner gives it back). One that timed
            # out is taken as not done: under fail or hold the item must not run.
            if self._stopping():
                return False
            if self._settled_by_policy(claim):
                return True
            self._command_starts(claim)
            return False
        if claim.interrupted:
            outcome = Outcome(ok=True, reason=VERIFIED_AFTER_CRASH)
        else:
            outcome = Outcome(ok=True, reason=VERIFIED_BEFORE_RUN)
        state = self.queue.finish(claim, outcome)
        self.summary.record(claim.item_id, state)
        self.summary.verified += 1
        self.on_event(ItemFinished(claim, outcome, state, verified=True))
        return True

    def reap_leftovers(self, keeper: Keeper | None) -> None:
        """Reap the processes the checks left in the background that have
        ended since: the runner, a subreaper (orphans.py), adopted them, and
        nothing else waits for them. Never the keeper process, which the
        runner waits for by pid. Looked for only while one may live."""
        if self._leftovers:
            own = () if keeper is None or keeper.in_process else (keeper.pid,)
            self._leftovers = reap_adopted(own)

    def _command_starts(self, claim: Claim) -> None:
        """The check is over and the command starts: from now on the runner's
        death is a crash of the item (Store.check_ends). If that cannot be
        recorded, the item goes back and the error stops the run."""
        try:
            self.queue.store.check_ends(claim)
        except BaseException:
            with contextlib.suppress(Exception):  # the error that stops the run is the first
                self.queue.store.release(claim, "interrupted: the --verify check did not complete")
            raise

    def _settled_by_policy(self, claim: Claim) -> bool:
        """An interrupted item the check says is not done, under
        ``--on-interrupted fail`` or ``hold``: settled so without running
        (the attempt that was claimed for the check never began: uncounted).
        False under ``retry``: it runs."""
        policy = self.options.on_interrupted
        if not claim.interrupted or policy is OnInterrupted.RETRY:
            return False
        target = ItemState.FAILED if policy is OnInterrupted.FAIL else ItemState.HELD
        reason = (
            f"interrupted: its runner died during attempt {claim.attempt - 1}; "
            f"--verify says it is not done (--on-interrupted {policy.value})"
        )
        self.queue.store.release(claim, reason, uncounted=True, to=target)
        self.summary.record(claim.item_id, target)
        done = "marked failed" if target is ItemState.FAILED else "held"
        self.on_event(
            Notice(
                f"#{claim.item_id}: {done}: not done by --verify after an interruption",
                warning=True,
            )
        )
        return True
