"""The PostgreSQL store's writes inside a caller's transaction: counts,
events, results, recovery of one item, and the user's state changes.

Every function takes the open transaction's connection and the queue name;
none commits (the store's ``_tx`` does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from statequeue.core.errors import ClaimLost, ItemNotFound, QueueNotFound, UsageError
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.core.records import Record
from statequeue.store.postgres import functions
from statequeue.store.postgres.connection import Connection

if TYPE_CHECKING:
    from statequeue.core.views import RecoveryReport


def lock_queue(conn: Connection, queue: str, *, shared: bool = False) -> tuple[int, bool]:
    """Lock the queue's row (serialises enqueues, runner registration and
    user actions); returns its next id and whether it is paused. ``shared``:
    a lock that excludes those but not other shared holders (runners that
    register side by side, none of them exclusive)."""
    mode = "SHARE" if shared else "UPDATE"
    row = conn.execute(
        "SELECT next_id, paused FROM statequeue.queues WHERE name = %s AND NOT dropping"
        f" FOR {mode}",
        (queue,),
    ).fetchone()
    if row is None:  # or being dropped: nothing may be added to it
        raise QueueNotFound(f"no queue {queue!r} in the PostgreSQL store")
    return int(row[0]), bool(row[1])


def event(conn: Connection, queue: str, record: Record) -> None:
    conn.execute(
        "INSERT INTO statequeue.events (queue, id, body) VALUES (%s, %s, %s)",
        (queue, record.get("id"), Jsonb(record)),
    )


def count(conn: Connection, queue: str, changes: dict[str, int]) -> None:
    rows = [(queue, s, d) for s, d in changes.items() if d]
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO statequeue.count_deltas (queue, state, delta) VALUES (%s, %s, %s)",
                rows,
            )


def held(conn: Connection, queue: str, claim: Claim) -> int:
    """Lock the claim's row if its token is still current (its attempts so
    far), else ClaimLost: nothing is written for a stale token."""
    row = conn.execute(
        "SELECT attempts FROM statequeue.live WHERE queue = %(q)s AND id = %(id)s"
        " AND token = %(token)s AND state = 'running' FOR UPDATE",
        {"q": queue, "id": claim.item_id, "token": claim.token},
    ).fetchone()
    if row is None:
        raise stale(claim)
    return int(row[0])


def finish_once(
    conn: Connection,
    queue: str,
    claim: Claim,
    outcome: Outcome,
    end: tuple[ItemState, float | None],
    *,
    sync: bool,
    retried: bool,
) -> ItemState:
    """Record one attempt's result: one statement, its own transaction
    (functions.py); the item's new state, or ClaimLost if the token is stale."""
    params = {**finish_params(queue, claim, outcome, end), "sync": sync, "retried": retried}
    row = conn.execute(functions.FINISH, params).fetchone()
    if row is None or row[0] is None:
        raise stale(claim)
    return ItemState(row[0])


def finish_params(
    queue: str, claim: Claim, outcome: Outcome, end: tuple[ItemState, float | None]
) -> dict[str, Any]:
    """The arguments of ``statequeue.finish`` for one attempt's outcome."""
    target, retry_at = end
    return {
        "q": queue,
        "id": claim.item_id,
        "token": claim.token,
        "attempt": claim.attempt,
        "state": target.value,
        "ok": outcome.ok,
        "exit": outcome.exit_code,
        "signal": outcome.signal,
        "duration": outcome.duration,
        "reason": safe(outcome.reason),
        "result": None if outcome.result is None else Jsonb(outcome.result),
        "err": safe(outcome.stderr_tail),
        "retry_at": retry_at if target is not ItemState.DONE else None,
        "at": time.time(),
        "event": Jsonb(end_record(claim, outcome, target, retry_at)),
    }


def stale(claim: Claim) -> ClaimLost:
    return ClaimLost(
        f"item {claim.item_id} is no longer claimed by runner {claim.runner_id} "
        f"(token {claim.token} is stale); nothing was recorded"
    )


