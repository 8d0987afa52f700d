"""`statequeue.map(..., jobs=N)` and `map_async(..., concurrency=N)` start no
more slots than there are items to run: jobs=2000 for three items started
2000 threads (and with processes=True, a pool of 2000 processes), a call
whose items were all done before still started its pool, and
concurrency=10**5 for two items made 10**5 claims from worker threads (15 s).
A jobs or concurrency that is not a whole number is a UsageError, not a
TypeError (or an ExceptionGroup) from deep inside."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import statequeue
import statequeue.api.pool_guard
from statequeue.api.map_run import MapRun
from statequeue.core.errors import UsageError

_seen: list[int] = []


def _threads_now(text: str) -> int:
    _seen.append(threading.active_count())
    return len(text)


def test_threads_are_no_more_than_the_items_to_run() -> None:
    _seen.clear()
    base = threading.active_count()
    assert statequeue.map(_threads_now, ["a", "bb", "ccc"], queue="slots", jobs=2000) == [1, 2, 3]
    assert len(_seen) == 3 and max(_seen) <= base + 3  # the caller plus at most three slots


def test_a_pool_as_large_as_the_items_to_run_and_none_when_all_are_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sizes: list[int] = []
    real = statequeue.api.pool_guard.process_pool

    @contextmanager
    def counted(jobs: int) -> Iterator[Any]:  # the real pool; only its size is noted
        sizes.append(jobs)
        with real(jobs) as pool:
            yield pool

    monkeypatch.setattr(statequeue.api.pool_guard, "process_pool", counted)
    texts = ["a", "bb"]
    assert statequeue.map(len, texts, queue="pool", jobs=64, processes=True) == [1, 2]
    assert statequeue.map(len, texts, queue="pool", jobs=64, processes=True) == [1, 2]
    assert sizes == [2]  # the second call read both results back: no pool at all


@pytest.mark.parametrize("jobs", [0, -1, 2.5, True, "4", None])
def test_jobs_must_be_a_whole_number_of_at_least_one(jobs: Any) -> None:
    with pytest.raises(UsageError, match="jobs must be a whole number, at least 1"):
        statequeue.map(len, ["a"], queue="bad-jobs", jobs=jobs)


def test_map_async_slots_are_no_more_than_the_items_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    claims: list[object] = []
    real = MapRun.take_once

    def counted(run: MapRun) -> Any:  # the real claim; each slot's calls are noted
        found = real(run)
        claims.append(found)
        return found

    monkeypatch.setattr(MapRun, "take_once", counted)

    async def size(text: str) -> int:
        return len(text)

    got = asyncio.run(statequeue.map_async(size, ["a", "bb"], queue="aslots", concurrency=5000))
    assert got == [1, 2]
    # Two slots: each claims an item, then finds none. 5000 slots asked 5000 times.
    assert len(claims) <= 4, len(claims)


@pytest.mark.parametrize("concurrency", [0, 2.5, True])
def test_concurrency_must_be_a_whole_number_of_at_least_one(concurrency: Any) -> None:
    async def size(text: str) -> int:
        return len(text)

    with pytest.raises(UsageError, match="concurrency must be a whole number, at least 1"):
        asyncio.run(statequeue.map_async(size, ["a"], queue="bad-c", concurrency=concurrency))
