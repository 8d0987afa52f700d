"""Library calls a new user gets slightly wrong, from a fresh Python session
(session 11): ``result(True)`` read item 1 (a bool is an int to Python),
``cancel([True])`` cancelled it, ``retry([1.0])`` took a float as an id,
``cancel(["a.pdf"])`` died with a TypeError from deep in the store, and an
export opened without "rb" met a TypeError too. Each is now a one-line
UsageError, and nothing changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statequeue import ItemState, Queue
from statequeue.core.errors import UsageError


def _queue() -> Queue:
    q = Queue("ids")
    q.enqueue(["a.pdf", "b.pdf"])
    for item in q.work():
        item.fail("encrypted")  # both failed: retry and cancel could change them
    return q


def _states(q: Queue) -> list[ItemState]:
    return [v.state for v in q.items()]


@pytest.mark.parametrize("item", [True, False])
def test_result_and_history_refuse_a_bool(item: bool) -> None:
    with _queue() as q:
        for call in (q.result, q.history):
            with pytest.raises(UsageError, match="not bool"):
                call(item)
        assert q.result(1) is not None and q.result(1).reason == "encrypted"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("ids", "says"),
    [
        ([True], "ids\\[0\\] must be an item id \\(int\\), not bool"),
        ([1, 1.0], "ids\\[1\\] must be an item id \\(int\\), not float"),
        ([None], "not NoneType"),
        (["a.pdf"], "ids\\[0\\] is a text \\('a.pdf'\\): pass queue.find\\(text\\)"),
        ("12", "ids must be a list of item ids \\(int\\), not str"),
        (5, "not int"),
    ],
)
def test_retry_and_cancel_refuse_what_is_not_an_id(ids: Any, says: str) -> None:
    with _queue() as q:
        before = _states(q)
        for call in (q.retry, q.cancel):
            with pytest.raises(UsageError, match=says) as caught:
                call(ids)
            assert "\n" not in caught.value.message
        assert _states(q) == before == [ItemState.FAILED, ItemState.FAILED]
        assert q.cancel((2,)) == [2]  # a tuple of ints still works
        assert q.retry([1]) == [1]


def test_import_of_an_export_opened_as_text_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "ids.ndjson"
    with _queue() as q:
        q.export(path)
    with Queue("ids-copy") as copy:
        with open(path) as text, pytest.raises(UsageError, match="open\\(path, 'rb'\\)"):
            copy.import_(text)  # type: ignore[arg-type]  # the mistake under test
        assert copy.status().counts["failed"] == 0
        with open(path, "rb") as lines:
            assert copy.import_(lines).added == 2