def give_back(conn: Connection, queue: str, claim: Claim, reason: str, attempts: int) -> None:
    """Put a claimed item back as pending, with ``attempts`` made so far."""
    conn.execute(
        "UPDATE statequeue.live SET state = 'pending', attempts = %(a)s, token = NULL,"
        " runner = NULL, holder = NULL, lease_until = NULL, failures = 0, interrupted = %(i)s,"
        " reason = %(r)s, changed_at = %(now)s WHERE queue = %(q)s AND id = %(id)s",
        {
            "q": queue,
            "id": claim.item_id,
            "a": attempts,
            "i": claim.interrupted,
            "r": safe(reason),
            "now": time.time(),
        },
    )
    count(conn, queue, {"running": -1, "pending": 1})
    rec: Record = {"t": "intr", "id": claim.item_id, "attempt": claim.attempt}
    event(conn, queue, {**rec, "state": "pending", "reason": reason, "at": now()})


def add_runner(conn: Connection, queue: str, runner: RunnerInfo, lease: float) -> None:
    """Record a runner, alive while its heartbeat renews ``seen_at`` within ``lease``."""
    conn.execute(
        "INSERT INTO statequeue.runners (queue, runner_id, pid, host, boot, since,"
        " command, session, seen_at, lease)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, 0, clock_timestamp(), %s)"
        " ON CONFLICT (queue, runner_id) DO UPDATE SET seen_at = excluded.seen_at,"
        " lease = excluded.lease, stopped_at = NULL",
        (
            queue,
            runner.runner_id,
            runner.pid,
            runner.host,
            runner.boot_id,
            runner.started_at,
            Jsonb(list(runner.command)),
            lease,
        ),
    )
    rec: Record = {"t": "run", "runner": runner.runner_id, "pid": runner.pid}
    rec.update(host=runner.host, boot=runner.boot_id, since=runner.started_at)
    event(conn, queue, {**rec, "cmd": list(runner.command)})


def recover_one(
    conn: Connection,
    queue: str,
    item_id: int,
    attempt: int,
    crashes: int,
    target: ItemState,
    policy: OnInterrupted,
) -> None:
    reason = f"interrupted: its runner died or lost its lease during attempt {attempt}"
    if target is ItemState.HELD and policy is OnInterrupted.RETRY:
        reason = f"poison: in flight during {crashes} runner crashes; held"
    crashed = target is ItemState.PENDING
    conn.execute(
        "UPDATE statequeue.live SET state = %(s)s, crashes = %(c)s, interrupted = %(i)s,"
        " token = NULL, runner = NULL, holder = NULL, lease_until = NULL, reason = %(r)s,"
        " changed_at = %(now)s"
        " WHERE queue = %(q)s AND id = %(id)s",
        {
            "q": queue,
            "id": item_id,
            "s": target.value,
            "c": crashes,
            "i": crashed,
            "r": reason,
            "now": time.time(),
        },
    )
    count(conn, queue, {"running": -1, target.value: 1})
    rec: Record = {"t": "intr", "id": item_id, "attempt": attempt, "state": target.value}
    rec.update(reason=reason, at=now(), crashes=crashes)
    if crashed:
        rec["crashed"] = True
    event(conn, queue, rec)


