"""The PostgreSQL store's writes inside a caller's transaction: counts,
events, results, recovery of one item, and the user's state changes.

Every function takes the open transaction's connection and the queue name;
none commits (the store's ``_tx`` does).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from psycopg.types.json import Jsonb

from statequeue.core.errors import ClaimLost, QueueNotFound
from statequeue.core.models import Claim, ItemState, OnInterrupted, Outcome, RunnerInfo
from statequeue.core.records import Record, json_problem
from statequeue.store import transitions
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
        raise no_queue(queue)
    return int(row[0]), bool(row[1])


def no_queue(queue: str) -> QueueNotFound:
    """The error for a queue the database does not hold (or is dropping)."""
    return QueueNotFound(f"no queue {queue!r} in the PostgreSQL store")


def jsonb(value: Any) -> Jsonb:
    """``value`` as a jsonb parameter, encoded as the journal encodes it (orjson)."""
    return Jsonb(value, dumps=_dumps)


def _dumps(value: Any) -> bytes | str:
    # orjson, not psycopg's default (the stdlib's json): a result the library
    # accepts (core/records.check_json: what orjson can write, such as a
    # datetime or a UUID) is stored as the journal stores it, where the stdlib
    # raised TypeError; and the stdlib's encoder was about 5% of a work
    # loop's CPU on this side (cProfile). NaN and infinity, which orjson
    # would write as null, go to the stdlib as before (the server refuses them).
    try:
        data = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value)
    if b"null" in data and json_problem(value) is not None:
        return json.dumps(value)
    return data


def event(conn: Connection, queue: str, record: Record) -> None:
    conn.execute(
        "INSERT INTO statequeue.events (queue, id, body) VALUES (%s, %s, %s)",
        (queue, record.get("id"), jsonb(record)),
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


def held_crashes(conn: Connection, queue: str, claim: Claim) -> tuple[int, int]:
    """As ``held``: the claim's attempts and crashes so far, its row locked."""
    row = conn.execute(
        "SELECT attempts, crashes FROM statequeue.live WHERE queue = %(q)s AND id = %(id)s"
        " AND token = %(token)s AND state = 'running' FOR UPDATE",
        {"q": queue, "id": claim.item_id, "token": claim.token},
    ).fetchone()
    if row is None:
        raise stale(claim)
    return int(row[0]), int(row[1])


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
        "result": None if outcome.result is None else jsonb(outcome.result),
        "err": safe(outcome.stderr_tail),
        "retry_at": retry_at if target is not ItemState.DONE else None,
        "at": time.time(),
        "event": jsonb(end_record(claim, outcome, target, retry_at)),
    }


def stale(claim: Claim) -> ClaimLost:
    return ClaimLost(
        f"{transitions.lost_claim_text(claim)} (token {claim.token} is stale); nothing was recorded"
    )


def give_back(
    conn: Connection,
    queue: str,
    claim: Claim,
    reason: str,
    attempts: int,
    to: ItemState = ItemState.PENDING,
) -> None:
    """Put a claimed item back as pending (or ``to``), with ``attempts`` made so far."""
    conn.execute(
        "UPDATE statequeue.live SET state = %(s)s, attempts = %(a)s, token = NULL,"
        " runner = NULL, holder = NULL, lease_until = NULL, failures = 0, interrupted = %(i)s,"
        " reason = %(r)s, changed_at = %(now)s WHERE queue = %(q)s AND id = %(id)s",
        {
            "q": queue,
            "id": claim.item_id,
            "s": to.value,
            "a": attempts,
            "i": claim.interrupted and to is ItemState.PENDING,
            "r": safe(reason),
            "now": time.time(),
        },
    )
    count(conn, queue, {"running": -1, to.value: 1})
    # Unlike the journal's, this event has never carried ``crashed`` nor the
    # uncounted ``attempts`` (the item's row holds both).
    rec = transitions.interrupted_record(
        claim.item_id, claim.attempt, to, reason, crashed=False, at=now()
    )
    event(conn, queue, rec)


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
            Jsonb([]),  # its command once it starts an attempt (``runner_started``)
            lease,
        ),
    )
    event(conn, queue, transitions.runner_record(runner))


def runner_started(conn: Connection, queue: str, runner: RunnerInfo) -> None:
    """Record ``runner``'s command, now that it has started an attempt: a run
    that found nothing to do is not "the last command" (``commands``)."""
    conn.execute(
        "UPDATE statequeue.runners SET command = %s WHERE queue = %s AND runner_id = %s",
        (Jsonb(list(runner.command)), queue, runner.runner_id),
    )


