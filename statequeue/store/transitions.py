"""The rules about item states that every store follows, written once.

The journal and memory stores (store/records/) and the PostgreSQL store
(store/postgres/) each persist state their own way, but which state an outcome
leads to, what crash recovery does, which states a user's ``retry`` or
``cancel`` accepts, and the records that tell ``events`` and ``stats`` about
it must not differ between them: a copy per store drifts. So they live here,
as pure functions (no I/O, no clock: callers pass the time in).

Where the stores' user-visible wording differs today (the PostgreSQL store
also speaks of leases), the caller passes its own text in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from statequeue.core.errors import ItemNotFound, UsageError
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.core.records import Record

if TYPE_CHECKING:  # views are built by the stores; this only files ids into one
    from statequeue.core.views import RecoveryReport

RETRYABLE = (ItemState.FAILED, ItemState.HELD)
"""The states a user's ``retry`` moves back to pending."""
CANCELLABLE = (ItemState.PENDING, ItemState.FAILED, ItemState.HELD)
"""The states a user's ``cancel`` accepts (never a running or finished item)."""


# -- an attempt's outcome ----------------------------------------------------


def outcome_state(outcome: Outcome, retry_at: float | None) -> ItemState:
    """The state an attempt's outcome moves its item to: done when it
    succeeded, pending again when the runner asked for a retry at
    ``retry_at``, else failed."""
    if outcome.ok:
        return ItemState.DONE
    return ItemState.PENDING if retry_at is not None else ItemState.FAILED


def _as_is(text: str) -> str:
    return text


def end_record(
    claim: Claim,
    outcome: Outcome,
    target: ItemState,
    *,
    at: float,
    text: Callable[[str], str] = _as_is,
) -> Record:
    """The ``end`` record of one attempt (what ``events``, ``history`` and
    ``stats`` read); empty fields are left out. ``text`` cleans the free-text
    fields for stores that cannot hold every string (PostgreSQL: no NUL)."""
    rec: Record = {
        "t": "end",
        "id": claim.item_id,
        "attempt": claim.attempt,
        "state": target.value,
        "ok": outcome.ok,
        "at": at,
        "dur": round(outcome.duration, 6),
    }
    optional: dict[str, Any] = {
        "exit": outcome.exit_code,
        "sig": outcome.signal,
        "err": text(outcome.stderr_tail),
        "reason": text(outcome.reason),
        "result": outcome.result,
        "timeout": outcome.timed_out or None,
        "logcut": text(outcome.log_cut),  # `show` and `logs` say the log is cut
    }
    rec.update((k, v) for k, v in optional.items() if v not in (None, ""))
    return rec


# -- try later ----------------------------------------------------------------


def deferral_state(deferrals: int, max_deferrals: int) -> ItemState:
    """The state a deferral moves its item to: ``deferrals`` counts this one
    (within the item's episode). Pending again, due after its delay, until
    the item was deferred more than ``max_deferrals`` times: then failed."""
    return ItemState.FAILED if deferrals > max_deferrals else ItemState.PENDING


def deferral_reason(deferrals: int, max_deferrals: int) -> str:
    """The reason recorded for an item that asked to be tried later too often."""
    times = "time" if deferrals == 1 else "times"
    return f"deferred {deferrals} {times}, more than --max-deferrals {max_deferrals}"


def deferral_outcome(outcome: Outcome, deferrals: int, max_deferrals: int) -> Outcome:
    """The failed outcome recorded (as an ``end``) for a deferral past the ceiling."""
    reason = deferral_reason(deferrals, max_deferrals)
    return replace(outcome, ok=False, reason=reason)


def defer_record(
    claim: Claim, outcome: Outcome, *, delay: float, deferrals: int, at: float
) -> Record:
    """The ``defer`` record: the attempt asked to be tried later, and the item
    is pending again, due at ``retry_at`` (``delay`` seconds after ``at``,
    rounded down to the millisecond: never later than asked). Not a failure
    (``run --retries`` and the episode ignore it), not a crash."""
    rec: Record = {
        "t": "defer",
        "id": claim.item_id,
        "attempt": claim.attempt,
        "state": ItemState.PENDING.value,
        "delay": round(delay, 3),
        "retry_at": math.floor((at + delay) * 1000) / 1000,
        "deferrals": deferrals,
        "at": round(at, 3),
        "dur": round(outcome.duration, 6),
    }
    if outcome.exit_code is not None:
        rec["exit"] = outcome.exit_code
    if outcome.reason:
        rec["reason"] = outcome.reason
    if outcome.log_cut:
        rec["logcut"] = outcome.log_cut  # as an end's: `show` and `logs` say the log is cut
    return rec


