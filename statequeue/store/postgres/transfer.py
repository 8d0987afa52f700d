"""Export and import for the PostgreSQL store.

Export reads one REPEATABLE READ snapshot, page by page in id order. Import
writes each batch of items in one transaction under the queue row's lock (as
enqueue does): an item's row, its hot-table row, its results, its history
events and the count deltas commit together or not at all.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from psycopg.types.json import Jsonb

from statequeue.core.exported import ExportedItem, history_record
from statequeue.core.models import EnqueueResult, ItemState
from statequeue.core.records import Record
from statequeue.store.postgres import writes
from statequeue.store.postgres.connection import Connection
from statequeue.store.postgres.queries import text_of
from statequeue.store.records.transfer import INTERRUPTED_REASON

PAGE = 5_000
IMPORT_BATCH = 1_000
_LIVE = (ItemState.PENDING, ItemState.FAILED, ItemState.HELD)

_ITEMS_PAGE = """
SELECT i.id, i.item, coalesce(l.state, i.state), coalesce(l.attempts, i.attempts),
       coalesce(l.crashes, 0), coalesce(l.failures, 0), coalesce(l.reason, i.reason),
       l.retry_at, coalesce(l.interrupted, false), coalesce(d.count, 0), i.archived
FROM statequeue.items i
LEFT JOIN statequeue.live l ON l.queue = i.queue AND l.id = i.id
LEFT JOIN statequeue.deferrals d ON l.id IS NOT NULL AND d.queue = i.queue AND d.id = i.id
WHERE i.queue = %(q)s AND i.id > %(after)s
ORDER BY i.id LIMIT %(limit)s
"""


def _history_of(events: str) -> str:
    """The history events among ``events``, an attempt's ``end`` or ``intr``
    with the runner and host that ran it (the runner's ``start`` and
    registration: `stats` and `report` name them after an import) and an
    interrupted attempt's start, where the event does not say them itself."""
    return f"""
    SELECT h.id, jsonb_strip_nulls(jsonb_build_object(
               'runner', s.runner, 'host', ru.host,
               'started', CASE WHEN h.body ? 'crashes' THEN s.at END)) || h.body AS body,
           h.seq
    FROM statequeue.{events} h
    LEFT JOIN LATERAL (
        SELECT e.body->>'runner' AS runner, e.body->'at' AS at FROM statequeue.{events} e
        WHERE h.body->>'t' IN ('end', 'intr') AND e.queue = h.queue AND e.id = h.id
          AND e.body->>'t' = 'start' AND e.body->'attempt' = h.body->'attempt'
        ORDER BY e.seq DESC LIMIT 1
    ) s ON true
    LEFT JOIN statequeue.runners ru ON ru.queue = h.queue AND ru.runner_id = s.runner
    WHERE h.queue = %(q)s AND h.id > %(after)s AND h.id <= %(upto)s
      AND h.body->>'t' IN ('end', 'intr', 'defer', 'set')"""


# Compaction moves done and cancelled items' events to ``archived_events``:
# their history is read from there (an export never loses an archived result).
_HISTORY_PAGE = f"""
SELECT id, body FROM (
{_history_of("events")}
    UNION ALL
{_history_of("archived_events")}
) h
ORDER BY id, seq
"""


