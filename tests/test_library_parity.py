"""The library does what the CLI does (issue 13 point 1): one method per
command, returning the dataclasses the CLI renders; lookup by item text."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue import ItemState, Queue
from statequeue.api.maintenance import drop_queue, fsck_queue
from statequeue.core.errors import (
    ItemNotFound,
    NotSupported,
    QueueNotFound,
    StateQueueError,
    UsageError,
)
from statequeue.core.views import ItemHistory, ItemResult, ItemView
from statequeue.store.journal.fsck import FsckReport
from tests.conftest import STATEQUEUE

Env = dict[str, str]


@pytest.fixture(params=["journal", "postgres"])
def q(request: pytest.FixtureRequest, sq_home: Path) -> Iterator[Queue]:
    """A queue holding a, b, c, d: a done, b failed, c and d pending."""
    store = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    with Queue("parity", home=sq_home, store=store) as queue:
        queue.enqueue(["a", "b", "c", "d"])
        work = queue.work()
        next(work).done({"n": 1})
        next(work).fail("boom")
        work.close()  # gives c back
        yield queue


def test_items_lists_every_item_or_one_state(q: Queue) -> None:
    views = q.items()
    assert all(isinstance(v, ItemView) for v in views)
    assert [(v.item, v.state) for v in views] == [
        ("a", ItemState.DONE),
        ("b", ItemState.FAILED),
        ("c", ItemState.PENDING),
        ("d", ItemState.PENDING),
    ]
    assert [v.item for v in q.items(ItemState.PENDING)] == ["c", "d"]


def test_results_and_result_by_text(q: Queue) -> None:
    assert [(r.item, r.state) for r in q.results()] == [
        ("a", ItemState.DONE),
        ("b", ItemState.FAILED),
    ]
    assert [r.item for r in q.results(ItemState.FAILED)] == ["b"]
    with pytest.raises(UsageError):
        q.results(ItemState.PENDING)
    done = q.result("a")
    assert isinstance(done, ItemResult)
    assert done.result == {"n": 1}
    assert done.state is ItemState.DONE
    failed = q.result("b")
    assert failed is not None and failed.reason == "boom"
    assert q.result("c") is None  # pending: no result yet
    with pytest.raises(ItemNotFound):
        q.result("never queued")


def test_history_by_id_and_by_text(q: Queue) -> None:
    by_text = q.history("b")
    assert isinstance(by_text, ItemHistory)
    assert by_text.item == "b"
    assert by_text.state is ItemState.FAILED
    assert q.history(by_text.item_id) == by_text
    assert q.find("b") == by_text.item_id
    with pytest.raises(ItemNotFound):
        q.history("nope")


def test_retry_and_cancel(q: Queue) -> None:
    b = q.find("b")
    assert q.retry() == [b]  # every failed or held item
    assert q.items(ItemState.FAILED) == []
    d = q.find("d")
    assert q.cancel([d]) == [d]
    assert q.history("d").state is ItemState.CANCELLED
    with pytest.raises(StateQueueError):
        q.cancel([999])


def test_pause_makes_work_wait_and_resume_lets_it_go_on(q: Queue) -> None:
    q.pause()
    assert q.status().paused
    taken: list[str] = []

    def loop() -> None:
        for item in q.work():
            taken.append(item.item)
            item.done()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not q.status().runners:  # the loop has started, and waits
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert taken == []
    q.resume()
    t.join(timeout=30)
    assert not q.status().paused
    assert taken == ["c", "d"]


def test_events_reads_the_journal_and_follow_sees_new_records(q: Queue) -> None:
    kinds = [r["t"] for r in q.events()]
    assert kinds.count("end") == 2
    assert "start" in kinds
    seen: list[object] = []
    got_new = threading.Event()

    def follow() -> None:
        for record in q.events(follow=True, poll=0.01):
            if record.get("t") == "pause":
                seen.append(record["paused"])
                got_new.set()
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    q.pause()  # a record written after the follower started
    assert got_new.wait(timeout=30)
    t.join(timeout=30)
    assert seen == [True]


def test_heartbeat_is_a_no_op_on_the_store(q: Queue) -> None:
    for item in q.work():
        item.heartbeat()
        item.done()


def test_fsck_returns_the_report(sq_home: Path) -> None:
    with Queue("checked", home=sq_home) as q:
        q.enqueue(["x"])
        report = q.fsck()
    assert isinstance(report, FsckReport)
    assert not report.damaged
    again = fsck_queue("checked", home=sq_home)
    assert isinstance(again, FsckReport) and again.journal.valid == report.journal.valid


def test_fsck_queue_checks_a_queue_too_damaged_to_open(sq_home: Path) -> None:
    with Queue("broken", home=sq_home) as q:
        q.enqueue(["x", "y", "z"])
        journal = q.path / "journal.jsonl"  # type: ignore[operator]
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"x"', b'"X"')  # a bad checksum in the middle
    journal.write_bytes(b"".join(lines))
    with pytest.raises(StateQueueError):
        Queue("broken", home=sq_home, create=False)
    assert fsck_queue("broken", home=sq_home).damaged
    assert fsck_queue("broken", home=sq_home, repair=True).repaired
    with Queue("broken", home=sq_home, create=False) as q:
        assert [v.item for v in q.items()] == ["y", "z"]


def test_drop_deletes_the_queue(sq_home: Path) -> None:
    q = Queue("gone", home=sq_home)
    q.enqueue(["x"])
    q.drop()
    assert q.closed
    with pytest.raises(QueueNotFound):
        Queue("gone", home=sq_home, create=False)
    Queue("gone2", home=sq_home).close()
    drop_queue("gone2", home=sq_home)
    with pytest.raises(QueueNotFound):
        Queue("gone2", home=sq_home, create=False)


def test_drop_refuses_while_a_work_loop_runs(sq_home: Path) -> None:
    with Queue("busy", home=sq_home) as q:
        q.enqueue(["x"])
        work = q.work()
        item = next(work)
        with pytest.raises(UsageError, match="active runner") as refused:
            q.drop()
        assert refused.value.exit_code == 4  # RUNNER_ACTIVE, as `run --single` exits
        with pytest.raises(UsageError, match="active runner"):
            drop_queue("busy", home=sq_home)
        item.done()
        work.close()
        assert q.path is not None and q.path.exists()


def test_fsck_and_drop_refused_on_a_store_without_them(sq_home: Path) -> None:
    from statequeue.store.memory import MemoryStore

    # PostgreSQL has both now (tests/test_pg_parity.py); the memory store neither.
    with Queue("mem", home=sq_home, store=MemoryStore("mem")) as q:
        with pytest.raises(NotSupported):
            q.fsck()
        with pytest.raises(NotSupported):
            q.drop()


@pytest.mark.parametrize("single", ["abc", b"abc"])
def test_enqueue_refuses_a_single_text(sq_home: Path, single: object) -> None:
    with Queue(home=sq_home) as q:
        with pytest.raises(UsageError, match="iterable of items"):
            q.enqueue(single)  # type: ignore[arg-type]
        assert q.items() == []


def sq(env: Env, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, timeout=60)


def test_cli_show_looks_up_by_text(sq_env: Env, sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["first", "https://example.org/a b"])
        for item in q.work():
            item.done({"len": len(item.item)})
    out = sq(sq_env, "show", "--item", "https://example.org/a b", "--json")
    assert out.returncode == 0, out.stderr
    assert b'"len":23' in out.stdout
    missing = sq(sq_env, "show", "--item", "https://example.org/a")
    assert missing.returncode == 7
    assert missing.stderr.decode().startswith("statequeue: no item")
    assert len(missing.stderr.decode().strip().splitlines()) == 1
    both = sq(sq_env, "show", "1", "--item", "first")
    assert both.returncode == 2


@pytest.mark.parametrize("lease", [float("inf"), 1e300, float("nan"), 0.1, "3", True])
def test_a_lease_no_store_can_keep_is_refused_before_the_queue_opens(
    sq_home: Path, lease: object
) -> None:
    """`Queue(lease=inf)` on PostgreSQL once failed later: a traceback of the
    heartbeat thread on stderr, then a store failure (exit 11); "3" a bare
    TypeError. As `run --lease` refuses them: a UsageError, nothing opened."""
    with pytest.raises(UsageError, match="the lease must be"):
        Queue("leased", home=sq_home, lease=lease)  # type: ignore[arg-type]
    assert not (sq_home / "leased").exists()
    with Queue("leased", home=sq_home, lease=5) as q:  # a number in range is fine
        q.enqueue(["a"])