def lost_claim_text(claim: Claim) -> str:
    """Why a write about ``claim`` was refused: the item is no longer the
    runner's (recovered, or claimed again elsewhere)."""
    return f"item {claim.item_id} is no longer claimed by runner {claim.runner_id}"


# -- crash recovery ----------------------------------------------------------


def recovery_state(policy: OnInterrupted, crashes: int, max_crashes: int) -> ItemState:
    """The state recovery moves an interrupted item to, once its runner (or
    its lease) is gone: ``crashes`` counts this crash. Under the retry policy
    an item in flight during ``max_crashes`` crashes is held as poison."""
    if policy is OnInterrupted.FAIL:
        return ItemState.FAILED
    if policy is OnInterrupted.HOLD or crashes >= max_crashes:
        return ItemState.HELD
    return ItemState.PENDING


def recovery_bucket(report: RecoveryReport, target: ItemState) -> list[int]:
    """The list of ``report`` that an item recovered to ``target`` is counted in."""
    if target is ItemState.FAILED:
        return report.failed
    if target is ItemState.HELD:
        return report.held
    return report.retried


def recovery_reason(
    target: ItemState, policy: OnInterrupted, crashes: int, *, interrupted: str
) -> str:
    """The reason recorded for a recovered item: the poison message when the
    retry policy held it after ``crashes`` crashes, else the store's own
    ``interrupted`` text."""
    if target is ItemState.HELD and policy is OnInterrupted.RETRY:
        return f"poison: in flight during {crashes} runner crashes; held"
    return interrupted


def recovered_crashed(target: ItemState) -> bool:
    """Whether a recovered item keeps the mark that its runner died mid-attempt
    (so ``--verify`` may settle it): only when it goes back to pending."""
    return target is ItemState.PENDING


def interrupted_record(
    item_id: int, attempt: int, target: ItemState, reason: str, *, crashed: bool, at: float
) -> Record:
    """The ``intr`` record of an item taken from its runner: by recovery, or
    handed back by a runner that stops (``crashed``: the mark above)."""
    rec: Record = {
        "t": "intr",
        "id": item_id,
        "attempt": attempt,
        "state": target.value,
        "reason": reason,
        "at": at,
    }
    if crashed:
        rec["crashed"] = True  # its runner died mid-attempt: --verify may settle it
    return rec


def check_record(claim: Claim, *, over: bool, at: float) -> Record:
    """The ``check`` record: the claimed attempt is only a ``--verify`` check
    so far (nothing of the command runs), so its runner's death is no crash
    (``check_interrupted_record``); or, ``over``, the ``checked`` record: the
    check said the work is not done, and the command starts (a death from now
    on is a crash of the item)."""
    return {
        "t": "checked" if over else "check",
        "id": claim.item_id,
        "attempt": claim.attempt,
        "at": at,
    }


def check_interrupted_reason(attempt: int) -> str:
    """The reason recorded for an item whose runner died during its check."""
    return f"interrupted: its runner died during the --verify check before attempt {attempt}"


def check_interrupted_record(item_id: int, attempt: int, *, crashed: bool, at: float) -> Record:
    """The ``intr`` record that settles an attempt whose runner died while
    only its ``--verify`` check ran: pending again as if never claimed (the
    attempt and no crash counted: its command never ran), keeping the mark
    that an earlier attempt died mid-way (``crashed``), so that the next run
    checks it again."""
    reason = check_interrupted_reason(attempt)
    rec = interrupted_record(item_id, attempt, ItemState.PENDING, reason, crashed=crashed, at=at)
    rec["attempts"] = attempt - 1
    return rec


def starts_episode(rec: Record) -> bool:
    """True for a record that starts a new episode of an item's life (what
    ``run --retries`` counts failures within): a user's ``retry`` (a ``set``
    back to pending), or a runner stopped by a signal handing the item back
    (``release``: an ``intr`` that counts no crash). Not crash recovery (it
    counts ``crashes``), and not an attempt given back uncounted because the
    runner was short of resources (it restores ``attempts``)."""
    if rec.get("state") != ItemState.PENDING.value:
        return False
    kind = rec.get("t")
    return kind == "set" or (kind == "intr" and "crashes" not in rec and "attempts" not in rec)


