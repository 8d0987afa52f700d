"""``TryLater(seconds)`` and ``item.later(seconds)`` with seconds that are no
wait (negative, NaN, infinite, not a number) fail that one attempt, with a
reason naming the value, and the loop or map goes on, as ``serve`` does for
a worker's bad seconds. ``TryLater(-5)`` was taken as "now", and
``TryLater(nan)`` escaped as a UsageError that ended the whole work() loop
(its item given back) or aborted the whole map."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

import statequeue
from statequeue import ItemState, MapFailed, Queue, TryLater

BAD = [(-5, "-5"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), ("soon", "'soon'")]
IDS = ["negative", "nan", "inf", "-inf", "str"]


def reason_for(shown: str) -> str:
    return f"TryLater: seconds must be a number >= 0, not {shown}"


def settled(q: Queue) -> dict[str, tuple[ItemState, str]]:
    return {v.item: (v.state, v.reason) for v in q.items()}


@pytest.mark.parametrize(("seconds", "shown"), BAD, ids=IDS)
def test_work_fails_the_attempt_and_goes_on(sq_home: Path, seconds: Any, shown: str) -> None:
    with Queue("w") as q:
        q.enqueue(["bad", "good"])
        seen = []
        for item in q.work():
            seen.append(item.item)
            with item:
                if item.item == "bad":
                    raise TryLater(seconds)
            if item.item == "good":
                break  # the old code could defer "bad" for a day: never wait for it
        assert seen == ["bad", "good"]
        assert settled(q) == {
            "bad": (ItemState.FAILED, reason_for(shown)),
            "good": (ItemState.DONE, ""),
        }
        assert [e for e in q.events() if e["t"] == "defer"] == []


def test_a_bad_delay_is_retried_as_any_failure(sq_home: Path) -> None:
    with Queue("r") as q:
        q.enqueue(["bad"])
        attempts = 0
        for item in q.work(retries=1, retry_delay=0):
            with item:
                attempts += 1
                raise TryLater(-1)
        assert attempts == 2
        assert settled(q) == {"bad": (ItemState.FAILED, reason_for("-1"))}


@pytest.mark.parametrize(("seconds", "shown"), BAD, ids=IDS)
def test_item_later_fails_the_attempt(sq_home: Path, seconds: Any, shown: str) -> None:
    with Queue("l") as q:
        q.enqueue(["bad", "good"])
        for item in q.work():
            with item:
                if item.item == "bad":
                    assert item.later(seconds) is ItemState.FAILED
            if item.item == "good":
                break
        assert settled(q)["bad"] == (ItemState.FAILED, reason_for(shown))
        assert settled(q)["good"] == (ItemState.DONE, "")


def test_work_async_fails_the_attempt_and_goes_on(sq_home: Path) -> None:
    async def main(q: Queue) -> None:
        async for item in q.work_async(concurrency=1):
            async with item:
                if item.item == "raised":
                    raise TryLater(math.nan)
                if item.item == "asked":
                    assert await item.later(-2.5) is ItemState.FAILED
            if item.item == "good":
                break

    with Queue("a") as q:
        q.enqueue(["raised", "asked", "good"])
        asyncio.run(main(q))
        assert settled(q) == {
            "raised": (ItemState.FAILED, reason_for("nan")),
            "asked": (ItemState.FAILED, reason_for("-2.5")),
            "good": (ItemState.DONE, ""),
        }


def later_nan(item: str) -> str:
    if item == "bad":
        raise TryLater(float("nan"))
    return item.upper()


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_map_fails_the_item_and_goes_on(sq_home: Path, processes: bool) -> None:
    items = ["a", "bad", "c"]
    with pytest.raises(MapFailed) as failed:
        statequeue.map(later_nan, items, queue="m", jobs=2, processes=processes)
    assert failed.value.failures == [("bad", reason_for("nan"))]
    assert failed.value.results == ["A", None, "C"]
    assert isinstance(failed.value.errors["bad"], TryLater)


def test_map_async_fails_the_item_and_goes_on(sq_home: Path) -> None:
    async def fn(item: str) -> str:
        return later_nan(item)

    with pytest.raises(MapFailed) as failed:
        asyncio.run(statequeue.map_async(fn, ["a", "bad"], queue="ma"))
    assert failed.value.failures == [("bad", reason_for("nan"))]


def test_a_wait_past_a_float_is_a_day(sq_home: Path) -> None:
    with Queue("big") as q:
        q.enqueue(["a"])
        for item in q.work():
            with item:
                raise TryLater(10**400)  # float() of it raised OverflowError
            break  # else the loop waits the day out for it
        [deferral] = [e for e in q.events() if e["t"] == "defer"]
    assert deferral["delay"] == 86400
