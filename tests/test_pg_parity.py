"""One code path on every store: ``Queue.fsck/drop/export/import_`` and
``statequeue.api.maintenance`` work on PostgreSQL as on a local journal, and the
CLI calls them (issue 13 point 1). Real PostgreSQL (tests/pg.py)."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.maintenance import drop_queue, fsck_queue, list_queues
from statequeue.api.queue import Queue
from statequeue.core.errors import QueueNotFound, UsageError
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from tests.conftest import STATEQUEUE
from tests.pg import sql as _sql

psycopg = pytest.importorskip("psycopg")


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
        with pytest.raises(UsageError, match="active runner") as refused:
            q.drop()
        assert refused.value.exit_code == 4  # RUNNER_ACTIVE, as `run --single` exits
        assert not q.closed  # refused before anything: the loop goes on
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


def _results(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [STATEQUEUE, *args, "results", "--json"], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    rows: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    for row in rows:
        # Documented as where the store keeps a result: an import never archives.
        del row["archived"]
    return sorted(rows, key=lambda r: r["id"])


def test_compacted_postgres_queue_exports_its_results_to_a_local_queue(
    sq_home: Path, sq_env: dict[str, str], pg_url: str
) -> None:
    with Queue("src", home=sq_home, store=pg_url) as q:
        q.enqueue([f"item-{n}" for n in range(6)])
        _finish(q, 4)
        moved = q.compact()
        assert moved.archived == 4
        out = io.BytesIO()
        assert q.export(out) == 6
    before = _results(sq_env, "--store", pg_url, "-q", "src")
    assert [r["result"]["n"] for r in before] == [0, 1, 2, 3]
    with Queue("dst", home=sq_home) as local:
        result = local.import_(out.getvalue().splitlines(keepends=True))
        assert (result.added, result.skipped) == (6, 0)
    assert _results(sq_env, "-q", "dst") == before


def test_export_to_a_path_and_import_from_a_file_on_the_journal(
    sq_home: Path, tmp_path: Path
) -> None:
    target = tmp_path / "q.ndjson"
    with Queue("here", home=sq_home) as q:
        q.enqueue(["a", "b"])
        _finish(q, 1)
        assert q.export(target) == 2
    with Queue("there", home=sq_home) as q, target.open("rb") as lines:
        with pytest.raises(UsageError, match="not one str or bytes"):
            q.import_(target.read_bytes())  # type: ignore[arg-type]  # the mistake it names
        assert q.import_(lines).added == 2
        assert q.result("a") is not None and q.result("a").result == {"n": 0, "item": "a"}  # type: ignore[union-attr]
