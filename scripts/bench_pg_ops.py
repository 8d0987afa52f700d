"""Benchmark: status, fsck and compact on a large PostgreSQL queue (issue 12, promises 8 and 9).

Starts a throwaway cluster (as the tests do: tests/pg.py), fills a queue with N
items of which 90% are done, each with a result row, a start and an end event,
and the four count-delta rows a claim and a finish insert, then measures:

  status (first)  folds N*3.6 delta rows into the counters, then reads them
  status (next)   the counters only; goal 0.2 s at 1M items
  scan baseline   what a status without counters would do: GROUP BY over the items
  fsck            the recount, in one snapshot
  stats rows      the finished attempts `stats` and `report` fold (iter_attempt_batches,
                  drained), before and after compact: the archive is read as the live
                  tables are (the rows counted say so); "since" asks for the last hour
                  (no row is that recent: what its filter costs)
  compact         moves the done items' results and events, 5,000 items per transaction
  move baseline   the same move as one long transaction, on an identical copy

Sizes: N = 1,000,000 (--quick: 100,000). Prints figures and ratios; --json PATH
writes them too.

  .venv/bin/python scripts/bench_pg_ops.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import psycopg

    from statequeue.store.postgres import PostgresStore
except ImportError:  # the bench environment may lack the postgres extra
    print("bench_pg_ops: skipped, psycopg is not installed (pip install '.[postgres]')")
    sys.exit(0)
from tests.pg import _start_cluster, find_bin_dir

FILL = """
WITH d AS (
    DELETE FROM statequeue.live WHERE queue = 'q' AND id <= %(done)s RETURNING id
), u AS (
    UPDATE statequeue.items SET state = 'done', attempts = 1
    WHERE queue = 'q' AND id IN (SELECT id FROM d)
), r AS (
    INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, result, at)
    SELECT nextval('statequeue.tokens'), 'q', id, 1, 'done', true, '{"ok": 1}', 0 FROM d
), e AS (
    INSERT INTO statequeue.events (queue, id, body)
    SELECT 'q', id, jsonb_build_object('t', t, 'id', id, 'attempt', 1)
    FROM d, unnest(ARRAY['start', 'end']) t
)
INSERT INTO statequeue.count_deltas (queue, state, delta)
SELECT 'q', s, n FROM d,
    (VALUES ('pending', -1), ('running', 1), ('running', -1), ('done', 1)) v(s, n)
"""

ONE_LONG_MOVE = """
WITH batch AS (
    SELECT id FROM statequeue.items WHERE queue = 'q' AND state = 'done' AND NOT archived
), marked AS (
    UPDATE statequeue.items i SET archived = true FROM batch WHERE i.queue = 'q' AND i.id = batch.id
), gone_results AS (
    DELETE FROM statequeue.results r USING batch WHERE r.queue = 'q' AND r.id = batch.id
    RETURNING r.token, r.queue, r.id, r.attempt, r.state, r.ok, r.exit_code, r.signal,
              r.duration, r.reason, r.result, r.err, r.at
), kept_results AS (
    INSERT INTO statequeue.archived_results SELECT * FROM gone_results
), gone_events AS (
    DELETE FROM statequeue.events e USING batch
    WHERE e.queue = 'q' AND e.id = batch.id AND e.body->>'t' <> 'enq'
    RETURNING e.seq, e.queue, e.id, e.body
)
INSERT INTO statequeue.archived_events SELECT * FROM gone_events
"""


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def filled(url: str, n: int) -> PostgresStore:
    store = PostgresStore(url, "q")
    store.enqueue([f"https://example.com/page/{i}" for i in range(n)])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL, {"done": n * 9 // 10})
        conn.execute("VACUUM ANALYZE")
    return store


def _stats_rows(store: PostgresStore, figures: dict[str, float], suffix: str) -> None:
    counted: list[int] = []

    def drain(since: float | None) -> None:
        counted.append(sum(len(b.item_id) for b in store.iter_attempt_batches(since)))

    figures[f"stats{suffix}_s"] = min(timed(lambda: drain(None)) for _ in range(2))
    figures[f"stats{suffix}_rows"] = counted[-1]
    hour_ago = time.time() - 3600
    figures[f"stats_since{suffix}_s"] = min(timed(lambda: drain(hour_ago)) for _ in range(2))


def measure(url: str, copy_url: str, n: int) -> dict[str, float]:
    store = filled(url, n)
    figures = {
        "status_first_s": timed(store.status),
        "status_s": min(timed(store.status) for _ in range(3)),
    }
    with psycopg.connect(url, autocommit=True) as conn:
        scan = "SELECT state, count(*) FROM statequeue.items WHERE queue = 'q' GROUP BY state"
        figures["scan_baseline_s"] = min(
            timed(lambda: conn.execute(scan).fetchall()) for _ in range(3)
        )
    figures["fsck_s"] = timed(store.check)
    _stats_rows(store, figures, "")
    figures["compact_s"] = timed(store.compact)
    _stats_rows(store, figures, "_compacted")
    store.close()
    copy = filled(copy_url, n)
    copy.close()
    with psycopg.connect(copy_url, autocommit=True) as conn:
        figures["one_transaction_move_s"] = timed(lambda: conn.execute(ONE_LONG_MOVE))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k items instead of 1M")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()
    n = 100_000 if args.quick else 1_000_000
    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit("bench_pg_ops: PostgreSQL binaries (initdb, pg_ctl) not found")
    cluster = _start_cluster(bin_dir)
    try:
        f = measure(cluster.new_database(), cluster.new_database(), n)
    finally:
        cluster.stop()
    done = n * 9 // 10
    print(f"PostgreSQL queue of {n:,} items, {done:,} done (results and events each)")
    print(f"  status, first (folds {4 * done:,} delta rows): {f['status_first_s']:.3f} s")
    print(f"  status, counters folded: {f['status_s']:.3f} s (goal 0.2 s)")
    print(
        f"  scan baseline (GROUP BY over the items): {f['scan_baseline_s']:.3f} s "
        f"= {f['scan_baseline_s'] / f['status_s']:.1f}x status"
    )
    print(f"  fsck recount: {f['fsck_s']:.3f} s")
    for suffix, when in (("", "before compact"), ("_compacted", "after compact")):
        print(
            f"  stats rows, {when}: {f[f'stats{suffix}_s']:.2f} s "
            f"({f[f'stats{suffix}_rows']:,} attempts); "
            f"--since 1h: {f[f'stats_since{suffix}_s']:.3f} s"
        )
    print(f"  compact: {f['compact_s']:.1f} s ({done / f['compact_s']:,.0f} items/s, batches)")
    print(
        f"  one-transaction move baseline: {f['one_transaction_move_s']:.1f} s "
        f"(compact takes {f['compact_s'] / f['one_transaction_move_s']:.2f}x, never holding it)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"items": n, **f}, indent=2) + "\n")


if __name__ == "__main__":
    main()
