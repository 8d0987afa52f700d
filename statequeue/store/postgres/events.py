"""The PostgreSQL store's event feed (`statequeue events [--follow]`), exact
even when transactions commit out of seq order.

``seq`` comes from a sequence, taken when a row is inserted, not when its
transaction commits: a transaction that took seq 10 may commit after the one
that took seq 11. A reader that keeps ``seq > last seen`` reads 11, then
never reads 10. So each event also records the id of the transaction that
wrote it (``xid``, a column default), and the cursor is a pair:

- ``horizon``: the oldest transaction still running when the last read
  began (``pg_snapshot_xmin`` of its snapshot). Every transaction below it
  had ended, and none can start below it later, so the events with ``xid <
  horizon`` are a closed set: all of them were visible to that read.
- ``seen``: the seqs of events already delivered whose ``xid`` is at or above
  the horizon (their transactions ended after the oldest running one began).

A read takes one snapshot, selects the events with ``xid >= horizon`` that
are not in ``seen``, in seq order, and moves the horizon up to its own
snapshot's xmin. An event whose transaction was still open is invisible to
that read and its xid is at or above the new horizon: the next reads select
it once it commits. Nothing is skipped and nothing is delivered twice. The
cost: ``seen`` and each read's scan cover the events written since the
oldest open transaction began (a transaction held open for long anywhere in
the cluster makes them grow).
"""

from __future__ import annotations

from typing import Any

from statequeue.core.records import Record
from statequeue.store.postgres.connection import Connection

PAGE = 5_000

# The events since the horizon, wherever they are now: compaction moves a
# done item's events to ``archived_events`` (keeping seq and xid, in one
# transaction: a read sees each event in one table or the other), maybe
# before this follower read them (schema version 14).
_SINCE = """
SELECT seq, xid, body FROM statequeue.events
WHERE queue = %(q)s AND xid >= %(horizon)s::xid8
UNION ALL
SELECT seq, xid, body FROM statequeue.archived_events
WHERE queue = %(q)s AND xid >= %(horizon)s::xid8 AND xid IS NOT NULL
"""

_READ = f"""
SELECT seq, xid::text, body FROM ({_SINCE}) e
WHERE NOT (seq = ANY(%(seen)s::bigint[]))
ORDER BY seq LIMIT %(n)s
"""

# The oldest xid among the events this read left for the next (a page cut it
# short): the horizon may not pass them.
_LEFT_OVER = f"""
SELECT min(xid)::text FROM ({_SINCE}) e
WHERE seq > %(last)s AND NOT (seq = ANY(%(seen)s::bigint[]))
"""


def read_events(conn: Connection, queue: str, cursor: object | None) -> tuple[list[Record], object]:
    """Events committed since ``cursor`` (None: all), in seq order, and the new cursor."""
    horizon, seen = _parse(cursor)
    params: dict[str, Any] = {"q": queue, "horizon": str(horizon), "seen": sorted(seen), "n": PAGE}
    with conn.transaction():
        # One snapshot for the horizon and the rows it vouches for.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
        assert row is not None
        new_horizon = int(row[0])
        rows = conn.execute(_READ, params).fetchall()
        if len(rows) == PAGE:
            left = conn.execute(_LEFT_OVER, {**params, "last": int(rows[-1][0])}).fetchone()
            if left is not None and left[0] is not None:
                new_horizon = min(new_horizon, int(left[0]))
    new_horizon = max(new_horizon, horizon)
    delivered = {int(seq): int(xid) for seq, xid, _ in rows}
    still = {s: x for s, x in seen.items() if x >= new_horizon}
    still.update((s, x) for s, x in delivered.items() if x >= new_horizon)
    records: list[Record] = [{**body, "seq": int(seq)} for seq, _, body in rows]
    return records, EventCursor(new_horizon, still)


class EventCursor:
    """Where an event reader is: see the module docstring. Opaque to callers."""

    __slots__ = ("horizon", "seen")

    def __init__(self, horizon: int, seen: dict[int, int]) -> None:
        self.horizon = horizon
        self.seen = seen
        """seq -> xid of each delivered event at or above the horizon."""


def _parse(cursor: object | None) -> tuple[int, dict[int, int]]:
    if isinstance(cursor, EventCursor):
        return cursor.horizon, dict(cursor.seen)
    return 0, {}
