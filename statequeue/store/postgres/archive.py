"""Compaction on PostgreSQL (promise 9): finished items' results and events
move to the archive tables, a batch of items per transaction.

Done and cancelled items are final (no user action or runner changes them
again), so they are archived. Failed and held items stay: a `retry` brings
them back, and their history is still growing. The item rows themselves stay
in ``items`` (with their sha256 key), so dedupe holds across the archive;
``archived`` marks the ones moved.

Each batch is its own short transaction: compaction never holds back vacuum
or blocks runners for long, and a compaction that is interrupted (or runs
beside another one) leaves every item either moved or not, never half.
"""

from __future__ import annotations

from dataclasses import dataclass

from statequeue.store.postgres.connection import Connection

BATCH = 5_000
"""Items archived per transaction."""

RESULT_COLUMNS = (
    "token, queue, id, attempt, state, ok, exit_code, signal, duration, reason, result, err, at"
)

# One statement per batch. The enqueue events stay: each names a batch of
# items (by its first id), some of which may still be unfinished. The batch
# is found through ``items_unarchived`` (schema version 7, lean_writes.py),
# its state checked on each row: no index names ``state``, so a finish
# updates the item's row in place.
ARCHIVE_BATCH = f"""
WITH batch AS MATERIALIZED (
    SELECT id FROM statequeue.items
    WHERE queue = %(q)s AND state IN ('done', 'cancelled') AND NOT archived AND id > %(after)s
    ORDER BY id LIMIT %(n)s
    FOR UPDATE
), marked AS (
    UPDATE statequeue.items i SET archived = true FROM batch
    WHERE i.queue = %(q)s AND i.id = batch.id
    RETURNING i.id
), gone_results AS (
    DELETE FROM statequeue.results r USING batch
    WHERE r.queue = %(q)s AND r.id = batch.id
    RETURNING {", ".join(f"r.{c.strip()}" for c in RESULT_COLUMNS.split(","))}
), kept_results AS (
    INSERT INTO statequeue.archived_results ({RESULT_COLUMNS})
    SELECT {RESULT_COLUMNS} FROM gone_results
    RETURNING 1
), gone_events AS (
    DELETE FROM statequeue.events e USING batch
    WHERE e.queue = %(q)s AND e.id = batch.id AND e.body->>'t' <> 'enq'
    RETURNING e.seq, e.queue, e.id, e.body, e.xid
), kept_events AS (
    INSERT INTO statequeue.archived_events (seq, queue, id, body, xid)
    SELECT seq, queue, id, body, xid FROM gone_events
    RETURNING 1
)
SELECT (SELECT max(id) FROM marked), (SELECT count(*) FROM marked),
       (SELECT count(*) FROM kept_results), (SELECT count(*) FROM kept_events)
"""


@dataclass
class Archived:
    """What one compaction moved."""

    items: int = 0
    results: int = 0
    events: int = 0

    @property
    def rows(self) -> int:
        return self.results + self.events


def archive_finished(conn: Connection, queue: str) -> Archived:
    """Move every done or cancelled item's results and events to the archive,
    ``BATCH`` items per transaction; returns what was moved."""
    moved = Archived()
    after = 0
    while True:
        with conn.transaction():
            row = conn.execute(ARCHIVE_BATCH, {"q": queue, "after": after, "n": BATCH}).fetchone()
        assert row is not None  # an aggregate row always comes back
        last, items, results, events = row
        if not items:
            return moved
        moved.items += int(items)
        moved.results += int(results)
        moved.events += int(events)
        after = int(last)
