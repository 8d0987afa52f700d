"""A Queue shared by threads or across fork, and the API's errors for bad
results and a closed queue (issue 10 points 8, 9 and 11)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import InvalidResult, QueueClosed, StateQueueError
from statequeue.store.journal.fsck import fsck

THREADS = 8
BATCHES = 4
BATCH = 25


def ends_per_item(q: Queue) -> Counter[int]:
    records, _ = q.store.read_events(None)
    return Counter(r["id"] for r in records if r["t"] == "end")


def assert_each_done_once(q: Queue, total: int) -> None:
    assert q.status().counts["done"] == total
    ends = ends_per_item(q)
    assert sorted(ends) == list(range(1, total + 1))
    assert set(ends.values()) == {1}
    report = fsck(q.path, repair=False)  # type: ignore[arg-type]
    assert not report.damaged


def test_threads_enqueue_and_work_over_one_queue(sq_home: Path) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(n: int) -> None:
        try:
            start.wait()
            for b in range(BATCHES):
                q.enqueue([f"t{n}-b{b}-{i}" for i in range(BATCH)])
                for item in q.work():
                    item.done({"thread": n})
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    with Queue(home=sq_home) as q:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        for item in q.work():  # anything enqueued after every worker looked
            item.done("late")
        assert_each_done_once(q, THREADS * BATCHES * BATCH)


FORK_SCRIPT = r"""
import os, sys, traceback
from statequeue.core.errors import StateQueueError
from statequeue.api.queue import Queue
from statequeue.store.memory import MemoryStore

home, items = sys.argv[1], int(sys.argv[2])
q = Queue(home=home)
q.enqueue([f"item{i}" for i in range(items)])
work = q.work()
held = next(work)  # the parent holds a claim across the fork
mem = Queue(store=MemoryStore())
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:
    code = 0
    try:
        try:
            mem.status()
            code = 10  # a queue that cannot be reopened must refuse
        except StateQueueError as exc:
            assert "fork" in exc.message, exc.message
        with q:
            q.enqueue(["from-child"])
            child_work = q.work()
            first = next(child_work)  # both processes now hold a claim
            os.write(ready_w, b"x")
            first.done("child")
            for item in child_work:
                item.done("child")
    except BaseException:
        traceback.print_exc()
        code = 11
    os._exit(code)
os.read(ready_r, 1)  # both work the queue at the same time from here
held.done("parent")
for item in work:
    item.done("parent")
_, status = os.waitpid(pid, 0)
q.close()
print(os.waitstatus_to_exitcode(status))
"""
FORK_ITEMS = 300


def test_a_forked_child_reopens_and_the_parent_keeps_working(
    sq_home: Path, sq_env: dict[str, str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(sq_home), str(FORK_ITEMS)],
        env=sq_env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "0", done.stderr.decode()
    with Queue(home=sq_home) as q:
        assert_each_done_once(q, FORK_ITEMS + 1)
        by = Counter(str(r.result) for r in q.results())
        assert by["child"] >= 1 and by["parent"] >= 1  # both settled their first claim


def test_settling_after_close_is_a_statequeue_error(sq_home: Path) -> None:
    q = Queue(home=sq_home)
    q.enqueue(["a"])
    item = next(q.work())
    q.close()
    # The loop ended with the close (its item went back): done() says so.
    with pytest.raises(StateQueueError, match="given back"):
        item.done()
    with pytest.raises(QueueClosed):
        q.status()
    q.close()  # twice is fine


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (set(), "not JSON serializable: set"),
        ({1: "x"}, "key must be str"),
        ("bad \ud800", "surrogates"),
        (_deep(300), "nested deeper than 250 levels"),
    ],
    ids=["set", "int-keys", "lone-surrogate", "deep"],
)
def test_a_result_json_cannot_hold_is_named(sq_home: Path, result: Any, problem: str) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
        for item in q.work():
            with pytest.raises(InvalidResult, match=problem):
                item.done(result)
            with pytest.raises(InvalidResult, match="reason"):
                item.fail("bad \ud800")
            assert not item.settled  # nothing was recorded: it can still be settled
            item.done("fine")
        assert [r.result for r in q.results()] == ["fine"]
        assert isinstance(InvalidResult(), StateQueueError)
