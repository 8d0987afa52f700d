"""The PostgreSQL store's enqueue and user actions (retry, cancel, pause,
compact, import), its attempts' logs and the follower's wake-ups: what
``PostgresStore`` does outside the claim, finish and lease paths (kept apart
so that store.py holds those, as reading.py holds the reads).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from statequeue.core.models import Claim, EnqueueResult, ItemState
from statequeue.store import transitions
from statequeue.store.postgres import archive, logs, reads, sql, transfer, writes
from statequeue.store.postgres.notify import Listener, Notifier
from statequeue.store.postgres.reading import PostgresReading

if TYPE_CHECKING:
    from statequeue.core.exported import ExportedItem
    from statequeue.core.views import CompactResult

ENQUEUE_BATCH = 20_000


class PostgresActions(PostgresReading):
    """Enqueue and the user's actions on one queue (see the module docstring)."""

    _notifier: Notifier
    _listener: Listener | None

    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        unique = list(dict.fromkeys(items))
        added = 0
        for start in range(0, len(unique), ENQUEUE_BATCH):
            batch = [os.fsencode(t) for t in unique[start : start + ENQUEUE_BATCH]]
            keys = [hashlib.sha256(b).digest() for b in batch]
            with self._tx() as conn:
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
        with self._tx() as conn:
            changed = writes.set_state(conn, self.name, ids, ItemState.PENDING, allowed, "retry")
            if changed:
                self._notifier.notify(conn)
            return changed

    def cancel(self, ids: Sequence[int]) -> list[int]:
        allowed = transitions.CANCELLABLE
        with self._tx() as conn:
            return writes.set_state(conn, self.name, ids, ItemState.CANCELLED, allowed, "cancel")

    def set_paused(self, paused: bool) -> None:
        with self._tx() as conn:
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
        from statequeue.core.views import CompactResult

        with self._guard():
            reads.roll_up_counts(self._conn, self.name)
            moved = archive.archive_finished(self._conn, self.name)
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
        with self._guard():
            return logs.save(self._conn, self.name, claim, data)

    def import_items(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        result = transfer.import_items(self._tx, self.name, entries)
        if result.added:
            with self._tx() as conn:
                self._notifier.notify(conn)
        return result

    def wake_fd(self) -> int | None:
        if self._listener is None:
            self._listener = Listener(self.url, self.name)
        return self._listener.fileno()

    def drain_wake(self) -> bool:
        return self._listener is not None and self._listener.drain()
