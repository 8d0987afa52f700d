"""The leases one PostgreSQL store holds, and the heartbeat that renews them.

A claim's lease ends ``lease`` seconds after the database's clock read the
claim; the heartbeat thread, on its own connection, renews every held lease
in one statement every ``lease / 3``. Self-fencing trusts no clock but this
machine's lease clock (lease_clock.py: CLOCK_BOOTTIME where there is one, so
a suspend counts, as it does on the database's clock): a lease counts as
held until ``sent + FENCE_AT * lease``, where ``sent`` is when the last
renew that succeeded (or the claim) was *sent*. The server set the new end
after it received that statement, so the end is no earlier than ``sent +
lease`` on this clock, as long as the two clocks run at the same rate. Past
``FENCE_AT`` the claim is reported lost (``lost``): the runner stops its
child, TERM then KILL by ``KILL_BY``; the rest of the lease is the margin
for the clocks' rates and the kill itself.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from statequeue.core import lease_clock
from statequeue.store.base import DEFAULT_LEASE
from statequeue.store.postgres import sql
from statequeue.store.postgres.connection import Connection, connect

FENCE_AT = 0.75
"""Fraction of the lease after the last good renew was sent: stop the children (TERM)."""
KILL_BY = 0.875
"""Fraction of the lease by which they are killed (KILL); the last eighth is the margin."""
RENEW_EVERY = 1 / 3
RETRY_EVERY = 0.1
"""Fraction of the lease between renew attempts after one failed."""


def kill_grace(lease: float, grace: float) -> float:
    """The TERM -> KILL wait when self-fencing: ``grace``, but never past ``KILL_BY``."""
    return max(0.0, min(grace, (KILL_BY - FENCE_AT) * lease))


class Leases:
    """The tokens a store holds, when each was last confirmed, and the heartbeat.

    Thread-safe: the store's thread adds and drops tokens, the heartbeat
    thread renews them."""

    def __init__(self, url: str, queue: str, lease: float = DEFAULT_LEASE) -> None:
        self.url = url
        self.queue = queue
        self.lease = lease
        self.runners: set[str] = set()
        # runner id -> its persistent workers as last published, written with each renew
        self.workers: dict[str, list[list[Any]]] = {}
        self._sent: dict[int, float] = {}  # token -> lease-clock time its last good renew was sent
        self._lost: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Connection | None = None
        # Lease-clock time of the last renewal that found every runner's row
        # (``registered``): a runner frozen longer than a lease checks its
        # row before it claims again.
        self.confirmed = lease_clock.now()

    def hold(self, token: int, sent: float) -> None:
        """Start counting ``token``'s lease from ``sent`` (when its claim was sent)."""
        with self._lock:
            self._sent[token] = sent
        self.start()

    def drop(self, token: int | None) -> None:
        """Stop renewing ``token`` (finished, released or fenced)."""
        with self._lock:
            self._sent.pop(token or 0, None)
            self._lost.discard(token or 0)

    def lost(self) -> set[int]:
        """Tokens held no longer, each reported once: the renew found them
        taken, or their fence time passed. They are not renewed again."""
        now = lease_clock.now()
        limit = FENCE_AT * self.lease
        with self._lock:
            gone = self._lost | {t for t, sent in self._sent.items() if now >= sent + limit}
            for token in gone:
                self._sent.pop(token, None)
            self._lost.clear()
        return gone

    def publish(self, runner_id: str, rows: list[list[Any]]) -> None:
        """Keep ``rows`` (its persistent workers) for ``runner_id``'s row, written
        with the next renew: never a statement of the runner's own thread, which
        a partition must not hold up."""
        with self._lock:
            self.workers[runner_id] = rows

    def fence_at(self) -> float | None:
        """The lease-clock time the first held lease must be fenced, if none is renewed first."""
        with self._lock:
            first = min(self._sent.values(), default=None)
        return None if first is None else first + FENCE_AT * self.lease

    def kill_by(self, token: int | None) -> float | None:
        """When ``token``'s processes must be dead at the latest (KILL_BY of its lease)."""
        with self._lock:
            sent = self._sent.get(token or 0)
        return None if sent is None else sent + KILL_BY * self.lease

    def start(self) -> None:
        """Start the heartbeat (once; it runs until ``close``)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._beat, name="statequeue-heartbeat", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # a renew hung in a partition is abandoned (daemon)
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()

    def _beat(self) -> None:
        wait = self.lease * RENEW_EVERY
        while not self._stop.wait(wait):
            lost = self.renew_now()
            wait = self.lease * (RENEW_EVERY if lost is not None else RETRY_EVERY)

    def own(self) -> list[str]:
        """The runners this store has registered and not yet unregistered."""
        with self._lock:
            return sorted(self.runners)

    def renew_now(self) -> set[int] | None:
        """Renew every held lease and the runners' rows in one statement; the
        tokens found lost (taken over, or expired), which ``lost`` reports
        next. None if the database could not be reached (the next try reconnects)."""
        with self._lock:
            tokens = list(self._sent)
            runners = list(self.runners)
            workers = Jsonb(dict(self.workers))
        if not tokens and not runners:
            return set()
        sent = lease_clock.now()
        params = {"q": self.queue, "tokens": tokens, "runners": runners, "lease": self.lease}
        params["workers"] = workers
        try:
            conn = self._connection()
            rows = conn.execute(sql.RENEW, params).fetchall()
        except Exception:  # any failure: drop the connection, try again soon
            self._reset()
            return None
        renewed = {int(r[0]) for r in rows if r[0] is not None}
        missing = set(runners) - {str(r[1]) for r in rows if r[1] is not None}
        self._revive(conn, missing)
        if not missing:
            self.confirmed = max(self.confirmed, sent)
        lost = set()
        with self._lock:
            for token in tokens:
                if token not in self._sent:
                    continue  # finished or fenced meanwhile
                if token in renewed:
                    self._sent[token] = max(self._sent[token], sent)
                else:
                    lost.add(token)
            self._lost |= lost
        return lost

    def overdue(self) -> bool:
        """No renewal has confirmed the runners' rows for a lease or more (the
        process was frozen, or the database out of reach): ``registered``
        must be checked before the next claim."""
        return lease_clock.now() - self.confirmed > self.lease

    def registered(self, conn: Connection, runner_id: str) -> bool:
        """Whether ``runner_id`` still has its row in this queue (a stopped
        one, marked lost by a reaper, counts: it is revived). None is left
        when the queue was dropped while the runner was frozen; a queue of
        the same name made since has none of it either."""
        row = conn.execute(
            "SELECT 1 FROM statequeue.runners WHERE queue = %s AND runner_id = %s",
            (self.queue, runner_id),
        ).fetchone()
        if row is not None:
            self.confirmed = max(self.confirmed, lease_clock.now())
        return row is not None

    def _revive(self, conn: Connection, stopped: set[str]) -> None:
        """Make this store's runners in ``stopped`` (rows a reaper marked lost
        while this process was frozen) alive again, but for one unregistered
        meanwhile (a clean stop). Best effort, apart from the leases renewed
        already: a failure is tried again at the next renewal."""
        with self._lock:
            stopped &= self.runners
        if not stopped:
            return
        try:
            conn.execute(sql.REVIVE, {"q": self.queue, "runners": sorted(stopped)})
        except Exception:  # the next renewal reconnects and tries again
            self._reset()

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._reset()
            self._conn = connect(self.url)
        return self._conn

    def _reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None
