"""asyncio: ``Queue.work_async`` and ``statequeue.map_async`` (issue 13 point 4)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import statequeue
from statequeue import ItemState, MapFailed, Queue
from tests.library_kill import run_kill_and_resume


@pytest.fixture
def store_threads(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads that call the store through claim and finish."""
    seen: set[int] = set()
    for name in ("claim", "finish", "enqueue"):
        original = getattr(Queue, name)

        def spy(self: Queue, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.add(threading.get_ident())
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Queue, name, spy)
    return seen


def test_map_async_in_order_with_failures_and_off_the_loop(
    sq_home: Path, store_threads: set[int]
) -> None:
    running = 0
    most = 0

    async def fn(item: str) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        running -= 1
        if item == "boom":
            raise RuntimeError("no")
        return item[::-1]

    items = ["abc", "boom", *[f"x{i}" for i in range(20)]]

    async def main() -> int:
        with pytest.raises(MapFailed) as caught:
            await statequeue.map_async(fn, items, queue="am", concurrency=5)
        assert caught.value.failures == [("boom", "RuntimeError: no")]
        assert caught.value.results == [i[::-1] if i != "boom" else None for i in items]
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert 1 < most <= 5
    assert store_threads and loop_thread not in store_threads


def test_map_async_reads_back_done_items(sq_home: Path) -> None:
    calls: list[str] = []

    async def fn(item: str) -> int:
        calls.append(item)
        return len(item)

    assert asyncio.run(statequeue.map_async(fn, ["aa", "b"], queue="rb")) == [2, 1]
    assert asyncio.run(statequeue.map_async(fn, ["b", "ccc", "aa"], queue="rb")) == [1, 3, 2]
    assert calls == ["aa", "b", "ccc"]


def test_work_async_bounds_what_is_out_and_settles_by_policy(
    sq_home: Path, store_threads: set[int]
) -> None:
    out = 0
    most = 0

    async def handle(item: statequeue.AsyncWorkItem) -> None:
        nonlocal out, most
        out += 1
        most = max(most, out)
        try:
            async with item:
                await asyncio.sleep(0.001)
                if item.item == "flaky" and item.attempt == 1:
                    raise ConnectionError("reset")
                if item.item == "bad":
                    raise ValueError("bad")
                await item.done(item.item.upper())
        finally:
            out -= 1

    async def main(q: Queue) -> int:
        async with asyncio.TaskGroup() as tg:
            async for item in q.work_async(concurrency=3, retries=1, retry_delay=0.01):
                tg.create_task(handle(item))
        return threading.get_ident()

    with Queue("wa") as q:
        q.enqueue(["flaky", "bad", *[f"i{n}" for n in range(12)]])
        store_threads.clear()  # that enqueue ran here, before the loop
        loop_thread = asyncio.run(main(q))
        assert 1 < most <= 3
        assert q.result("flaky").result == "FLAKY"  # type: ignore[union-attr]
        bad = q.result("bad")
        assert bad is not None and bad.state is ItemState.FAILED and bad.reason == "ValueError: bad"
        assert q.status().counts["done"] == 13
        assert store_threads and loop_thread not in store_threads


def test_cancelling_work_async_gives_the_items_back(sq_home: Path) -> None:
    started = 0

    async def main(q: Queue) -> None:
        async def handle(item: statequeue.AsyncWorkItem) -> None:
            nonlocal started
            async with item:
                started += 1
                await asyncio.Event().wait()  # never set: cancelled below

        async def loop() -> None:
            async with asyncio.TaskGroup() as tg:
                async for item in q.work_async(concurrency=2):
                    tg.create_task(handle(item))

        task = asyncio.create_task(loop())
        while started < 2:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with Queue("cx") as q:
        q.enqueue(["a", "b", "c"])
        asyncio.run(main(q))
        assert [v.state for v in q.items()] == [ItemState.PENDING] * 3
        assert q.status().runners == ()


def test_kill_9_during_map_async_then_resume(tmp_path: Path, sq_env: dict[str, str]) -> None:
    run_kill_and_resume(tmp_path, sq_env, "map_async")


