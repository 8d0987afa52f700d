"""`fsck` on PostgreSQL: recount the states, compare them with the counters
``status`` reads (promise 8), and report what holds back vacuum.

The recount and the counters are read in one REPEATABLE READ snapshot: every
writer inserts its count deltas in the transaction that changes the state,
so in any snapshot the two agree unless a counter is wrong. A repair inserts
the difference as one more delta, computed in that same snapshot: writers
that commit meanwhile add their own deltas, and the sum stays right without
stopping them.
"""

from __future__ import annotations

from typing import Any

from statequeue.core.models import ItemState
from statequeue.core.views import CountMismatch, StoreCheck
from statequeue.store.postgres import sql
from statequeue.store.postgres.connection import Connection
from statequeue.store.postgres.writes import count

OLD_TRANSACTION = 300.0
"""Seconds after which an open transaction is reported: it keeps vacuum from
removing the dead rows of the hot table, which then bloats."""

RECOUNT = """
SELECT coalesce(l.state, i.state), count(*) FROM statequeue.items i
LEFT JOIN statequeue.live l ON l.queue = i.queue AND l.id = i.id
WHERE i.queue = %(q)s GROUP BY 1
"""

# Only sessions of this database hold back the vacuum of its tables. Another
# role's sessions show xact_start only to members of pg_read_all_stats.
OLDEST_TRANSACTION = """
SELECT pid, usename, application_name, state, extract(epoch FROM now() - xact_start)
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND xact_start < now() - make_interval(secs => %(age)s)
ORDER BY xact_start LIMIT 1
"""


def check(conn: Connection, queue: str, *, repair: bool) -> StoreCheck:
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        recounted = _states(conn.execute(RECOUNT, {"q": queue}).fetchall())
        counted = _states(conn.execute(sql.COUNTS, {"q": queue}).fetchall())
        mismatches = tuple(
            CountMismatch(state, counted[state], recounted[state])
            for state in recounted
            if counted[state] != recounted[state]
        )
        if repair and mismatches:
            count(conn, queue, {m.state: m.recounted - m.counted for m in mismatches})
    return StoreCheck(
        queue=queue,
        counts=recounted,
        mismatches=mismatches,
        repaired=repair and bool(mismatches),
        warnings=tuple(filter(None, [oldest_transaction(conn)])),
    )


def _states(rows: list[tuple[Any, ...]]) -> dict[str, int]:
    found = {s.value: 0 for s in ItemState}
    for state, n in rows:
        found[str(state)] = int(n)
    return found


def oldest_transaction(conn: Connection) -> str:
    """A sentence about the oldest transaction open longer than OLD_TRANSACTION
    in this database, or "" when there is none."""
    row = conn.execute(OLDEST_TRANSACTION, {"age": OLD_TRANSACTION}).fetchone()
    if row is None:
        return ""
    pid, user, app, state, age = row
    return (
        f"a transaction has been open for {_minutes(float(age))} (pid {pid}, user {user}, "
        f"application {app or '-'}, {state}): it holds back vacuum, so dead rows of the "
        "hot table pile up; end it (pg_terminate_backend) if it is stuck"
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
