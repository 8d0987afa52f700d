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


def test_events_a_compaction_archived_before_they_were_read_are_delivered_once(
    store: PostgresStore,
) -> None:
    """Compaction moves a done item's events to the archive, maybe before a
    follower read them: they are read from there, each once (an outside
    tester's follower beside `compact` missed up to 130 of 600 end events)."""
    from statequeue.core.identity import new_runner
    from statequeue.core.models import Outcome

    store.enqueue([f"i{n}" for n in range(10)])
    first, cursor = store.read_events(None)
    assert marks(first) == ["enq"]
    runner = new_runner(("true",))
    store.register_runner(runner)
    while (claim := store.claim(runner)) is not None:
        store.finish(claim, Outcome(ok=True, exit_code=0), sync=True)
    assert store.compact().archived == 10
    found, cursor = store.read_events(cursor)
    ends = sorted(int(r["id"]) for r in found if r["t"] == "end")
    starts = sorted(int(r["id"]) for r in found if r["t"] == "start")
    assert ends == starts == list(range(1, 11)), marks(found)
    assert len({r["seq"] for r in found}) == len(found)
    again, _ = store.read_events(cursor)
    assert [r for r in again if r["t"] in ("start", "end")] == []  # exactly once
