"""Waking `run --follow` runners with LISTEN/NOTIFY, polling as the fallback.

A write that may give runners work (enqueue, retry, resume, import) sends one
NOTIFY on the queue's channel inside its transaction, so it is delivered when
(and only if) the work commits. NOTIFY takes a cluster-wide lock at commit,
so each process sends at most one per ``THROTTLE`` seconds per queue; a
notify it held back goes out with its next notifying write past the throttle,
or when the store closes.
A notify is only a hint: a follower still polls at its follow interval.

A follower LISTENs on a connection of its own (the store's connection is busy
with transactions), whose socket the runner watches beside its children.
"""

from __future__ import annotations

import hashlib
import time

import psycopg
from psycopg import sql

from statequeue.core.errors import StateQueueError
from statequeue.store.postgres.connection import Connection, connect

THROTTLE = 0.25
"""Seconds between two notifies one process sends for one queue."""
RECONNECT_EVERY = 5.0
"""Seconds between attempts to reopen a lost listening connection."""


def channel(queue: str) -> str:
    """The queue's channel: a fixed-length name derived from the queue name, so
    it is always a valid identifier (at most 63 bytes) whatever the name holds."""
    return "statequeue_" + hashlib.sha256(queue.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class Notifier:
    """Sends a queue's notifies, throttled per process."""

    def __init__(self, queue: str) -> None:
        self.channel = channel(queue)
        self._sent_at = -THROTTLE
        self.owed = False
        """A notify was held back by the throttle and is not sent yet."""

    def notify(self, conn: Connection, *, force: bool = False) -> None:
        """Inside the caller's transaction: notify, unless one went out less
        than THROTTLE seconds ago (then it is owed)."""
        now = time.monotonic()
        if not force and now - self._sent_at < THROTTLE:
            self.owed = True
            return
        # pg_notify takes the channel as a value: nothing to quote.
        conn.execute("SELECT pg_notify(%s, '')", (self.channel,))
        self._sent_at = now
        self.owed = False


class Listener:
    """A connection that LISTENs on one queue's channel, opened on first use."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.channel = channel(queue)
        self._conn: Connection | None = None
        self._lost = False
        self._tried_at = -RECONNECT_EVERY

    def fileno(self) -> int | None:
        """The socket to watch, or None while the server cannot be reached
        (tried again at most every RECONNECT_EVERY seconds; the follower polls)."""
        if self._conn is not None and self._lost:
            self.close()  # the caller stopped watching it: now it may go
        if self._conn is not None:
            return self._conn.fileno()
        now = time.monotonic()
        if now - self._tried_at < RECONNECT_EVERY:
            return None
        self._tried_at = now
        try:
            conn = connect(self.url)  # its search_path pinned, as every connection's
        except StateQueueError:  # unreachable: tried again later
            return None
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except psycopg.Error:
            conn.close()
            return None
        self._conn = conn
        return conn.fileno()

    def drain(self) -> bool:
        """Consume the notifies that arrived; False if the connection is lost
        (closed by the next ``fileno``, once the caller stopped watching it)."""
        if self._conn is None:
            return False
        try:
            for _ in self._conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            self._lost = True
        self._lost = self._lost or self._conn.closed
        return not self._lost

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._lost = False
