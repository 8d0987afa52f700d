"""The PostgreSQL store's own connection, and its patience when it is lost.

A store that serves a runner outlives a database restart or a terminated
backend: ``patiently`` reopens the connection with backoff and runs the
action again (every action given to it is safe to repeat), for up to
``PATIENCE`` seconds, but never past the moment the first lease the store
holds needs fencing: the runner must then stop its children, not wait.
Other callers (enqueue, status) get StoreUnreachable at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from statequeue.errors import StoreUnreachable
from statequeue.store.postgres.connection import Connection, connect, guarded, is_lost, reconnect

T = TypeVar("T")
PATIENCE = 60.0
"""How long a runner's store call keeps reconnecting (unless a lease needs fencing first)."""


class Session:
    """The connection of one store; ``conn`` changes when it is reopened."""

    def __init__(self, url: str, fence_at: Callable[[], float | None]) -> None:
        self.url = url
        self.fence_at = fence_at
        self.patience = 0.0  # > 0 once a runner uses the store: reconnect
        self.generation = 0  # connections opened so far (a change: some commits may be lost)
        self.conn = self._open()

    def _open(self, until: float | None = None) -> Connection:
        conn = connect(self.url) if until is None else reconnect(self.url, until)
        self.generation += 1
        with guarded(self.url):
            # Whatever the database's default: a result is on the server's
            # disk before finish() returns (promise 1); finish(sync=False)
            # lowers it per transaction, for group commit.
            conn.execute("SET synchronous_commit = on")
        return conn

    def patiently(self, action: Callable[[Connection], T]) -> T:
        """``action(connection)``, run again on a new connection if this one
        is lost (with patience only; see the module docstring)."""
        start = time.monotonic()
        while True:
            try:
                with guarded(self.url):
                    return action(self.conn)
            except StoreUnreachable:
                if not self.patience or not is_lost(self.conn):
                    raise
                until = start + self.patience
                fence = self.fence_at()
                self.conn = self._open(until if fence is None else min(until, fence))

    def close(self) -> None:
        self.conn.close()
