"""The values the library returns: frozen dataclasses and the item state enum."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from statequeue.core.errors import UnknownState

STATUS_SCHEMA = 1


class ItemState(StrEnum):
    """Where an item is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HELD = "held"

    # Enum's own __hash__ is Python code; state counts are updated per record
    # in replay, so use str's (equal members hash as their values, as before).
    __hash__ = str.__hash__


def item_state(value: object) -> ItemState:
    """``value`` as an ItemState (a member or its name, as the CLI takes it);
    UnknownState for anything else, rather than a filter that matches nothing."""
    if isinstance(value, str) and value in _STATE_NAMES:
        return ItemState(value)
    names = ", ".join(_STATE_NAMES)
    raise UnknownState(f"unknown state {value!r}: use one of {names}")


_STATE_NAMES = tuple(s.value for s in ItemState)


class OnInterrupted(StrEnum):
    """What recovery does with an item whose runner died while it ran."""

    RETRY = "retry"
    FAIL = "fail"
    HOLD = "hold"


@dataclass(frozen=True)
class EnqueueResult:
    """How many of the offered items were added, and how many were already there."""

    added: int
    skipped: int


@dataclass(frozen=True)
class RunnerInfo:
    """Who is running items: recorded once per runner, never the environment."""

    runner_id: str
    pid: int
    host: str
    boot_id: str
    started_at: float
    command: tuple[str, ...] = ()
    guarded: bool = False
    """Its liveness lock outlives it until its keeper has killed every
    process it left (run/guard.py): its items stay claimed until then."""
    in_process: bool = False
    """It runs its items in its own process and hands no claim's lock to
    another (the library's work loops): its own liveness lock stands for
    each of its claims (a store need not lock each one apart). Not recorded."""


@dataclass(frozen=True)
class Claim:
    """An item claimed by one runner for one attempt."""

    item_id: int
    item: str
    attempt: int
    runner_id: str
    interrupted: bool = False
    """The previous attempt died with its runner: a verify hook may settle it."""
    failures: int = 0
    """Failed attempts in the item's current episode (since it was enqueued,
    retried by a user, or handed back when a runner was stopped): what
    ``run --retries`` counts."""
    token: int | None = None
    """The claim's fencing token, for stores that fence (PostgreSQL): every
    write about this attempt names it, and changes nothing once it is stale."""
    inherit_fds: tuple[int, ...] = ()
    """File descriptors a child process must inherit while it runs the item.

    The journal store passes its claim lock here: the lock stays held while the
    child (or anything it forks) lives, so recovery never runs a second copy.
    """


VERIFIED_BEFORE_RUN = "verified before run"
VERIFIED_AFTER_CRASH = "verified: finished before its runner died"
VERIFIED_REASONS = frozenset((VERIFIED_BEFORE_RUN, VERIFIED_AFTER_CRASH))
"""The reasons of an attempt a --verify check (or ``work(verify=)``) settled
done without running anything: it took no run time (its ``dur`` is 0), so
`stats` and `report` leave it out of their durations."""


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt, as recorded durably."""

    ok: bool
    exit_code: int | None = None
    signal: int | None = None
    duration: float = 0.0
    stderr_tail: str = ""
    reason: str = ""
    result: Any = None
    timed_out: bool = False
    log_cut: str = ""
    """Why the attempt's output log stops short ("disk full"), or "" when it
    holds all of it (within --log-limit): its end record's ``logcut``. Not a
    failure: the state stays what the exit code says."""