def set_state(
    conn: Connection,
    queue: str,
    ids: Sequence[int] | None,
    target: ItemState,
    allowed: tuple[ItemState, ...],
    verb: str,
) -> list[int]:
    """Move the items (``ids``, or every one in ``allowed``) to ``target``,
    after checking every one (ItemNotFound or UsageError, nothing changed)."""
    lock_queue(conn, queue)
    if ids is None:
        rows = conn.execute(
            "SELECT id, state FROM statequeue.live WHERE queue = %s AND state = ANY(%s)"
            " ORDER BY id FOR UPDATE",
            (queue, [s.value for s in allowed]),
        ).fetchall()
        chosen = [(int(i), str(s)) for i, s in rows]
    else:
        chosen = [(i, check_state(conn, queue, i, allowed, verb)) for i in dict.fromkeys(ids)]
    reason = f"{verb} by user"
    for item_id, old in chosen:
        move(conn, queue, item_id, target, reason)
        count(conn, queue, {old: -1, target.value: 1})
        rec: Record = {"t": "set", "id": item_id, "state": target.value}
        event(conn, queue, {**rec, "reason": reason, "at": now()})
    return [i for i, _ in chosen]


def move(conn: Connection, queue: str, item_id: int, target: ItemState, reason: str) -> None:
    key = {"q": queue, "id": item_id, "r": reason, "now": time.time()}
    if target is ItemState.CANCELLED:
        # The item leaves the hot table: its attempts so far go with it to
        # ``items`` (shown and exported from there once it is cancelled).
        conn.execute(
            "WITH gone AS (DELETE FROM statequeue.live WHERE queue = %(q)s AND id = %(id)s"
            " RETURNING attempts)"
            " UPDATE statequeue.items i SET state = 'cancelled', reason = %(r)s,"
            " attempts = coalesce((SELECT attempts FROM gone), i.attempts)"
            " WHERE i.queue = %(q)s AND i.id = %(id)s",
            key,
        )
        return
    conn.execute(
        "UPDATE statequeue.live SET state = 'pending', retry_at = NULL, failures = 0,"
        " crashes = 0, interrupted = false, reason = %(r)s, changed_at = %(now)s"
        " WHERE queue = %(q)s AND id = %(id)s",
        key,
    )


def check_state(
    conn: Connection, queue: str, item_id: int, allowed: tuple[ItemState, ...], verb: str
) -> str:
    key = {"q": queue, "id": item_id}
    row = conn.execute(
        "SELECT state FROM statequeue.live WHERE queue = %(q)s AND id = %(id)s FOR UPDATE", key
    ).fetchone()
    if row is None:
        row = conn.execute(
            "SELECT state FROM statequeue.items WHERE queue = %(q)s AND id = %(id)s", key
        ).fetchone()
        if row is None:
            raise ItemNotFound(f"no item {item_id} in queue {queue!r}")
        raise UsageError(f"cannot {verb} item {item_id}: it is {row[0]}")
    state = str(row[0])
    if state not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise UsageError(f"cannot {verb} item {item_id}: it is {state} (must be {names})")
    return state


def policy(
    policy: OnInterrupted, crashes: int, max_crashes: int, report: RecoveryReport
) -> tuple[ItemState, list[int]]:
    if policy is OnInterrupted.FAIL:
        return ItemState.FAILED, report.failed
    if policy is OnInterrupted.HOLD or crashes >= max_crashes:
        return ItemState.HELD, report.held
    return ItemState.PENDING, report.retried


def safe(text: str) -> str:
    """Text PostgreSQL can hold: no NUL, no lone surrogate (stderr may have both)."""
    if text.isascii() and "\0" not in text:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\x00")


def now() -> float:
    return round(time.time(), 3)


def end_record(claim: Claim, outcome: Outcome, target: ItemState, retry_at: float | None) -> Record:
    rec: Record = {"t": "end", "id": claim.item_id, "attempt": claim.attempt}
    rec.update(state=target.value, ok=outcome.ok, at=now(), dur=round(outcome.duration, 6))
    optional: dict[str, Any] = {
        "exit": outcome.exit_code,
        "sig": outcome.signal,
        "err": safe(outcome.stderr_tail),
        "reason": safe(outcome.reason),
        "result": outcome.result,
        "timeout": outcome.timed_out or None,
        "retry_at": retry_at if not outcome.ok else None,
        "token": claim.token,
    }
    rec.update((k, v) for k, v in optional.items() if v not in (None, ""))
    return rec
