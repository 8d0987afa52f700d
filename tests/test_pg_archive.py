"""Compaction on PostgreSQL (issue 12, promise 9): finished items' results and
events move to the archive tables in batches, and every reader still finds them."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from tests.conftest import STATEQUEUE
from tests.pg import sql as _rows

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, archive  # noqa: E402  (needs psycopg)

N = 3_000
RUN = 20  # items 1..RUN run through claim and finish; the rest are finished in bulk
CANCELLED = range(N - 49, N + 1)  # the last 50 never run
FAILED = {10, 20}
BATCH = 400


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url, "q")
    yield s
    s.close()


# What finish writes for a done item, for items RUN+1 .. N-50 at once: running
# thousands through claim and finish would make this test slow on a busy machine.
BULK_DONE = f"""
WITH d AS (
    DELETE FROM statequeue.live WHERE queue = 'q' AND id > {RUN} AND id < {CANCELLED[0]}
    RETURNING id
), u AS (
    UPDATE statequeue.items SET state = 'done', attempts = 1
    WHERE queue = 'q' AND id IN (SELECT id FROM d)
), r AS (
    INSERT INTO statequeue.results (token, queue, id, attempt, state, ok, result, at)
    SELECT nextval('statequeue.tokens'), 'q', id, 1, 'done', true, jsonb_build_object('n', id), 0
    FROM d
), e AS (
    INSERT INTO statequeue.events (queue, id, body)
    SELECT 'q', id, jsonb_build_object('t', t, 'id', id, 'attempt', 1)
    FROM d, unnest(ARRAY['start', 'end']) t
)
INSERT INTO statequeue.count_deltas (queue, state, delta)
SELECT 'q', s, n FROM (SELECT count(*) AS c FROM d) k,
    LATERAL (VALUES ('pending', -c), ('done', c)) v(s, n)
"""


def _fill(store: PostgresStore, url: str) -> None:
    assert store.enqueue([f"item-{i}" for i in range(1, N + 1)]).added == N
    store.cancel(list(CANCELLED))
    _rows(url, BULK_DONE)
    runner = new_runner()
    while (claim := store.claim(runner)) is not None:
        if claim.item_id == 1:
            assert store.save_log(claim, b"output of item 1\xff")
        ok = claim.item_id not in FAILED
        outcome = Outcome(ok=ok, reason="" if ok else "boom", result={"n": claim.item_id})
        store.finish(claim, outcome)


def test_compact_moves_finished_items_in_batches_and_readers_find_them(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive, "BATCH", BATCH)
    _fill(store, pg_url)
    before = store.status().counts
    views_before = list(store.items())
    done = N - len(CANCELLED) - len(FAILED)
    result = store.compact()
    assert result.archived == done + len(CANCELLED)
    # Each done item had one result, a start and an end event; each cancelled one a `set`.
    assert result.rows_moved == 3 * done + len(CANCELLED)
    # Only the failed items (retryable) keep rows in the hot history tables.
    assert _rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM statequeue.results") == [
        (len(FAILED), len(FAILED))
    ]
    assert _rows(pg_url, "SELECT count(*) FROM statequeue.archived_results") == [(done,)]
    # Batches, never one long transaction: each batch's rows carry its own xid.
    [(xids,)] = _rows(pg_url, "SELECT count(DISTINCT xmin::text) FROM statequeue.archived_events")
    assert xids == math.ceil((done + len(CANCELLED)) / BATCH)
    assert store.status().counts == before
    assert list(store.items()) == views_before
    again = store.compact()
    assert (again.archived, again.rows_moved) == (0, 0)
    _readers_find_archived_items(store)


def _readers_find_archived_items(store: PostgresStore) -> None:
    found = list(store.results())
    assert len(found) == N - len(CANCELLED)
    assert all(r.archived == (r.item_id not in FAILED) for r in found)
    assert found[0].result == {"n": 1} and found[0].state is ItemState.DONE
    assert [r.item_id for r in store.results(ItemState.FAILED)] == sorted(FAILED)
    history = store.history(1)
    assert [e["t"] for e in history.events] == ["enq", "start", "end"]
    assert history.result == {"n": 1} and history.state is ItemState.DONE
    assert [e["t"] for e in store.history(N).events] == ["enq", "set"]
    assert store.read_log(1, 1) == b"output of item 1\xff"
    # Dedupe holds across the archive: nothing is enqueued twice.
    assert store.enqueue([f"item-{i}" for i in range(1, N + 1)]).added == 0
    assert store.retry(None) == sorted(FAILED)  # failed items were never archived


def test_compact_cli_reports_rows_moved(
    store: PostgresStore, pg_url: str, sq_env: dict[str, str]
) -> None:
    store.enqueue(["a"])
    claim = store.claim(new_runner())
    assert claim is not None
    store.finish(claim, Outcome(ok=True))
    done = subprocess.run(
        [STATEQUEUE, "compact", "--store", pg_url, "-q", "q"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "archived 1 finished item (3 rows moved to the archive tables)\n"
