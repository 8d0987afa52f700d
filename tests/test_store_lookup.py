"""The store methods the library's lookups use (issue 13): ``find_ids`` (by
exact text, archived items included), ``states`` and ``heartbeat``, on every store."""

from __future__ import annotations

from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from tests.test_store_contract import Harness, harness  # noqa: F401  (the fixture)


def test_find_ids_and_states_by_exact_text(harness: Harness) -> None:  # noqa: F811
    store = harness.open()
    store.enqueue(["a", "b", "bad\udcff", "c"])
    runner = new_runner()
    claim = store.claim(runner)
    assert claim is not None and claim.item == "a"
    store.heartbeat(claim)  # no lease to renew: nothing happens, nothing breaks
    store.finish(claim, Outcome(ok=True, result=1))
    store.compact()  # "a" moves to the archive where the store has one
    ids = store.find_ids(["a", "bad\udcff", "c", "A", "nope"])
    assert sorted(ids) == ["a", "bad\udcff", "c"]
    assert store.states(ids.values()) == {
        ids["a"]: ItemState.DONE,
        ids["bad\udcff"]: ItemState.PENDING,
        ids["c"]: ItemState.PENDING,
    }
    assert store.states([999]) == {}
