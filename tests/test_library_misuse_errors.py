"""Library misuse gets a StateQueueError with one line, never a TypeError,
AttributeError or OSError from deep inside, and never a silent no-op.

Found by an outside tester of the library: ``@resumable`` without
parentheses returned the decorator (the work never ran); ``map(None, ...)``
recorded every item failed; ``retries="2"``, ``concurrency="3"``,
``store=5``, ``stats(since="1d")``, ``import_(5)``, an export to a text
stream and a home that is a loop of links raised Python's own errors; a
home that links to nothing was called "not a folder".
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statequeue
from statequeue.api.queue import Queue
from statequeue.core.errors import QueueNotFound, StateQueueError, UsageError

CALLS: list[str] = []


@statequeue.resumable
def shout(text: str) -> str:
    CALLS.append(text)
    return text.upper()


def test_resumable_without_parentheses_decorates(sq_home: Path) -> None:
    CALLS.clear()
    assert shout("a") == "A" and shout("a") == "A"
    assert CALLS == ["a"]  # the second call read the stored result


def test_map_refuses_a_function_that_is_not_callable(sq_home: Path) -> None:
    with pytest.raises(UsageError, match="fn must be a function"):
        statequeue.map(None, ["a", "b"], queue="nc")  # type: ignore[arg-type]
    with pytest.raises(QueueNotFound):
        Queue("nc", create=False)  # nothing was written


def _work(**kw: Any) -> Callable[[], object]:
    def run() -> object:
        with Queue("w") as q:
            q.enqueue(["a"])
            return next(iter(q.work(**kw)))

    return run


def _work_async(concurrency: Any) -> Callable[[], object]:
    async def first() -> None:
        with Queue("wa") as q:
            q.enqueue(["a"])
            async for item in q.work_async(concurrency=concurrency):
                await item.done()

    return lambda: asyncio.run(first())


def _with_queue(call: Callable[[Queue], object]) -> Callable[[], object]:
    def run() -> object:
        with Queue("q") as q:
            return call(q)

    return run


CASES: list[tuple[str, Callable[[], object], str]] = [
    ("retries str", _work(retries="2"), "retries must be a whole number"),
    ("retries None", _work(retries=None), "retries must be a whole number"),
    ("max_crashes None", _work(max_crashes=None), "max_crashes must be a whole number"),
    ("max_deferrals str", _work(max_deferrals="x"), "max_deferrals must be a whole number"),
    ("retries float", _work(retries=2.5), "retries must be a whole number"),
    ("retry_delay bool", _work(retry_delay=True), "retry_delay must be"),
    (
        "map retries",
        lambda: statequeue.map(str, ["a"], queue="m", retries="2"),  # type: ignore[arg-type]
        "retries must be a whole number",
    ),
    ("concurrency str", _work_async("3"), "concurrency must be a whole number"),
    ("concurrency None", _work_async(None), "concurrency must be a whole number"),
    ("store int", lambda: Queue("s", store=5), "store must be a URL"),  # type: ignore[arg-type]
    ("stats since str", _with_queue(lambda q: q.stats(since="1d")), "since must be"),  # type: ignore[arg-type]
    ("stats since negative", _with_queue(lambda q: q.stats(since=-5)), "since must be"),
    ("report since nan", _with_queue(lambda q: q.report(since=float("nan"))), "since must be"),
    ("import int", _with_queue(lambda q: q.import_(5)), "import_ takes"),  # type: ignore[arg-type]
    ("export text", _with_queue(lambda q: q.export(io.StringIO())), "binary stream"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call", "said"), CASES, ids=[c[0] for c in CASES])
def test_misuse_is_one_usage_error(
    sq_home: Path, name: str, call: Callable[[], object], said: str
) -> None:
    with pytest.raises(UsageError) as raised:
        call()
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_home_that_is_a_loop_of_links_or_links_to_nothing(tmp_path: Path) -> None:
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    with pytest.raises(UsageError, match="is a loop of symbolic links"):
        Queue("q", home=tmp_path / "a")
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    with pytest.raises(StateQueueError, match=r"links to .*missing, which does not exist"):
        Queue("q", home=tmp_path / "dangling")
    with pytest.raises(QueueNotFound, match="which does not exist"):
        Queue("q", home=tmp_path / "dangling", create=False)
