"""The store contract, run against every store (journal, memory and PostgreSQL).

A new backend must pass this file unchanged: add it to ``STORES``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.errors import RunnerActive, StateQueueError
from statequeue.core.exported import ExportedItem
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, OnInterrupted, Outcome
from statequeue.store.base import Store
from statequeue.store.journal.store import JournalStore
from statequeue.store.memory import MemoryStore

OK = Outcome(ok=True)
BAD = Outcome(ok=False, exit_code=1, reason="exit code 1")


class Harness:
    """Opens a store and simulates the death of the processes using it."""

    def __init__(self, kind: str, folder: Path, url: str = "") -> None:
        self.kind = kind
        self.folder = folder
        self.url = url
        self.opened: list[Store] = []
        self._memory = MemoryStore("q")

    def open(self) -> Store:
        store: Store
        if self.kind == "memory":
            store = self._memory
        elif self.kind == "postgres":
            from statequeue.store.postgres import PostgresStore

            store = PostgresStore(self.url, "q")
        else:
            store = JournalStore(self.folder, create=True)
        self.opened.append(store)
        return store

    def crash(self, store: Store) -> Store:
        """The process holding ``store`` dies; return a fresh process's store."""
        if isinstance(store, MemoryStore):
            store.crash()
        else:
            store.close()
        if self.kind == "postgres":
            age_leases(self.url)  # its leases run out: no heartbeat renews them
        return self.open()

    def close(self) -> None:
        for store in self.opened:
            store.close()


STORES = ["journal", "memory", "postgres"]


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    h = Harness(request.param, tmp_path / "q", url)
    yield h
    h.close()


