"""What a run reports as it goes (events) and at its end (the summary)."""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.durations import format_duration
from statequeue.core.errors import StateQueueError
from statequeue.core.models import Claim, ItemState, Outcome

if TYPE_CHECKING:
    from statequeue.core.views import ActiveRunner, RecoveryReport
    from statequeue.store.base import Store


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
    retries: int = 0
    """The --retries budget: with ``claim.failures`` it tells which retry comes next."""
    deferred: float | None = None
    """Seconds until it runs again, when the attempt asked to be tried later (exit 75)."""


@dataclass(frozen=True)
class Notice:
    """Something the user should read: a recovery (``warning`` False), or a
    problem even ``--quiet`` shows (``warning`` True)."""

    text: str
    warning: bool = False
    stopping: bool = False
    """The run was told to stop (its first SIGINT, SIGTERM or SIGHUP): it
    starts no new item, so a progress bar shows no ETA from now on."""


RunEvent = ItemStarted | ItemFinished | Notice


@dataclass
class RunSummary:
    """What one ``run`` did, counted in items (each item once, by where it
    ended up), plus the attempts it made."""

    attempts: int = 0
    ok: int = 0
    """Items done. A count, not a set of ids: done is final (no later attempt
    moves an item out of it), and a `--follow` run that lives for months must
    not grow by an id per item. The sets below hold only items that may move."""
    failed_for_good: set[int] = field(default_factory=set)
    held_items: set[int] = field(default_factory=set)
    """Items held (poison after --max-crashes, --on-interrupted hold): not
    failed, but they wait for the user (`retry --held`)."""
    waiting: set[int] = field(default_factory=set)
    """Items that failed and wait for an automatic retry (a later run takes
    them), or that asked to be tried later (also in ``deferred``)."""
    deferred: set[int] = field(default_factory=set)
    """Of ``waiting``: the items that asked to be tried later (exit 75), not failed."""
    verified: int = 0
    """Items --verify found done (also counted in ``ok``): not run again."""
    handed_back: set[int] = field(default_factory=set)
    """Items given back as pending because the run was stopped by a signal."""
    killed_on_stop: int = 0
    """Children that ignored the stop signal and were killed after --grace."""
    output_cut: set[int] = field(default_factory=set)
    """Items whose output could not all be written to their log (a full disk)."""
    cut_short: set[int] = field(default_factory=set)
    """Items in flight when the run stopped on an error (killed, given back or
    left to recovery), or ended with their result not acknowledged (its
    record may or may not have reached the disk): they may run again."""
    stopped_by: int | None = None
    left_pending: int = 0
    """Pending items the run left and never started (not counted elsewhere:
    neither handed back nor waiting for a retry): stopped by a signal; or,
    with ``out_of_time``, having taken none (a paused queue, retries not due
    yet): there was something to do, so never "nothing to do" nor
    ``--exit-empty``'s code."""
    held_by_dead_runner: tuple[int, ...] = ()
    """Items left running by a dead runner whose attempt's processes still
    hold them, as the run ended (``Store.held_by_dead_runner``): not taken."""
    silent: tuple[int, ...] = ()
    """Stores with leases: items of other runners not heard from for over
    half their lease as the run ended (killed, frozen or cut off, on another
    host): not taken, since their leases have not ended yet."""
    silent_lease_ends: float | None = None
    """When the last of those leases ends unless renewed (Unix time)."""
    out_of_time: bool = False
    """--max-time ran out: the run took no new item after it."""
    paused: str | None = None
    """With ``left_pending``, the queue's name when it was paused."""

    def record(self, item_id: int, state: ItemState) -> None:
        """Note where ``item_id`` stands after one of its attempts."""
        for bucket in (
            self.failed_for_good,
            self.held_items,
            self.waiting,
            self.deferred,
            self.handed_back,
        ):
            bucket.discard(item_id)
        if state is ItemState.DONE:
            self.ok += 1
        elif state is ItemState.PENDING:
            self.waiting.add(item_id)
        elif state is ItemState.FAILED:
            self.failed_for_good.add(item_id)
        elif state is ItemState.HELD:
            self.held_items.add(item_id)

    def recovered(self, report: RecoveryReport) -> None:
        """Count what this run's recovery settled without running it: items
        marked failed (--on-interrupted fail) or held (--on-interrupted hold,
        poison after --max-crashes) need a look as much as a failed attempt."""
        self.failed_for_good.update(report.failed)
        self.held_items.update(report.held)

    def defer(self, item_id: int) -> None:
        """``item_id``, pending again after ``record``, asked to be tried later."""
        if item_id in self.waiting:
            self.deferred.add(item_id)

    def hand_back(self, item_id: int) -> None:
        self.waiting.discard(item_id)
        self.deferred.discard(item_id)
        self.handed_back.add(item_id)

    def ended(self, store: Store, stopped_by: int | None) -> None:
        """The run is over (``stopped_by``: the signal that stopped it). An
        item it left waiting for a retry that is no longer pending (cancelled
        during its wait, or run by another runner) waits no more: not counted
        so. Best effort: a store that cannot answer leaves the count as it is."""
        self.stopped_by = stopped_by
        with contextlib.suppress(StateQueueError, OSError):
            # Running, no run may take them yet: said, not left out silently.
            self.held_by_dead_runner = store.held_by_dead_runner()
            if store.has_leases:
                self.silent, self.silent_lease_ends = silent_items(store.status().runners)
        if self.out_of_time and stopped_by is None and not self.did_anything:
            with contextlib.suppress(StateQueueError, OSError):
                self.left_pending = store.status().counts.get("pending", 0)
                if self.left_pending and store.is_paused():
                    self.paused = store.name
        if self.waiting:
            with contextlib.suppress(StateQueueError, OSError):
                states = store.states(self.waiting)
                self.waiting = {i for i, s in states.items() if s is ItemState.PENDING}
                self.deferred &= self.waiting
        if stopped_by is not None:  # what the stop left undone, besides what it handed back
            with contextlib.suppress(StateQueueError, OSError):
                pending = store.status().counts.get("pending", 0)
                self.left_pending = max(0, pending - self.released - self.retried)

    @property
    def started(self) -> int:
        """Attempts made, counted as the store counts them: children started,
        plus items whose program could not start (recorded failed, attempt N)."""
        return self.attempts

    @property
    def succeeded(self) -> int:
        return self.ok

    @property
    def failed(self) -> int:
        return len(self.failed_for_good)

    @property
    def held(self) -> int:
        return len(self.held_items)

    @property
    def needs_a_look(self) -> bool:
        """An item failed for good or was held: exit 1, and ``--quiet`` prints the summary."""
        return bool(self.failed_for_good or self.held_items)

    @property
    def retried(self) -> int:
        return len(self.waiting)

    @property
    def retry_pending(self) -> int:
        """Items that failed and wait for a retry (``waiting`` less ``deferred``)."""
        return len(self.waiting) - len(self.deferred)

    @property
    def released(self) -> int:
        return len(self.handed_back)

    @property
    def clean_stop(self) -> bool:
        """Stopped by a signal, and every child stopped within --grace."""
        return self.stopped_by is not None and self.killed_on_stop == 0

    @property
    def settled_any(self) -> bool:
        """Whether an item's attempt ended (recorded, retried, held, handed back)
        or --verify found one done: what a run stopped by an error reports."""
        return bool(self.ok or self.retried or self.released or self.needs_a_look)

    @property
    def did_anything(self) -> bool:
        """Whether the run started, verified, retried, handed back or settled anything."""
        return bool(
            self.attempts or self.verified or self.retried or self.released or self.needs_a_look
        )

    def text(self) -> str:
        """One line for the user: items by outcome, then attempts. Attempts
        started: those handed back unfinished on a stop count too, as the
        store counts them (`show`), though `stats` counts finished ones only."""
        idle = not self.did_anything
        if idle and self.stopped_by is None and self.left_pending:
            return self._left_text() + self._held_text()
        if idle and self.stopped_by is None:
            return "nothing to do: no pending item is due" + self._held_text()
        parts = [f"{self.succeeded} ok"]
        if self.verified:
            parts[0] += f" ({self.verified} verified, not run)"
        parts.append(f"{self.failed} failed")
        if self.held:
            parts.append(f"{self.held} held")
        if self.retry_pending:
            parts.append(f"{self.retry_pending} waiting for a retry")
        if self.deferred:
            parts.append(f"{len(self.deferred)} deferred (to be tried later)")
        if self.released:
            parts.append(f"{self.released} handed back (stopped)")
        if self.left_pending:
            parts.append(f"{self.left_pending} left pending (not started)")
        if self.output_cut:
            parts.append(f"{len(self.output_cut)} with their output log cut (`show ID`)")
        if self.cut_short:
            cut = len(self.cut_short)
            parts.append(f"{cut} cut short by the error (not acknowledged: they may run again)")
        attempts = f"{self.attempts} attempt" + ("" if self.attempts == 1 else "s") + " started"
        stopped = "" if self.stopped_by is None else f"stopped by {signal_name(self.stopped_by)}: "
        return f"{stopped}items: {', '.join(parts)}; {attempts}{self._held_text()}"

    def _left_text(self) -> str:
        """--max-time ran out before the run took any item, while some were
        pending: what kept them (a pause, a retry's wait), never "nothing to do"."""
        left = f"{_items([0] * self.left_pending)} pending"
        if self.paused is not None:
            import shlex  # lazy: start-up time (a paused queue only)

            resume = f"statequeue -q {shlex.quote(self.paused)} resume"
            why = f"the queue is paused (`{resume}` lets them run)"
        else:
            why = "none was due (a retry's wait, or a claim still held: `statequeue status`)"
        return f"--max-time reached before any item was taken: {left}, not taken: {why}"

    def _held_text(self) -> str:
        """The items a dead runner's processes still run, and those of a silent
        runner whose lease has not ended: not taken by this run."""
        text = ""
        held = self.held_by_dead_runner
        if held:
            text = f"; not taken: {_items(held)} still run by processes of a dead runner "
            text += f"(`statequeue status`): {_listed(held)}"
        if self.silent:
            text += "; " if held else "; not taken: "
            text += f"{_items(self.silent)} of a runner not heard from for over half its lease: "
            text += f"{_listed(self.silent)}, recovered once its lease ends"
            if self.silent_lease_ends is not None:
                left = max(0.0, self.silent_lease_ends - time.time())
                text += f" (in about {math.ceil(left):.0f}s)"
            text += " by the next run, or by `run --follow`"
        return text


