"""One code path on every store: ``Queue.fsck/drop`` and
``statequeue.maintenance`` work on PostgreSQL as on a local journal, and the
CLI calls them (issue 13 point 1). Real PostgreSQL (tests/pg.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from statequeue.errors import QueueNotFound, UsageError
from statequeue.identity import new_runner
from statequeue.maintenance import drop_queue, fsck_queue, list_queues
from statequeue.models import Outcome
from statequeue.queue import Queue

psycopg = pytest.importorskip("psycopg")


def _sql(url: str, query: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query.encode())


def _finish(q: Queue, count: int) -> None:
    runner = new_runner()
    for n in range(count):
        claim = q.claim(runner)
        assert claim is not None
        q.finish(claim, Outcome(ok=True, result={"n": n, "item": claim.item}))


def test_queue_fsck_recounts_and_repairs_on_postgres(sq_home: Path, pg_url: str) -> None:
    with Queue("checked", home=sq_home, store=pg_url) as q:
        q.enqueue(["a", "b", "c"])
        _finish(q, 1)
        report = q.fsck()
        assert not report.damaged and not report.repaired
        assert report.to_json()["counts"]["done"] == 1
        _sql(pg_url, "INSERT INTO statequeue.count_deltas VALUES ('checked', 'done', 5)")
        found = q.fsck()
        assert found.damaged
        assert any("counter says 6" in line for line in found.report_lines())
        assert q.fsck(repair=True).repaired
        assert not q.fsck().damaged
    assert not fsck_queue("checked", home=sq_home, store=pg_url).damaged


def test_fsck_queue_of_a_missing_postgres_queue_is_not_found(sq_home: Path, pg_url: str) -> None:
    with pytest.raises(QueueNotFound):
        fsck_queue("never-made", home=sq_home, store=pg_url)


def test_queue_drop_deletes_a_postgres_queue(sq_home: Path, pg_url: str) -> None:
    q = Queue("gone", home=sq_home, store=pg_url)
    q.enqueue(["x"])
    q.drop()
    assert q.closed
    with pytest.raises(QueueNotFound):
        Queue("gone", home=sq_home, store=pg_url, create=False)
    Queue("gone2", home=sq_home, store=pg_url).close()
    places: list[str] = []
    drop_queue("gone2", home=sq_home, store=pg_url, confirm=places.append)
    assert len(places) == 1 and "postgresql" in places[0]
    with pytest.raises(QueueNotFound):
        Queue("gone2", home=sq_home, store=pg_url, create=False)


def test_drop_on_postgres_refuses_while_a_work_loop_runs(sq_home: Path, pg_url: str) -> None:
    with Queue("busy", home=sq_home, store=pg_url) as q:
        q.enqueue(["x"])
        work = q.work()
        item = next(work)
        with pytest.raises(UsageError, match="active runner"):
            drop_queue("busy", home=sq_home, store=pg_url)
        item.done()
        work.close()
        assert [v.item for v in q.items()] == ["x"]


def test_list_queues_on_postgres(sq_home: Path, pg_url: str) -> None:
    for name, items in (("beta", ["1", "2"]), ("alpha", ["1"])):
        with Queue(name, home=sq_home, store=pg_url) as q:
            q.enqueue(items)
    listed = list_queues(store=pg_url)
    assert [(s.queue, s.total) for s in listed] == [("alpha", 1), ("beta", 2)]
    assert list_queues(sq_home) == []  # the local home holds none of them