def export_items(conn: Connection, queue: str) -> Iterator[ExportedItem]:
    """Every item of ``queue`` in id order, from one snapshot."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        after = 0
        while True:
            q = {"q": queue, "after": after, "limit": PAGE}
            rows = conn.execute(_ITEMS_PAGE, q).fetchall()
            if not rows:
                return
            history: dict[int, list[Record]] = {}
            upto = {"q": queue, "after": after, "upto": int(rows[-1][0])}
            for item_id, body in conn.execute(_HISTORY_PAGE, upto):
                history.setdefault(int(item_id), []).append(history_record(body))
            for row in rows:
                yield _exported(row, history.get(int(row[0]), []))
            after = int(rows[-1][0])


def _exported(row: tuple[Any, ...], history: list[Record]) -> ExportedItem:
    item_id, item, state, attempts, crashes, failures, reason, retry_at, interrupted, defers = row[
        :10
    ]
    running = state == ItemState.RUNNING.value
    return ExportedItem(
        item_id=int(item_id),
        item=text_of(item),
        state=ItemState.PENDING if running else ItemState(state),
        attempts=int(attempts),
        crashes=int(crashes),
        failures=int(failures),
        deferrals=int(defers),
        reason=INTERRUPTED_REASON if running else str(reason),
        retry_at=float(retry_at) if retry_at is not None else None,
        interrupted=running or bool(interrupted),
        # Moved to the archive tables by `compact`, as the journal store's
        # export says of the items its compaction archived.
        archived=bool(row[10]),
        history=tuple(history),
    )


Transaction = Callable[[], AbstractContextManager[Connection]]


def import_items(tx: Transaction, queue: str, entries: Sequence[ExportedItem]) -> EnqueueResult:
    """``Store.import_items`` over transactions opened by ``tx``."""
    added = 0
    for start in range(0, len(entries), IMPORT_BATCH):
        with tx() as conn:
            added += _import_batch(conn, queue, entries[start : start + IMPORT_BATCH])
    return EnqueueResult(added=added, skipped=len(entries) - added)


def _import_batch(conn: Connection, queue: str, batch: Sequence[ExportedItem]) -> int:
    next_id, _ = writes.lock_queue(conn, queue)  # serialises with enqueues and imports
    raws = [os.fsencode(e.item) for e in batch]
    keys = [hashlib.sha256(raw).digest() for raw in raws]
    # A join, so that each key is one index lookup (``key = ANY(...)`` made
    # the planner scan every item of the queue: quadratic over an import).
    present = {
        bytes(k)
        for (k,) in conn.execute(
            "SELECT i.key FROM unnest(%(keys)b::bytea[]) AS k(key)"
            " JOIN statequeue.items i ON i.queue = %(q)s AND i.key = k.key",
            {"q": queue, "keys": keys},
        )
    }
    fresh: list[tuple[int, bytes, ExportedItem]] = []
    for entry, raw, key in zip(batch, raws, keys, strict=True):
        if key in present:
            continue
        present.add(key)  # a repeat within the batch is skipped too
        next_id = max(entry.item_id, next_id)  # its own id when free
        fresh.append((next_id, raw, entry))
        next_id += 1
    if fresh:
        _insert(conn, queue, fresh)
        conn.execute(
            "UPDATE statequeue.queues SET next_id = greatest(next_id, %s) WHERE name = %s",
            (next_id, queue),
        )
    return len(fresh)


def _insert(conn: Connection, queue: str, fresh: list[tuple[int, bytes, ExportedItem]]) -> None:
    # One statement per table for the whole batch (arrays unnested server
    # side): a round trip per row would make an import many times slower.
    # The arrays go in binary (%(...)b): text arrays are escaped in Python.
    items = [(i, raw, _items_state(e), e.attempts, writes.safe(e.reason)) for i, raw, e in fresh]
    conn.execute(_INSERT_ITEMS, {"q": queue, **_columns(items, _ITEM_COLUMNS)})
    live = [_live_row(i, e) for i, _, e in fresh if e.state in _LIVE]
    if live:
        conn.execute(_INSERT_LIVE, {"q": queue, **_columns(live, _LIVE_COLUMNS)})
    results = [_result_row(i, r) for i, _, e in fresh for r in e.results]
    if results:
        conn.execute(_INSERT_RESULTS, {"q": queue, **_columns(results, _RESULT_COLUMNS)})
    history = [(i, Jsonb({**r, "id": i})) for i, _, e in fresh for r in e.history]
    if history:
        conn.execute(_INSERT_EVENTS, {"q": queue, **_columns(history, ("id", "body"))})
    defers = [(i, e.deferrals) for i, _, e in fresh if e.deferrals and e.state in _LIVE]
    if defers:  # --max-deferrals counts on, and `status` says "deferred N"
        conn.execute(_INSERT_DEFERRALS, {"q": queue, **_columns(defers, ("id", "count"))})
    deltas: dict[str, int] = {}
    for _, _, e in fresh:
        deltas[e.state.value] = deltas.get(e.state.value, 0) + 1
    writes.count(conn, queue, deltas)


def _columns(rows: list[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, list[Any]]:
    """Rows as one list per column, named for the statement's parameters."""
    return {name: [row[k] for row in rows] for k, name in enumerate(names)}


