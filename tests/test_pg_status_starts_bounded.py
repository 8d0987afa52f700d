"""`status` on PostgreSQL reads a bounded number of the queue's events for
its start rate, however long the queue's history.

It looked at "the latest 4,000 events" ordered by ``seq``, which no index
has held since schema version 7: every `status` (and `queues`, once per
queue) read and sorted every event of the queue, 0.36 s at 600,000 events
on the test machine, growing with the history. It now reads them newest
first through the index on (queue, xid). The plan is checked, not a time
(these machines are shared): no sort and no sequential scan of the events.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.pg import sql

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, queries  # noqa: E402  (needs psycopg)

_OLD_HISTORY = """
INSERT INTO statequeue.events (queue, id, body)
SELECT 'q', 1, jsonb_build_object('t', CASE WHEN g %% 2 = 0 THEN 'start' ELSE 'end' END,
    'id', 1, 'attempt', g, 'at', %s::float8 - 86400 + g * 0.01)
FROM generate_series(1, 50000) g
"""

_RECENT_START = """
INSERT INTO statequeue.events (queue, id, body)
VALUES ('q', 1, jsonb_build_object('t', 'start', 'id', 1, 'attempt', 1, 'at', %s::float8))
"""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


def test_status_counts_recent_starts_without_reading_the_whole_history(pg_url: str) -> None:
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a"])
        now = time.time()
        sql(pg_url, _OLD_HISTORY, now)
        for ago in (30.0, 20.0, 10.0):  # later transactions than the history's
            sql(pg_url, _RECENT_START, now - ago)
        sql(pg_url, "ANALYZE statequeue.events")
        starts = store.status().starts
        assert starts is not None and starts.count == 3
        with psycopg.connect(pg_url, autocommit=True) as conn:
            params = {"q": "q", "look": queries._STARTS_LOOK, "since": now - 60}
            row = conn.execute("EXPLAIN (FORMAT JSON) " + queries._STARTS, params).fetchone()
        assert row is not None
        plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
        nodes = _nodes(plan[0]["Plan"])
        kinds = [n["Node Type"] for n in nodes]
        assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
        scans = [n for n in nodes if n.get("Relation Name") == "events"]
        assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), kinds
    finally:
        store.close()
