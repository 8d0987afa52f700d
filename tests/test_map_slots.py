"""`statequeue.map(..., jobs=N)` starts no more slots than there are items to
run: jobs=2000 for three items started 2000 threads (and with
processes=True, a pool of 2000 processes), and a call whose items were all
done before still started its pool. A jobs that is not a whole number is a
UsageError, not a TypeError from deep inside."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import statequeue
import statequeue.api.pool_guard
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