def test_kill_9_during_work_async_then_resume(tmp_path: Path, sq_env: dict[str, str]) -> None:
    run_kill_and_resume(tmp_path, sq_env, "work_async")


# Issue 21 point 13: a done() not awaited (a common slip) must never leave the
# loop waiting in silence. wait_for is a hang guard only, never a timing.
HANG_GUARD = 30.0


@pytest.mark.parametrize("concurrency", [1, 3])
def test_work_async_settles_items_whose_done_is_not_awaited(
    sq_home: Path, concurrency: int
) -> None:
    async def main(q: Queue) -> list[str]:
        seen: list[str] = []
        async for item in q.work_async(concurrency=concurrency):
            seen.append(item.item)
            item.done(item.item.upper())  # the slip: never awaited
        return seen

    with Queue("na") as q:
        q.enqueue(["a", "b", "c", "d", "e"])
        seen = asyncio.run(asyncio.wait_for(main(q), HANG_GUARD))
        assert sorted(seen) == ["a", "b", "c", "d", "e"]
        assert [q.result(t).result for t in "abcde"] == list("ABCDE")  # type: ignore[union-attr]
        assert q.status().counts["done"] == 5 and q.status().runners == ()


def test_work_async_fail_not_awaited_inside_async_with(sq_home: Path) -> None:
    async def main(q: Queue) -> None:
        async for item in q.work_async(concurrency=2):
            async with item:
                item.fail("no")  # not awaited: the block waits for it, not done(None) again

    with Queue("nf") as q:
        q.enqueue(["a", "b"])
        asyncio.run(asyncio.wait_for(main(q), HANG_GUARD))
        assert {r.reason for r in q.results()} == {"no"}
        assert q.status().counts["failed"] == 2


def test_work_async_raises_the_error_of_a_settle_nobody_awaited(sq_home: Path) -> None:
    async def main(q: Queue) -> None:
        async for item in q.work_async(concurrency=1):
            await item.release("later")
            item.done()  # not awaited, and fails: the item was given back already

    with Queue("ne") as q:
        q.enqueue(["a", "b"])
        with pytest.raises(statequeue.UsageError, match="was given back"):
            asyncio.run(asyncio.wait_for(main(q), HANG_GUARD))
        assert [v.state for v in q.items()] == [ItemState.PENDING] * 2
        assert q.status().runners == ()


def test_cancelling_the_task_group_loop_raises_cancelled_error(sq_home: Path) -> None:
    """The documented pattern (``work_async`` feeding a TaskGroup), cancelled
    mid-way: the loop's end gave back the items out while their handlers
    still ran, and a handler's done() then failed ("already settled", "no
    longer claimed"): the group raised an ExceptionGroup of store errors
    instead of CancelledError, about half the time. Cancelled at several
    points; each must end as a cancellation with nothing left claimed."""

    outcomes = []
    for n, delay in enumerate((0.05, 0.1, 0.15, 0.2, 0.25, 0.3)):
        q = Queue(f"tg{n}", home=sq_home)
        q.enqueue([f"p{i}" for i in range(400)])

        async def main(q: Queue = q, delay: float = delay) -> str:
            async def handle(item: Any) -> None:
                async with item:
                    await asyncio.sleep(0.005)
                    await item.done(item.item.upper())

            async def loop() -> None:
                async with asyncio.TaskGroup() as tg:
                    async for item in q.work_async(concurrency=8):
                        tg.create_task(handle(item))

            task = asyncio.create_task(loop())
            await asyncio.sleep(delay)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "cancelled"
            except BaseException as exc:  # reported by the assertion
                return repr(exc)
            return "finished"

        outcomes.append(asyncio.run(main()))
        status = q.status()
        assert status.counts["running"] == 0, (n, status.counts)
        assert status.runners == ()
        done = {r.item: r.result for r in q.results(ItemState.DONE)}
        assert all(result == item.upper() for item, result in done.items())
        q.close()
    assert set(outcomes) <= {"cancelled", "finished"}, outcomes