def recover_one(
    conn: Connection,
    queue: str,
    item_id: int,
    attempt: int,
    crashes: int,
    target: ItemState,
    policy: OnInterrupted,
    *,
    interrupted: str = "",
) -> None:
    """Settle an interrupted attempt by ``policy`` (counting this crash);
    ``interrupted`` says why, when it is not the runner's death or lost lease."""
    reason = transitions.recovery_reason(
        target,
        policy,
        crashes,
        interrupted=interrupted
        or f"interrupted: its runner died or lost its lease during attempt {attempt}",
    )
    crashed = transitions.recovered_crashed(target)
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
    rec = transitions.interrupted_record(
        item_id, attempt, target, reason, crashed=crashed, at=now()
    )
    rec["crashes"] = crashes
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
        if ItemState.CANCELLED in allowed:  # `retry --cancelled`: they have no hot row
            rows += conn.execute(_CANCELLED, {"q": queue}).fetchall()
        chosen = sorted((int(i), str(s)) for i, s in rows)
    else:
        chosen = [(i, check_state(conn, queue, i, allowed, verb)) for i in dict.fromkeys(ids)]
    reason = transitions.user_reason(verb)
    for item_id, old in chosen:
        if old == ItemState.CANCELLED.value:
            _uncancel(conn, queue, item_id, reason)
        else:
            move(conn, queue, item_id, target, reason)
        if old != target.value:  # a retry of an item recovered as pending stays pending
            count(conn, queue, {old: -1, target.value: 1})
        event(conn, queue, transitions.user_record(item_id, target, verb, at=now()))
    return [i for i, _ in chosen]


# The cancelled items, which left the hot table (``move``), for a retry of them all.
_CANCELLED = """
SELECT i.id, i.state FROM statequeue.items i
WHERE i.queue = %(q)s AND i.state = 'cancelled'
  AND NOT EXISTS (SELECT 1 FROM statequeue.live l WHERE l.queue = i.queue AND l.id = i.id)
ORDER BY i.id FOR UPDATE OF i
"""


def _uncancel(conn: Connection, queue: str, item_id: int, reason: str) -> None:
    """A user's retry of a cancelled item: back in the hot table as pending,
    afresh, with its attempts so far; no longer archived, so that `compact`
    moves what it does next (its earlier rows stay in the archive tables)."""
    key = {"q": queue, "id": item_id, "r": reason, "now": time.time()}
    conn.execute(
        "WITH back AS (UPDATE statequeue.items SET state = 'pending', reason = %(r)s,"
        " archived = false WHERE queue = %(q)s AND id = %(id)s RETURNING attempts)"
        " INSERT INTO statequeue.live (queue, id, state, attempts, reason, changed_at)"
        " SELECT %(q)s, %(id)s, 'pending', attempts, %(r)s, %(now)s FROM back",
        key,
    )


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
    # A user's retry starts the item afresh (transitions.starts_afresh).
    conn.execute(
        "UPDATE statequeue.live SET state = 'pending', retry_at = NULL, failures = 0,"
        " crashes = 0, interrupted = false, reason = %(r)s, changed_at = %(now)s"
        " WHERE queue = %(q)s AND id = %(id)s",
        key,
    )


def check_state(
    conn: Connection, queue: str, item_id: int, allowed: tuple[ItemState, ...], verb: str
) -> str:
    if not 0 < item_id < 1 << 63:  # no bigint holds it: no item has it (not a store failure)
        raise transitions.unknown_item(item_id, queue)
    key = {"q": queue, "id": item_id}
    row = conn.execute(
        "SELECT state FROM statequeue.live WHERE queue = %(q)s AND id = %(id)s FOR UPDATE", key
    ).fetchone()
    if row is None:
        row = conn.execute(
            "SELECT state FROM statequeue.items WHERE queue = %(q)s AND id = %(id)s", key
        ).fetchone()
        if row is None:
            raise transitions.unknown_item(item_id, queue)
        # Done or cancelled (no hot row): said as the local store says it.
        transitions.check_allowed(verb, item_id, str(row[0]), allowed)
        if row[0] == ItemState.CANCELLED.value:  # a retry names it: `_uncancel`
            return str(row[0])
        raise transitions.refusal(verb, item_id, str(row[0]))
    state = str(row[0])
    transitions.check_allowed(verb, item_id, state, allowed)
    return state


def policy(
    policy: OnInterrupted, crashes: int, max_crashes: int, report: RecoveryReport
) -> tuple[ItemState, list[int]]:
    """The state recovery moves an item to (store/transitions.py), and the
    list of ``report`` it is counted in."""
    target = transitions.recovery_state(policy, crashes, max_crashes)
    return target, transitions.recovery_bucket(report, target)


def safe(text: str) -> str:
    """Text PostgreSQL can hold: no NUL, no lone surrogate (stderr may have both)."""
    if text.isascii() and "\0" not in text:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\x00")


def now() -> float:
    return round(time.time(), 3)


def end_record(claim: Claim, outcome: Outcome, target: ItemState, retry_at: float | None) -> Record:
    """The attempt's ``end`` event (store/transitions.py), with its fencing token."""
    rec = transitions.end_record(claim, outcome, target, at=now(), text=safe)
    if retry_at is not None and not outcome.ok:
        rec["retry_at"] = retry_at
    if claim.token is not None:
        rec["token"] = claim.token
    return rec
