"""The PostgreSQL store's enqueue and user actions (retry, cancel, pause,
compact, import) and its attempts' logs: what ``PostgresStore`` writes outside
the claim, finish and lease paths (claims.py). The store holds an ``Actions``
and hands these calls to it.

A write that may give runners work sends a notify in its transaction
(notify.py), so ``Actions`` holds the queue's ``Notifier``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

from statequeue.core.errors import StateQueueError
from statequeue.core.models import Claim, EnqueueResult, ItemState
from statequeue.core.views import CompactResult
from statequeue.store import transitions
from statequeue.store.postgres import archive, logs, queries, sql, transfer, writes
from statequeue.store.postgres.notify import Notifier
from statequeue.store.postgres.session import Session

if TYPE_CHECKING:
    from statequeue.core.exported import ExportedItem

ENQUEUE_BATCH = 20_000


class Actions:
    """Enqueue and the user's actions on queue ``name`` (see the module docstring)."""

    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self.name = name
        self._notifier = Notifier(name)

    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        unique = list(dict.fromkeys(items))
        added = 0
        for start in range(0, len(unique), ENQUEUE_BATCH):
            batch = [os.fsencode(t) for t in unique[start : start + ENQUEUE_BATCH]]
            keys = [hashlib.sha256(b).digest() for b in batch]
            with self._session.transaction() as conn:
                # The row lock serialises enqueuers of this queue: ids follow
                # input order, and two enqueuers cannot deadlock on the index.
                first, _ = writes.lock_queue(conn, self.name)
                # The statement's estimated cost passes jit_above_cost; compiling
                # it costs more than it saves on a batch of index probes.
                conn.execute("SET LOCAL jit = off")
                params = {"q": self.name, "items": batch, "keys": keys, "first": first}
                row = conn.execute(sql.ENQUEUE, params).fetchone()
                n = int(row[0]) if row else 0
                if n:
                    conn.execute(
                        "UPDATE statequeue.queues SET next_id = next_id + %s WHERE name = %s",
                        (n, self.name),
                    )
                    writes.count(conn, self.name, {"pending": n})
                    writes.event(
                        conn, self.name, {"t": "enq", "id": first, "n": n, "at": writes.now()}
                    )
                    self._notifier.notify(conn)
            added += n
        return EnqueueResult(added=added, skipped=len(items) - added)

    def retry(
        self, ids: Sequence[int] | None, *, states: Collection[ItemState] = transitions.RETRYABLE
    ) -> list[int]:
        allowed = transitions.retry_allowed(ids, states)
        with self._session.transaction() as conn:
            changed = writes.set_state(conn, self.name, ids, ItemState.PENDING, allowed, "retry")
            if changed:
                self._notifier.notify(conn)
            return changed

    def cancel(self, ids: Sequence[int]) -> list[int]:
        allowed = transitions.CANCELLABLE
        with self._session.transaction() as conn:
            return writes.set_state(conn, self.name, ids, ItemState.CANCELLED, allowed, "cancel")

    def set_paused(self, paused: bool) -> None:
        with self._session.transaction() as conn:
            conn.execute(
                "UPDATE statequeue.queues SET paused = %s WHERE name = %s", (paused, self.name)
            )
            writes.event(conn, self.name, transitions.pause_record(paused, at=writes.now()))
            if not paused:
                self._notifier.notify(conn)

    def compact(self) -> CompactResult:
        """Folds the count deltas into the counters, then moves done and
        cancelled items' results and events to the archive tables, in batches
        (see archive.py). There is no journal: the byte sizes are 0."""
        with self._session.guard():
            queries.roll_up_counts(self._session.conn, self.name)
            moved = archive.archive_finished(self._session.conn, self.name)
        return CompactResult(
            bytes_before=0,
            bytes_after=0,
            archived=moved.items,
            archive_bytes=0,
            rows_moved=moved.rows,
        )

    def save_log(self, claim: Claim, data: bytes) -> bool:
        # Asynchronous commit: the finish that follows commits synchronously,
        # which flushes the WAL past this log too. Lost only with its attempt.
        with self._session.guard():
            return logs.save(self._session.conn, self.name, claim, data)

    def import_items(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        result = transfer.import_items(self._session.transaction, self.name, entries)
        if result.added:
            with self._session.transaction() as conn:
                self._notifier.notify(conn)
        return result

    def send_owed_notify(self) -> None:
        """The notify the throttle held back, if any, sent now (the store is
        closing); a failure to send it is ignored."""
        if self._notifier.owed and not self._session.conn.closed:
            with suppress(StateQueueError), self._session.transaction() as conn:
                self._notifier.notify(conn, force=True)