_ITEM_COLUMNS = ("id", "item", "state", "attempts", "reason")
_INSERT_ITEMS = """
INSERT INTO statequeue.items (queue, id, item, state, attempts, reason)
SELECT %(q)s, * FROM unnest(%(id)b::bigint[], %(item)b::bytea[], %(state)b::text[],
                            %(attempts)b::int[], %(reason)b::text[])
"""
_LIVE_COLUMNS = (
    "id",
    "state",
    "attempts",
    "crashes",
    "failures",
    "interrupted",
    "retry_at",
    "reason",
    "last_err",
    "changed_at",
)
_INSERT_LIVE = """
INSERT INTO statequeue.live (queue, id, state, attempts, crashes, failures, interrupted,
                             retry_at, reason, last_err, changed_at)
SELECT %(q)s, * FROM unnest(%(id)b::bigint[], %(state)b::text[], %(attempts)b::int[],
                            %(crashes)b::int[], %(failures)b::int[], %(interrupted)b::bool[],
                            %(retry_at)b::float8[], %(reason)b::text[], %(last_err)b::text[],
                            %(changed_at)b::float8[])
"""
_RESULT_COLUMNS = (
    "id",
    "attempt",
    "state",
    "ok",
    "exit",
    "sig",
    "dur",
    "reason",
    "result",
    "err",
    "at",
)
# unnest keeps the array order, and nextval runs row by row in it: the tokens
# rise in the order of the attempts (``results`` takes the highest as the last).
_INSERT_RESULTS = """
INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, exit_code, signal,
                                duration, reason, result, err, at)
SELECT nextval('statequeue.tokens'), %(q)s, id, attempt, state, ok, exit, sig, dur, reason,
       result, err, at
FROM unnest(
    %(id)b::bigint[], %(attempt)b::int[], %(state)b::text[], %(ok)b::bool[], %(exit)b::int[],
    %(sig)b::int[], %(dur)b::float8[], %(reason)b::text[], %(result)b::jsonb[],
    %(err)b::text[], %(at)b::float8[]) WITH ORDINALITY AS r(id, attempt, state, ok, exit, sig,
    dur, reason, result, err, at, n)
ORDER BY n
"""
_INSERT_EVENTS = """
INSERT INTO statequeue.events (queue, id, body)
SELECT %(q)s, id, body FROM unnest(%(id)b::bigint[], %(body)b::jsonb[]) WITH ORDINALITY
    AS e(id, body, n)
ORDER BY n
"""

_INSERT_DEFERRALS = """
INSERT INTO statequeue.deferrals (queue, id, count)
SELECT %(q)s, * FROM unnest(%(id)b::bigint[], %(count)b::int[])
ON CONFLICT (queue, id) DO UPDATE SET count = EXCLUDED.count
"""


def _items_state(entry: ExportedItem) -> str:
    # ``items.state`` is authoritative only once an item left the hot table.
    return ItemState.PENDING.value if entry.state in _LIVE else entry.state.value


def _live_row(item_id: int, e: ExportedItem) -> tuple[Any, ...]:
    results = e.results
    last_err = str(results[-1].get("err", "")) if results and e.state is ItemState.FAILED else ""
    at = max((float(r.get("at", 0.0)) for r in e.history), default=time.time())
    return (
        item_id,
        e.state.value,
        e.attempts,
        e.crashes,
        e.failures,
        e.interrupted,
        e.retry_at,
        writes.safe(e.reason),
        writes.safe(last_err),
        at,
    )


def _result_row(item_id: int, r: Record) -> tuple[Any, ...]:
    result = r.get("result")
    return (
        item_id,
        int(r.get("attempt", 0)),
        str(r.get("state", ItemState.DONE.value)),
        bool(r.get("ok", False)),
        r.get("exit"),
        r.get("sig"),
        r.get("dur"),
        writes.safe(str(r.get("reason", ""))),
        None if result is None else Jsonb(result),
        writes.safe(str(r.get("err", ""))),
        float(r.get("at", 0.0)),
    )