def starts_afresh(rec: Record) -> bool:
    """True for a user's ``retry`` (a ``set`` back to pending): the item
    starts afresh, its crashes forgotten. Its crash count (``--max-crashes``)
    goes back to 0, the mark that its last attempt was interrupted is cleared
    (no ``--verify`` or ``--on-interrupted`` decides it again, and ``status``
    no longer lists it under ``interrupted_pending``), and it is due at once.
    Every store does all three (PostgreSQL in ``writes.move``)."""
    return rec.get("t") == "set" and rec.get("state") == ItemState.PENDING.value


def last_line(text: str, width: int = 200) -> str:
    """The line of a failed attempt's stderr tail that ``status`` shows: the
    last non-empty one, cut to ``width``."""
    return text.rstrip().rpartition("\n")[2][-width:]


# -- the user's retry, cancel and pause ---------------------------------------


def retry_allowed(
    ids: Sequence[int] | None, states: Collection[ItemState]
) -> tuple[ItemState, ...]:
    """The states ``retry`` accepts: every retryable one, and cancelled, for
    items named by id (a cancel undone: nothing else could run it again, and
    `enqueue` skips it as queued); for a retry of every item (``ids`` None),
    those of them in ``states`` (cancelled only when asked: `--cancelled`).
    Named items may be pending too where ``states`` has pending: items a
    user's retry has just recovered as pending (api/user_states.py), which
    start afresh as any retried item (``starts_afresh``)."""
    if ids is None:
        return tuple(s for s in (*RETRYABLE, ItemState.CANCELLED) if s in states)
    if ItemState.PENDING in states:
        return (*RETRYABLE, ItemState.CANCELLED, ItemState.PENDING)
    return (*RETRYABLE, ItemState.CANCELLED)


def user_reason(verb: str) -> str:
    """The reason recorded for a user's ``verb`` (retry, cancel)."""
    return f"{verb} by user"


def user_record(item_id: int, target: ItemState, verb: str, *, at: float) -> Record:
    """The ``set`` record of a user's state change."""
    return {"t": "set", "id": item_id, "state": target.value, "reason": user_reason(verb), "at": at}


def pause_record(paused: bool, *, at: float) -> Record:
    """The ``pause`` record of a user's pause or resume."""
    return {"t": "pause", "paused": paused, "at": at}


def check_allowed(verb: str, item_id: int, state: str, allowed: tuple[ItemState, ...]) -> None:
    """UsageError unless an item in ``state`` may be ``verb``-ed."""
    if state not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise refusal(verb, item_id, f"{state} (must be {names})")


def refusal(verb: str, item_id: int, state: str) -> UsageError:
    """The error for a ``verb`` on an item in a state it does not accept."""
    return UsageError(f"cannot {verb} item {item_id}: it is {state}")


def unknown_item(item_id: int, queue: str) -> ItemNotFound:
    """The error for an item id the queue has never had."""
    return ItemNotFound(f"no item {item_id} in queue {queue!r}")


# -- runners -----------------------------------------------------------------


def runner_record(runner: RunnerInfo) -> Record:
    """The ``run`` record of a runner that starts (never its environment)."""
    rec: Record = {
        "t": "run",
        "runner": runner.runner_id,
        "pid": runner.pid,
        "host": runner.host,
        "boot": runner.boot_id,
        "since": runner.started_at,
        "cmd": list(runner.command),
    }
    if runner.guarded:  # see RunnerInfo.guarded (absent: as before)
        rec["guard"] = True
    return rec


def runner_stopped_record(runner_id: str, *, at: float) -> Record:
    """The ``stop`` record of a runner that ends."""
    return {"t": "stop", "runner": runner_id, "at": at}


def runner_lost_record(runner_id: str, *, at: float, by: int, how: str = "") -> Record:
    """The ``stop`` record of a runner found dead; ``by``: the process that
    noticed (``events`` shows the runner as lost); ``how`` it was found, where
    not by its lock being released: "lease" (its lease ended unrenewed) or
    "pid" (its process is gone), as a database store finds them."""
    rec: Record = {"t": "stop", "runner": runner_id, "reason": "died", "at": at, "by": by}
    if how:
        rec["how"] = how
    return rec


def discarded_record(claim: Claim, reason: str, *, at: float) -> Record:
    """The ``discard`` record of a result thrown away because ``claim`` was
    stale (its runner lost the lease, and the item was taken over): the
    attempt happened, and the queue's history says so."""
    return {
        "t": "discard",
        "id": claim.item_id,
        "attempt": claim.attempt,
        "runner": claim.runner_id,
        "reason": reason,
        "at": at,
    }
