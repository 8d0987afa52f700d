"""The PostgreSQL store's rows for ``run --rate`` and for deferrals (schema
version 8, ``schema._V8_RATES``): one bucket row per queue, shared by the runners of
every host, and each item's count of deferrals.

Taking a start is one ``UPDATE ... RETURNING`` on the queue's row, timed by
the database clock (``clock_timestamp()``), so hosts whose clocks disagree
still share one rate; it refills as ``rate_bucket.take`` does. Setting the
bucket up and the AIMD feedback are rarer: the row is read ``FOR UPDATE``,
changed by the same functions as the other stores' buckets (rate_bucket.py),
and written back, in one transaction. Neither is acknowledged data: a lost
update lets at most a burst start early.
"""

from __future__ import annotations

import time
from dataclasses import replace

from statequeue.core.models import Claim, ItemState, Outcome
from statequeue.store import transitions
from statequeue.store.postgres import writes
from statequeue.store.postgres.connection import Connection
from statequeue.store.rate_bucket import LATE_SLACK, LATE_WINDOW, Bucket, BucketChange

_NOW = "extract(epoch FROM clock_timestamp())::float8"

# One statement: refill at the current rate up to the burst (a clock step back
# earns nothing), and up to its slack only for a taker at most the late window
# after the bucket filled up, take a token if there is one, say how long until
# the next: rate_bucket.refill and rate_bucket.take in SQL. A start is always
# there when the bucket is full, so the stamp is always now.
_TAKE = f"""
WITH t AS (SELECT {_NOW} AS now), b AS (
    SELECT r.queue, r.rate_now, t.now,
           least(
               CASE WHEN t.now - (r.stamp + (r.burst - r.tokens) / r.rate_now) > %(window)s
                    THEN r.burst ELSE r.burst + %(slack)s END,
               r.tokens + greatest(0.0, t.now - r.stamp) * r.rate_now
           ) AS have
    FROM statequeue.rate_buckets r, t
    WHERE r.queue = %(q)s
    FOR UPDATE OF r
)
UPDATE statequeue.rate_buckets r
SET tokens = CASE WHEN b.have >= 1 - 1e-9 THEN greatest(0.0, b.have - 1) ELSE b.have END,
    stamp = b.now
FROM b WHERE r.queue = b.queue
RETURNING CASE WHEN b.have >= 1 - 1e-9 THEN 0.0 ELSE (1 - b.have) / b.rate_now END, b.rate_now
"""

_COLUMNS = "lim, burst, rate_now, tokens, stamp, peak, cut_at"


def take(conn: Connection, queue: str) -> tuple[float, float] | None:
    """(seconds to wait, current rate) from the queue's bucket as it is
    (whatever limit it has), a start taken when the wait is 0; None when the
    queue has no bucket (the caller sets it up through ``update``)."""
    params = {"q": queue, "slack": LATE_SLACK, "window": LATE_WINDOW}
    row = conn.execute(_TAKE, params).fetchone()
    return None if row is None else (float(row[0]), float(row[1]))


def update(conn: Connection, queue: str, change: BucketChange) -> Bucket | None:
    """Apply ``change`` to the queue's bucket in one transaction (the row
    locked), at the database's time; returns the bucket after."""
    with conn.transaction():
        row = conn.execute(
            f"SELECT {_COLUMNS}, {_NOW} FROM statequeue.rate_buckets WHERE queue = %s FOR UPDATE",
            (queue,),
        ).fetchone()
        if row is None:
            clock = conn.execute(f"SELECT {_NOW}").fetchone()
            now, found = float(clock[0]) if clock else time.time(), None
        else:
            now, found = float(row[7]), Bucket(*(float(v) for v in row[:7]))
        changed = change(found, now)
        if changed is None:
            return found
        # In _COLUMNS' order; ``set_at`` is not kept here (no column: 0, unknown).
        values = tuple(changed.as_dict().values())[: _COLUMNS.count(",") + 1]
        # Two first takes at once both insert: the later one wins, at most a burst lost.
        conn.execute(
            f"INSERT INTO statequeue.rate_buckets (queue, {_COLUMNS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (queue) DO UPDATE SET"
            " lim = EXCLUDED.lim, burst = EXCLUDED.burst, rate_now = EXCLUDED.rate_now,"
            " tokens = EXCLUDED.tokens, stamp = EXCLUDED.stamp, peak = EXCLUDED.peak,"
            " cut_at = EXCLUDED.cut_at",
            (queue, *values),
        )
        return changed


