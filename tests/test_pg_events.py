"""`events --follow` on PostgreSQL never misses an event that commits late
(issue 12, promise 10): a held transaction's lower seq is delivered, once,
when it commits. Real server, real concurrent transactions."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import STATEQUEUE
from tests.pg import sql as _rows

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, events, writes  # noqa: E402

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url, "q")
    yield s
    s.close()


def hold_event(url: str, mark: str) -> Conn:
    """A connection whose open transaction wrote one event (through the
    store's own writer): it has its seq but has not committed."""
    conn: Conn = psycopg.connect(url, autocommit=True)
    conn.execute("BEGIN")
    writes.event(conn, "q", {"t": "mark", "mark": mark})
    return conn


def enqueue_elsewhere(url: str, sq_env: dict[str, str], *items: str) -> None:
    """Another process commits later events."""
    cmd = [STATEQUEUE, "--store", url, "enqueue", "-q", "q", *items]
    subprocess.run(cmd, env=sq_env, check=True, capture_output=True)


def marks(found: list[dict[str, object]]) -> list[object]:
    return [r.get("mark", r["t"]) for r in found]


def test_event_that_commits_late_is_delivered_once(
    store: PostgresStore, pg_url: str, sq_env: dict[str, str]
) -> None:
    _, cursor = store.read_events(None)
    held = hold_event(pg_url, "held")
    try:
        enqueue_elsewhere(pg_url, sq_env, "a")
        first, cursor = store.read_events(cursor)
        assert marks(first) == ["enq"]  # the held one is not visible yet...
        mine = held.execute("SELECT seq FROM statequeue.events WHERE body->>'mark' = 'held'")
        held_seq = int(mine.fetchone()[0])  # type: ignore[index]
        assert held_seq < first[0]["seq"]  # ...and it took the lower seq
        held.execute("COMMIT")
    finally:
        held.close()
    # The old way, a plain ``seq > last seen``, never reads it.
    committed = [int(r[0]) for r in _rows(pg_url, "SELECT seq FROM statequeue.events")]
    assert held_seq in committed
    assert [s for s in committed if s > int(first[-1]["seq"])] == []
    second, cursor = store.read_events(cursor)
    assert [(r["seq"], r["mark"]) for r in second] == [(held_seq, "held")]
    third, cursor = store.read_events(cursor)
    assert third == []  # exactly once
    enqueue_elsewhere(pg_url, sq_env, "b")
    fourth, _ = store.read_events(cursor)
    assert marks(fourth) == ["enq"]


def test_pages_and_held_transactions_deliver_each_event_once(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "PAGE", 3)
    cursor: object = None
    delivered: list[int] = []
    held = [hold_event(pg_url, f"h{i}") for i in range(2)]
    for i in range(7):
        store.enqueue([f"item{i}"])
    for step in range(8):
        if step == 2:
            held[1].execute("COMMIT")
        if step == 5:
            held[0].execute("COMMIT")
        found, cursor = store.read_events(cursor)
        delivered += [int(r["seq"]) for r in found]
    for conn in held:
        conn.close()
    every = [int(r[0]) for r in _rows(pg_url, "SELECT seq FROM statequeue.events ORDER BY seq")]
    assert sorted(delivered) == every  # none missed
    assert len(delivered) == len(set(delivered))  # none twice
