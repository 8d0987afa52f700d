"""A claimed attempt that is only a ``--verify`` check so far (PostgreSQL).

``live.checking`` holds the token of the attempt whose check runs: set by
``check_starts``, cleared by ``check_ends`` (the command starts). An item
whose lease runs out (or whose runner on this host died) while ``checking``
is its token is given back as pending without counting the attempt or a
crash: its command never ran (store/transitions.py, as the journal does).
Keyed by token, not a flag: a later claim of the item has a new token, so a
mark left by an attempt settled otherwise never applies to it.
"""

from __future__ import annotations

import time

from statequeue.core.models import Claim
from statequeue.store import transitions
from statequeue.store.postgres import writes
from statequeue.store.postgres.connection import Connection

V12_CHECKS = """
-- The token of a running attempt that is only a --verify check so far
-- (check_marks.py): its runner's death is then no crash of the item.
ALTER TABLE statequeue.live ADD COLUMN IF NOT EXISTS checking bigint;
-- Pending items marked interrupted, for `status` (few; pending may be many).
CREATE INDEX IF NOT EXISTS live_interrupted ON statequeue.live (queue, id)
    WHERE interrupted AND state = 'pending';
"""


def mark(conn: Connection, queue: str, claim: Claim, *, over: bool) -> None:
    """Mark ``claim``'s attempt as being checked (or, ``over``, no longer);
    ClaimLost for a stale token, nothing written."""
    with conn.transaction():
        row = conn.execute(
            "UPDATE statequeue.live SET checking = %(mark)s"
            " WHERE queue = %(q)s AND id = %(id)s AND token = %(token)s AND state = 'running'"
            " RETURNING id",
            {
                "q": queue,
                "id": claim.item_id,
                "token": claim.token,
                "mark": None if over else claim.token,
            },
        ).fetchone()
        if row is None:
            raise writes.stale(claim)
        writes.event(conn, queue, transitions.check_record(claim, over=over, at=writes.now()))


def give_back_unchecked(conn: Connection, queue: str, item_id: int, attempt: int) -> None:
    """Settle ``item_id``'s attempt ``attempt``, whose runner died during its
    check: pending again, that attempt uncounted, its crash count and its
    mark of an earlier interruption kept (the caller holds its row)."""
    row = conn.execute(
        "UPDATE statequeue.live SET state = 'pending', attempts = %(a)s, token = NULL,"
        " runner = NULL, holder = NULL, lease_until = NULL, checking = NULL,"
        " reason = %(r)s, changed_at = %(now)s WHERE queue = %(q)s AND id = %(id)s"
        " RETURNING interrupted",
        {
            "q": queue,
            "id": item_id,
            "a": attempt - 1,
            "r": transitions.check_interrupted_reason(attempt),
            "now": time.time(),
        },
    ).fetchone()
    writes.count(conn, queue, {"running": -1, "pending": 1})
    crashed = bool(row and row[0])
    rec = transitions.check_interrupted_record(item_id, attempt, crashed=crashed, at=writes.now())
    writes.event(conn, queue, rec)
