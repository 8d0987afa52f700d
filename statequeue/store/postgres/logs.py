"""Finished attempts' output in the database (promise 11): ``logs`` and ``show``
work from any host.

While an attempt runs, its output goes to a scratch file on the runner's host
(``<home>/.postgres/<queue>/logs/ID.N.log``); when it ends, the runner stores
the file's bytes here (bytea: any bytes round-trip) and removes the file.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from statequeue.core.models import Claim
from statequeue.store.postgres import functions
from statequeue.store.postgres.connection import Connection

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder

SUBFOLDER = "logs"
"""The scratch folder's subfolder for the logs of attempts running on this host."""

SHOWN_PREFIX = "database:logs/"
"""How a stored log is named in ``ItemHistory.log_paths`` (there is no file):
``database:logs/ID.N.log``, so that the name ends with the attempt as a file's does."""


def save(conn: Connection, queue: str, claim: Claim, data: bytes) -> bool:
    """Store ``claim``'s output if its token is current (one statement, fenced
    like finish, committed asynchronously: see functions.py); True when stored
    (or already stored by an earlier call for the same token)."""
    key = {"q": queue, "id": claim.item_id, "attempt": claim.attempt, "token": claim.token}
    row = conn.execute(functions.SAVE_LOG, {**key, "data": data, "at": time.time()}).fetchone()
    return bool(row and row[0])


def read(conn: Connection, queue: str, item_id: int, attempt: int, offset: int) -> bytes | None:
    """Stored output of one attempt from byte ``offset`` on, or None if none is stored."""
    row = conn.execute(
        "SELECT substring(data FROM %(from)s) FROM statequeue.logs"
        " WHERE queue = %(q)s AND id = %(id)s AND attempt = %(attempt)s",
        {"q": queue, "id": item_id, "attempt": attempt, "from": offset + 1},
    ).fetchone()
    return None if row is None else bytes(row[0])


def stored_attempts(conn: Connection, queue: str, item_id: int) -> list[int]:
    rows = conn.execute(
        "SELECT attempt FROM statequeue.logs WHERE queue = %s AND id = %s ORDER BY attempt",
        (queue, item_id),
    ).fetchall()
    return [int(r[0]) for r in rows]


def local_attempts(scratch: QueueFolder | None, item_id: int) -> dict[int, str]:
    """Names of the logs of attempts still running (or not yet stored) on
    this host, in the scratch folder's ``logs``, by attempt."""
    found: dict[int, str] = {}
    for name in scratch.names(SUBFOLDER) if scratch is not None else ():
        stem, _, attempt = name.removesuffix(".log").partition(".")
        if name.endswith(".log") and stem == str(item_id) and attempt.isdigit():
            found[int(attempt)] = name
    return found


def log_paths(
    conn: Connection, queue: str, item_id: int, scratch: QueueFolder | None
) -> tuple[str, ...]:
    """Every attempt's log, oldest first: stored ones by name, this host's
    unstored ones by path."""
    shown: dict[int, str] = {}
    if scratch is not None:
        for n, name in local_attempts(scratch, item_id).items():
            shown[n] = scratch.shown(name, SUBFOLDER)
    for n in stored_attempts(conn, queue, item_id):
        shown[n] = f"{SHOWN_PREFIX}{item_id}.{n}.log"
    return tuple(shown[n] for n in sorted(shown))


def read_local(
    scratch: QueueFolder | None, item_id: int, attempt: int, offset: int
) -> bytes | None:
    name = local_attempts(scratch, item_id).get(attempt)
    if scratch is None or name is None:
        return None
    try:
        # Relative to the checked folder, never through a link, never waiting
        # on a FIFO, and only a file of this user's (folder.py: UnsafeFolder).
        fd = scratch.open_file(name, os.O_RDONLY, sub=SUBFOLDER)
    except FileNotFoundError:
        return None  # stored and removed meanwhile: the caller asks the database again
    with open(fd, "rb") as f:
        f.seek(offset)
        return f.read()


def remove_finished(conn: Connection, queue: str, cutoff: float) -> tuple[int, int]:
    """Delete the stored logs of finished items (done or cancelled: those
    compaction archives, archived yet or not) written before ``cutoff``
    (``compact --keep-logs``); (logs removed, their bytes)."""
    row = conn.execute(
        "WITH gone AS ("
        " DELETE FROM statequeue.logs g USING statequeue.items i"
        " WHERE g.queue = %(q)s AND i.queue = g.queue AND i.id = g.id"
        " AND i.state IN ('done', 'cancelled')"
        " AND g.at < %(cutoff)s RETURNING octet_length(g.data) AS size)"
        " SELECT count(*), coalesce(sum(size), 0) FROM gone",
        {"q": queue, "cutoff": cutoff},
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)