def defer_once(
    conn: Connection, queue: str, claim: Claim, outcome: Outcome, delay: float, most: int
) -> int:
    """Count a deferral of ``claim``'s item and, within ``most``, put it back
    as pending due in ``delay`` seconds with its ``defer`` event, in one
    transaction; ClaimLost for a stale token (nothing written). Returns the
    item's deferrals: past ``most``, the count is cleared and nothing else
    written (the caller records the failure as an attempt's end)."""
    outcome = replace(outcome, reason=writes.safe(outcome.reason))  # no NUL in a jsonb
    with conn.transaction():
        writes.held(conn, queue, claim)
        row = conn.execute(
            "INSERT INTO statequeue.deferrals (queue, id, count) VALUES (%s, %s, 1)"
            " ON CONFLICT (queue, id) DO UPDATE SET count = statequeue.deferrals.count + 1"
            " RETURNING count",
            (queue, claim.item_id),
        ).fetchone()
        count = int(row[0]) if row else 1
        if transitions.deferral_state(count, most) is not ItemState.PENDING:
            # It fails now: a user's `retry` of it starts a new count, as in the
            # journal (where any new episode does; here only this one).
            conn.execute(
                "DELETE FROM statequeue.deferrals WHERE queue = %s AND id = %s",
                (queue, claim.item_id),
            )
            return count
        rec = transitions.defer_record(claim, outcome, delay=delay, deferrals=count, at=time.time())
        rec["token"] = claim.token
        conn.execute(
            "UPDATE statequeue.live SET state = 'pending', retry_at = %(due)s, token = NULL,"
            " runner = NULL, holder = NULL, lease_until = NULL, interrupted = false,"
            " reason = %(r)s, changed_at = %(now)s"
            " WHERE queue = %(q)s AND id = %(id)s AND token = %(token)s",
            {
                "due": rec["retry_at"],
                "r": writes.safe(outcome.reason),
                "now": time.time(),
                "q": queue,
                "id": claim.item_id,
                "token": claim.token,
            },
        )
        writes.count(conn, queue, {"running": -1, "pending": 1})
        writes.event(conn, queue, rec)
        return count


def deferred_waiting(conn: Connection, queue: str) -> int:
    """Pending items that asked to be tried later (``status``)."""
    row = conn.execute(
        "SELECT count(*) FROM statequeue.deferrals d JOIN statequeue.live l"
        " ON l.queue = d.queue AND l.id = d.id WHERE d.queue = %s AND l.state = 'pending'",
        (queue,),
    ).fetchone()
    return int(row[0]) if row else 0


# Compaction moves a done item's events, its deferrals among them, to
# ``archived_events`` (archive.py): both are counted, as the journal store
# counts its archive's. One statement: one snapshot over both tables.
_DEFERRALS = """
SELECT (
    SELECT count(*) FROM statequeue.events WHERE queue = %(q)s AND body->>'t' = 'defer'
    AND (%(since)s::float8 IS NULL OR (body->>'at')::float8 >= %(since)s::float8)
) + (
    SELECT count(*) FROM statequeue.archived_events WHERE queue = %(q)s AND body->>'t' = 'defer'
    AND (%(since)s::float8 IS NULL OR (body->>'at')::float8 >= %(since)s::float8)
)
"""


def deferrals(conn: Connection, queue: str, since: float | None) -> int:
    """The ``defer`` events of the queue, archived ones included (at ``since``
    or later, when given)."""
    row = conn.execute(_DEFERRALS, {"q": queue, "since": since}).fetchone()
    return int(row[0]) if row else 0
