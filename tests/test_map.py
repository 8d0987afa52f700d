"""``statequeue.map`` and ``@statequeue.resumable`` (issue 13 point 3)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import statequeue
from statequeue import ItemState, MapFailed, Queue, UsageError
from tests.library_kill import run_kill_and_resume


def square(item: str) -> int:
    """Module level: a process pool pickles it by name."""
    return int(item) ** 2


def test_results_come_back_in_input_order_and_done_items_are_read_back(
    sq_home: Path,
) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def fn(item: str) -> dict[str, object]:
        with lock:
            calls[item] += 1
        return {"item": item, "pair": (1, 2)}

    items = [f"u{i}" for i in range(30, 0, -1)]
    first = statequeue.map(fn, items[:10], queue="crawl", jobs=4)
    assert [r["item"] for r in first] == items[:10]
    assert first[0]["pair"] == [1, 2]  # as stored: JSON
    both = statequeue.map(fn, [*items, "u30"], queue="crawl", jobs=4)
    assert [r["item"] for r in both] == [*items, "u30"]
    assert set(calls.values()) == {1}  # nothing ran twice; the repeat is deduped
    with Queue("crawl") as q:
        assert q.status().counts["done"] == 30


def test_failures_are_reported_together_after_the_others_ran(sq_home: Path) -> None:
    def fn(item: str) -> str:
        if item in ("b", "d"):
            raise ValueError(f"bad {item}")
        return item * 2

    with pytest.raises(MapFailed) as caught:
        statequeue.map(fn, ["a", "b", "c", "d", "e"], queue="m", jobs=2)
    assert caught.value.failures == [("b", "ValueError: bad b"), ("d", "ValueError: bad d")]
    assert caught.value.results == ["aa", None, "cc", None, "ee"]
    assert isinstance(caught.value, statequeue.StateQueueError)


def test_retries_follow_the_policy_and_a_later_call_tries_failed_items_again(
    sq_home: Path,
) -> None:
    tries: Counter[str] = Counter()

    def flaky(item: str) -> str:
        tries[item] += 1
        if tries[item] < 3:
            raise TimeoutError("try again")
        return "ok"

    with pytest.raises(MapFailed):
        statequeue.map(flaky, ["x"], queue="r", retries=1, retry_delay=0)
    assert tries["x"] == 2
    assert statequeue.map(flaky, ["x"], queue="r", retries=1, retry_delay=0.01) == ["ok"]
    assert tries["x"] == 3


def test_a_result_that_is_not_json_fails_its_item_only(sq_home: Path) -> None:
    def fn(item: str) -> object:
        return {1, 2} if item == "set" else item

    with pytest.raises(MapFailed) as caught:
        statequeue.map(fn, ["a", "set", "b"], queue="j")
    assert caught.value.results == ["a", None, "b"]
    [(item, reason)] = caught.value.failures
    assert item == "set"
    assert reason.startswith("InvalidResult: ")


def test_processes_use_a_pool_and_the_parent_records(sq_home: Path) -> None:
    assert statequeue.map(square, ["3", "1", "2"], queue="p", jobs=2, processes=True) == [9, 1, 4]
    with Queue("p") as q:
        assert [r.result for r in q.results()] == [9, 1, 4]


def test_processes_refuse_a_function_a_pool_cannot_receive_before_claiming(
    sq_home: Path,
) -> None:
    # A lambda cannot be pickled: every item was claimed and recorded as
    # failed (PicklingError) for a mistake of the call's, not of the items'.
    with pytest.raises(UsageError, match="must be picklable"):
        statequeue.map(lambda item: item, ["a", "b"], queue="lam", processes=True)
    with Queue("lam") as q:  # nothing was enqueued, claimed or recorded
        assert sum(q.status().counts.values()) == 0


def test_processes_work_when_the_program_holds_fds_past_1024(sq_home: Path) -> None:
    # The claim lender and the sentinels once waited in select(), which cannot
    # watch an fd past FD_SETSIZE: a program (a test suite) holding 1,100 open
    # files saw every item fail with "TimeoutError: timed out" after 30 s.
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    spare = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(1100)]
    try:
        assert max(spare) > 1024
        assert statequeue.map(square, ["3", "1", "2"], queue="fds", jobs=2, processes=True) == [
            9,
            1,
            4,
        ]
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_processes_on_a_store_without_claim_fds(sq_home: Path) -> None:
    """The memory store lends no claim fds: the pool's tasks run all the same."""
    from statequeue.store.memory import MemoryStore

    found = statequeue.map(square, ["2", "5"], jobs=2, processes=True, store=MemoryStore())
    assert found == [4, 25]


def test_resumable_runs_each_item_once_and_returns_the_stored_result(sq_home: Path) -> None:
    calls: list[str] = []

    @statequeue.resumable(queue="dec")
    def fetch(url: str) -> int:
        """Fetch one URL."""
        calls.append(url)
        return len(url)

    assert fetch.__name__ == "fetch"
    assert fetch.__doc__ == "Fetch one URL."
    assert fetch("abc") == 3
    assert fetch("abc") == 3
    assert fetch("hello") == 5
    assert calls == ["abc", "hello"]
    with Queue("dec") as q:
        assert q.result("abc").result == 3  # type: ignore[union-attr]


def test_map_refuses_a_single_text_and_bad_jobs(sq_home: Path) -> None:
    with pytest.raises(UsageError, match="iterable of items"):
        statequeue.map(len, "abc", queue="s")
    with pytest.raises(UsageError):
        statequeue.map(len, ["abc"], queue="s", jobs=0)


def test_map_on_postgres(sq_home: Path, pg_url: str) -> None:
    items = ["c", "a", "b"]
    assert statequeue.map(str.upper, items, queue="pgmap", store=pg_url, jobs=2) == ["C", "A", "B"]

    def never(item: str) -> str:
        raise AssertionError("done items must be read back, not run")

    assert statequeue.map(never, items, queue="pgmap", store=pg_url) == ["C", "A", "B"]
    with Queue("pgmap", store=pg_url) as q:
        assert q.result("a").result == "A"  # type: ignore[union-attr]
        assert q.items(ItemState.DONE)[0].item == "c"


def test_kill_9_during_map_then_resume(tmp_path: Path, sq_env: dict[str, str]) -> None:
    run_kill_and_resume(tmp_path, sq_env, "map")


def test_map_waits_while_paused_and_a_pause_after_the_last_claim_does_not_hold_it(
    sq_home: Path,
) -> None:
    with Queue("pz") as q:
        q.pause()
        got: list[object] = []
        started, release = threading.Event(), threading.Event()

        def fn(item: str) -> str:
            started.set()
            assert release.wait(timeout=60)
            return item

        def call() -> None:
            got.append(statequeue.map(fn, ["only"], queue=q, jobs=2))

        t = threading.Thread(target=call, daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not q.status().runners:  # the map has started, and waits
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not started.is_set()
        q.resume()
        assert started.wait(timeout=30)
        q.pause()  # the other slot has nothing left to wait for
        release.set()
        t.join(timeout=30)
        q.resume()
        assert not t.is_alive(), "a pause held a map whose items were all taken"
        assert got == [["only"]]