HEARD_WITHIN = 0.5
"""Share of its lease a runner may go unheard (it renews every third) before
a run's summary names its items as not taken."""


def silent_items(runners: Sequence[ActiveRunner]) -> tuple[tuple[int, ...], float | None]:
    """The running items of the runners (still counted active: their leases
    have not ended) not heard from for over ``HEARD_WITHIN`` of their lease,
    and when the last of those leases ends."""
    items: list[int] = []
    ends: list[float] = []
    for r in runners:
        if r.heard_ago is None or r.lease is None or r.heard_ago <= HEARD_WITHIN * r.lease:
            continue
        items.extend(r.running)
        if r.lease_ends_at is not None and r.running:
            ends.append(r.lease_ends_at)
    return tuple(sorted(items)), max(ends, default=None)


def _items(ids: Sequence[int]) -> str:
    return f"{len(ids)} item" + ("" if len(ids) == 1 else "s")


def _listed(ids: Sequence[int]) -> str:
    return ", ".join(f"#{i}" for i in ids[:20]) + (", ..." if len(ids) > 20 else "")


def signal_name(signum: int) -> str:
    """``SIGINT`` for 2 (``signal 64`` for one Python has no name for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stopping_text(signum: int, running: int, grace: float) -> str:
    """What a run says at once on its first stop signal (as GNU parallel
    does): what it does now, how long it may take, how to cut it short."""
    if not running:
        return "stopping: no new items start; none is running"
    shown = f"{grace:g}s" if grace < 60 else format_duration(grace)
    again = "Ctrl-C again" if signum == signal.SIGINT else f"{signal_name(signum)} again"
    return (
        f"stopping: no new items start; waiting for {running} running "
        f"(up to --grace {shown}); {again} to stop them now"
    )


def paused_text(queue: str) -> str:
    """What a run says while it waits on a paused queue."""
    import shlex  # lazy: start-up time (a paused queue only)

    return (
        f"queue {queue!r} is paused: waiting for `statequeue -q {shlex.quote(queue)} resume`"
        " (Ctrl-C stops the run)"
    )
