"""``map(processes=True)``: an item whose call kills its pool worker (a
segfault in native code, the OOM killer, ``os._exit``) is an interrupted
attempt, a crash, as when the whole program dies under ``processes=False``:
after ``max_crashes`` (3) it is held and the map ends with MapFailed, the
other items done. It once gave the item back uncounted and stopped with
PoolBroken on every call, so the map could never finish."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

import statequeue
from statequeue import ItemState, MapFailed, Queue
from statequeue.core.errors import PoolBroken  # statequeue.PoolBroken, where it is exported

ITEMS = ["a", "b", "c", "d", "e", "k"]


def dies(item: str) -> str:
    if item == "d":
        os._exit(3)
    if item == "k":
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
    return item.upper()


def terminated(item: str) -> str:
    if item == "t":  # as the pool ends the other workers once one dies
        os.kill(os.getpid(), signal.SIGTERM)
    return item.upper()


def crashes(q: Queue, item: str) -> list[dict[str, Any]]:
    return [e for e in q.history(item).events if e["t"] == "intr" and e.get("crashes")]


def test_an_item_that_kills_its_worker_is_held_after_max_crashes(sq_home: Path) -> None:
    for call in (1, 2):  # a later call gives it a new episode, and ends the same way
        with pytest.raises(MapFailed) as failed:
            statequeue.map(dies, ITEMS, queue="crash", jobs=2, processes=True)
        assert failed.value.failures == [("d", "held"), ("k", "held")]
        assert failed.value.results == ["A", "B", "C", None, "E", None]
        with Queue("crash") as q:
            assert {v.item: v.state for v in q.items()} == {
                **{i: ItemState.DONE for i in "abce"},
                "d": ItemState.HELD,
                "k": ItemState.HELD,
            }
            for item, how in (("d", "exited with code 3"), ("k", "was killed by signal 9")):
                found = crashes(q, item)
                assert len(found) == 3 * call, found
                assert how in found[0]["reason"], found
            for item in "abce":  # in flight when a worker died, maybe: no crash of theirs
                assert crashes(q, item) == []


def test_a_worker_ended_as_the_pool_ends_them_stops_the_map(sq_home: Path) -> None:
    """A worker ended by SIGTERM cannot be told from one the pool terminated:
    no item is blamed, the map stops with PoolBroken and gives the item back."""
    with pytest.raises(PoolBroken, match="a worker process of the map died"):
        statequeue.map(terminated, ["t"], queue="term", jobs=1, processes=True)
    with Queue("term") as q:
        assert [v.state for v in q.items()] == [ItemState.PENDING]
        assert crashes(q, "t") == []
