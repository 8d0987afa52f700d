"""Who holds one of statequeue's advisory locks, and waiting for them boundedly.

Any role that can connect may take any advisory lock (they are not
privileged): another session holding the migration lock, or a queue's reap
lock, must never make a command hang or a runner stop recovering silently.
A wait is bounded by STATEQUEUE_LOCK_TIMEOUT (exit 8, naming the holder), and
a reaper that keeps finding its lock held says once who holds it.
"""

from __future__ import annotations

import time

from statequeue.core.errors import LockTimeout
from statequeue.store.journal.locks import LOCK_TIMEOUT_ENV, lock_timeout
from statequeue.store.postgres.connection import Connection

# A two-key advisory lock shows in pg_locks as classid = key 1, objid = key 2
# (their bits as an oid) and objsubid = 2. pg_locks and these columns of
# pg_stat_activity are readable by every role.
_HOLDER = """
SELECT l.pid, a.usename, a.application_name
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                    WHERE d.datname = pg_catalog.current_database())
  AND l.classid = (%(k1)s::integer)::oid AND l.objid = (%(k2)s::integer)::oid
  AND l.pid <> pg_catalog.pg_backend_pid()
ORDER BY l.pid
LIMIT 1
"""


def holder(conn: Connection, key1: int, key2: int) -> str | None:
    """``pid N (role R, application A)`` of the session holding the lock, or None."""
    row = conn.execute(_HOLDER, {"k1": key1, "k2": key2}).fetchone()
    if row is None:
        return None
    pid, role, app = row
    about = [f"role {role}" if role else "role unknown"]
    if app:
        about.append(f"application {app!r}")
    return f"pid {pid} ({', '.join(about)})"


def take(conn: Connection, key1: int, key2: int, what: str) -> None:
    """Take the transaction-scoped advisory lock (key1, key2), waiting up to
    the lock timeout; then LockTimeout naming the holder. Inside a transaction."""
    limit = lock_timeout()
    deadline = time.monotonic() + limit
    pause = 0.005
    while True:
        row = conn.execute(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(%s::integer, %s::integer)", (key1, key2)
        ).fetchone()
        if row and row[0]:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            who = holder(conn, key1, key2) or "another session"
            raise LockTimeout(
                f"the PostgreSQL store's {what} (advisory lock {key1}, {key2}) stayed held for "
                f"{limit:g} s ({LOCK_TIMEOUT_ENV}) by {who}; nothing was changed"
            )
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.25)


def key_of(conn: Connection, name: str) -> int:
    """The second key of a queue's lock: the hash of its name, as the SQL takes it."""
    row = conn.execute("SELECT pg_catalog.hashtext(%s)", (name,)).fetchone()
    return int(row[0]) if row else 0