def age_leases(url: str) -> None:
    """As if every lease and runner heartbeat in the database had run out."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE statequeue.live SET lease_until = clock_timestamp() - interval '1s'")
        conn.execute("UPDATE statequeue.runners SET seen_at = seen_at - interval '1 day'")
        conn.execute("UPDATE statequeue.queues SET last_reap_at = NULL")


def counts(store: Store) -> dict[str, int]:
    return {k: v for k, v in store.status().counts.items() if v}


def test_empty_queue_claims_nothing(harness: Harness) -> None:
    store = harness.open()
    assert store.claim(new_runner()) is None
    assert store.status().total == 0


def test_enqueue_dedupes_in_any_state_and_keeps_order(harness: Harness) -> None:
    store = harness.open()
    assert store.enqueue(["a", "b", "a", "c"]).added == 3
    runner = new_runner()
    first = store.claim(runner)
    assert first is not None and first.item == "a" and first.attempt == 1
    store.finish(first, OK)
    second = store.claim(runner)
    assert second is not None and second.item == "b"
    store.finish(second, BAD)
    result = store.enqueue(["a", "b", "c", "d"])
    assert (result.added, result.skipped) == (1, 3)
    order = []
    while (claim := store.claim(runner)) is not None:
        order.append(claim.item)
        store.finish(claim, OK)
    assert order == ["c", "d"]
    assert counts(store) == {"done": 3, "failed": 1}


def test_failure_is_reported_with_its_reason(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["x"])
    claim = store.claim(new_runner())
    assert claim is not None
    assert store.finish(claim, BAD) is ItemState.FAILED
    failures = store.status().recent_failures
    assert [(f.item, f.reason) for f in failures] == [("x", "exit code 1")]


def test_retry_at_defers_the_item_without_blocking_others(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["slow", "next"])
    runner = new_runner()
    claim = store.claim(runner)
    assert claim is not None and claim.item == "slow"
    store.finish(claim, BAD, retry_at=time.time() + 3600)
    other = store.claim(runner)
    assert other is not None and other.item == "next"
    store.finish(other, OK)
    assert store.claim(runner) is None
    assert store.next_due() is not None


def test_due_retry_is_claimed_with_the_next_attempt(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["x"])
    runner = new_runner()
    claim = store.claim(runner)
    assert claim is not None
    assert store.finish(claim, BAD, retry_at=time.time() - 1) is ItemState.PENDING
    again = store.claim(runner)
    assert again is not None and again.attempt == 2


def test_crashed_claim_is_recovered_with_attempt_incremented(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a", "b"])
    claim = store.claim(new_runner())
    assert claim is not None and claim.item == "a"
    store = harness.crash(store)
    assert counts(store) == {"running": 1, "pending": 1}
    again = store.claim(new_runner())
    assert again is not None
    assert (again.item, again.attempt, again.interrupted) == ("a", 2, True)


def test_live_claim_is_never_recovered(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a"])
    claim = store.claim(new_runner())
    assert claim is not None
    other = harness.open() if harness.kind != "memory" else store
    assert other.claim(new_runner()) is None
    assert other.status().counts["running"] == 1


def test_poison_item_is_held_after_max_crashes(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["poison", "fine"])
    for _ in range(2):
        claim = store.claim(new_runner(), max_crashes=2)
        assert claim is not None and claim.item == "poison"
        store = harness.crash(store)
    claim = store.claim(new_runner(), max_crashes=2)
    assert claim is not None and claim.item == "fine"
    status = store.status()
    assert status.counts["held"] == 1 and status.held == (1,)


@pytest.mark.parametrize(
    ("policy", "state"), [(OnInterrupted.FAIL, "failed"), (OnInterrupted.HOLD, "held")]
)
def test_on_interrupted_policy(harness: Harness, policy: OnInterrupted, state: str) -> None:
    store = harness.open()
    store.enqueue(["a"])
    assert store.claim(new_runner()) is not None
    store = harness.crash(store)
    assert store.claim(new_runner(), on_interrupted=policy) is None
    assert counts(store) == {state: 1}


def test_release_returns_item_without_counting_a_crash(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a"])
    runner = new_runner()
    claim = store.claim(runner)
    assert claim is not None
    store.release(claim, "stopped by signal")
    again = store.claim(runner, max_crashes=1)
    assert again is not None and again.item == "a" and not again.interrupted


def test_a_user_retry_starts_the_item_afresh(harness: Harness) -> None:
    """A user's retry of a held item whose last attempt was interrupted: on
    every store it is pending with no crash counted, no interrupted mark
    (``status``, ``--verify`` and ``--on-interrupted`` read it) and due at
    once. An import brings such an item in as the export had it."""
    store = harness.open()
    held = ExportedItem(
        item_id=1,
        item="x",
        state=ItemState.HELD,
        attempts=2,
        crashes=2,
        reason="poison",
        retry_at=time.time() + 3600,
        interrupted=True,
    )
    assert store.import_items([held]).added == 1
    assert store.retry([1]) == [1]
    store = harness.crash(store)  # read back as well as written
    assert store.status().interrupted_pending == ()
    claim = store.claim(new_runner(), max_crashes=3)
    assert claim is not None and claim.item == "x" and not claim.interrupted
    store = harness.crash(store)
    store.recover(max_crashes=3)
    assert counts(store) == {"pending": 1}  # its first crash since the retry: not poison


def test_a_user_retry_or_cancel_is_the_reason_an_item_shows(harness: Harness) -> None:
    """After a user's retry or cancel, every store shows that as the item's
    reason (`list`, `show`): the last thing that happened to it. The journal
    (and memory) store kept the reason of the recovery or failure before it,
    PostgreSQL said "retry by user" / "cancel by user"."""
    store = harness.open()
    store.enqueue(["to-retry", "failed", "to-cancel"])
    runner = new_runner()
    for _ in range(3):
        claim = store.claim(runner)
        assert claim is not None
        if claim.item == "failed":
            store.finish(claim, BAD)
    store = harness.crash(store)  # "to-retry" and "to-cancel" were in flight
    store.recover(on_interrupted=OnInterrupted.HOLD)
    before = {v.item: v.reason for v in store.items()}
    assert before["failed"] == "exit code 1" and "interrupted" in before["to-cancel"], before
    assert store.retry([1, 2]) == [1, 2]
    assert store.cancel([3]) == [3]
    wanted = {"to-retry": "retry by user", "failed": "retry by user", "to-cancel": "cancel by user"}
    assert {v.item: v.reason for v in store.items()} == wanted
    store = harness.crash(store)  # read back as well as written
    assert {v.item: v.reason for v in store.items()} == wanted
    store.compact()  # and carried through a compaction
    store = harness.crash(store)
    assert {v.item: v.reason for v in store.items()} == wanted


def test_finish_of_a_claim_not_held_is_refused(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a"])
    claim = store.claim(new_runner())
    assert claim is not None
    store.finish(claim, OK)
    with pytest.raises(StateQueueError):
        store.finish(claim, OK)


def test_exclusive_runner_registration(harness: Harness) -> None:
    store = harness.open()
    first = new_runner()
    store.register_runner(first, exclusive=True)
    other = harness.open() if harness.kind != "memory" else store
    with pytest.raises(RunnerActive):
        other.register_runner(new_runner(), exclusive=True)
    assert [r.runner_id for r in other.active_runners()] == [first.runner_id]
    store.unregister_runner(first.runner_id)
    other.register_runner(new_runner(), exclusive=True)


def test_dead_runner_is_not_active(harness: Harness) -> None:
    store = harness.open()
    store.register_runner(new_runner())
    store = harness.crash(store)
    assert store.active_runners() == []


def test_a_dead_runners_host_is_known_until_its_items_are_recovered(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a"])
    runner = new_runner()
    store.register_runner(runner)
    assert store.claim(runner) is not None
    store = harness.crash(store)
    assert store.runner_hosts({runner.runner_id, "unknown"}) == {runner.runner_id: runner.host}


def test_interrupted_lists_what_status_lists(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a", "b"])
    runner = new_runner()
    store.register_runner(runner)
    assert store.claim(runner) is not None
    assert store.interrupted() == store.status().interrupted == ()
    store = harness.crash(store)
    assert store.interrupted() == store.status().interrupted == (1,)
    store.recover()
    assert store.interrupted() == store.status().interrupted == ()


def test_compact_keeps_counts_dedupe_and_pending_order(harness: Harness) -> None:
    store = harness.open()
    store.enqueue([str(i) for i in range(10)])
    runner = new_runner()
    for _ in range(6):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, OK if claim.item != "3" else BAD)
    before = counts(store)
    store.compact()
    assert counts(store) == before
    store = harness.crash(store)
    assert counts(store) == before
    assert store.enqueue([str(i) for i in range(12)]).added == 2
    claim = store.claim(runner)
    assert claim is not None and claim.item == "6"
