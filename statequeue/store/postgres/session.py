"""The PostgreSQL store's own connection, and its patience when it is lost.

A store that serves a runner outlives a database restart or a terminated
backend: ``patiently`` reopens the connection with backoff and runs the
action again (every action given to it is safe to repeat), for up to
``patience`` seconds per call (PATIENCE unless the runner asks for less, to
keep an eye on its signals and children between calls), but never past the
moment the first lease the store holds needs fencing: the runner must then
stop its children, not wait. The backoff spans calls: an outage that outlasts
one call is not hammered harder by the next. Other callers (enqueue, status)
get StoreUnreachable at once.

Timed on the lease clock (lease_clock.py), as the fencing deadlines are.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

import psycopg

from statequeue.core import lease_clock
from statequeue.core.errors import StoreUnreachable
from statequeue.store.postgres.connection import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    Connection,
    connect,
    guarded,
    is_lost,
)

T = TypeVar("T")
PATIENCE = 60.0
"""How long a runner's store call keeps reconnecting (unless a lease needs fencing first)."""
PREVIOUS_WAIT = 5.0
"""Longest wait for the server process of a lost connection to end."""

# Set at every connect, with the server process's start: a process id alone
# may name another connection's process later (ids are reused).
_OPENED = """
SELECT pg_catalog.set_config('synchronous_commit', 'on', false), backend_start
FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()
"""
_END = """
SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
WHERE pid = %s AND backend_start = %s
"""
_LIVES = "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = %s AND backend_start = %s"


class Session:
    """The connection of one store; ``conn`` changes when it is reopened.

    Every part of the store (reads, actions, claims) goes through it:
    ``guard`` or ``transaction`` where a call fails at once, ``patiently``
    where a runner must survive a restart of the server."""

    def __init__(self, url: str, fence_at: Callable[[], float | None]) -> None:
        self.url = url
        self.fence_at = fence_at
        self.patience = 0.0  # > 0 once a runner uses the store: reconnect
        self.generation = 0  # connections opened so far (a change: some commits may be lost)
        self._pause = BACKOFF_FIRST  # the next wait between two tries (grows while down)
        self._next_try = 0.0  # lease-clock time of the next try while down
        self._last = ""  # why the last try failed
        self.backend: tuple[int, object] | None = None  # ``conn``'s server process (pid, start)
        self.lost: list[tuple[int, object]] = []  # those of lost connections, maybe still at work
        self.conn = self._open()

    def _open(self, until: float | None = None) -> Connection:
        conn = connect(self.url) if until is None else self._reconnect(until)
        self.generation += 1
        if self.backend is not None:
            self.lost = [*self.lost[-7:], self.backend]  # the last few: older ones ended long ago
        with guarded(self.url):
            # Whatever the database's default: a result is on the server's
            # disk before finish() returns (promise 1); finish(sync=False)
            # lowers it per transaction, for group commit.
            row = conn.execute(_OPENED).fetchone()
        self.backend = (conn.info.backend_pid, None if row is None else row[1])
        return conn

    def _reconnect(self, until: float) -> Connection:
        """``connect``, tried again with jittered exponential backoff until
        the lease-clock time ``until``; then the last StoreUnreachable."""
        while True:
            wait = self._next_try - lease_clock.now()
            if wait > 0:
                if wait > until - lease_clock.now():
                    raise StoreUnreachable(self._last)
                time.sleep(wait)
            try:
                conn = connect(self.url)
            except StoreUnreachable as exc:
                self._last = str(exc)
                # Jitter, not security: runners of many hosts do not retry in step.
                self._next_try = lease_clock.now() + self._pause * random.uniform(0.5, 1.0)
                self._pause = min(self._pause * 2, BACKOFF_MAX)
                if lease_clock.now() >= until:
                    raise
                continue
            self._pause, self._next_try = BACKOFF_FIRST, 0.0
            return conn

    def patiently(self, action: Callable[[Connection], T]) -> T:
        """``action(connection)``, run again on a new connection if this one
        is lost (with patience only; see the module docstring)."""
        start = lease_clock.now()
        while True:
            try:
                with guarded(self.url):
                    return action(self.conn)
            except StoreUnreachable as exc:
                if not self.patience or not is_lost(self.conn):
                    raise
                self._last = str(exc)
                until = start + self.patience
                fence = self.fence_at()
                self.conn = self._open(until if fence is None else min(until, fence))

    def wait_for_previous(self, conn: Connection, timeout: float = PREVIOUS_WAIT) -> None:
        """End the server processes of the lost connections this one
        replaced, and wait (at most ``timeout``) until they are gone. A
        statement whose answer was lost may still run there, or not have
        begun (its bytes on the way, or not yet read): it would commit after
        a retry looked for what it did. Once its process is gone it committed,
        or never will: a call retried on ``conn`` then sees what its first
        try did. Waiting for its statement to end was not enough: one not
        yet begun looks idle (CI under load: the retry claimed item 1, the
        first try item 2 for a runner that never heard of it)."""
        lost, self.lost = self.lost, []
        end = lease_clock.now() + timeout
        for pid, started in lost:
            if started is None:
                continue  # not known: another connection's process may have its id now
            # Not allowed to end it (another role's?): it is waited for.
            with suppress(psycopg.Error):
                conn.execute(_END, (pid, started))
            while lease_clock.now() < end:
                if conn.execute(_LIVES, (pid, started)).fetchone() is None:
                    break
                time.sleep(0.01)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Database errors inside become StoreUnreachable or StateQueueError
        (connection.py), with the password masked."""
        with guarded(self.url):
            yield

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One guarded transaction on the current connection (committed
        synchronously: the session's setting)."""
        with guarded(self.url), self.conn.transaction():
            yield self.conn

    def close(self) -> None:
        self.conn.close()
