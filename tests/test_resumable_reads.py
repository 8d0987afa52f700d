"""A resumable call (and a ``map`` over a few items of a big queue) reads back
only the results of its own items: an index lookup each, never every result
of the queue. It read them all before, so a loop resuming over N done items
cost O(N^2) (56 ms a call at N=1,000, found by an outside tester), and the
journal store decoded its whole journal on every call. Not by timing: by what
is read."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import statequeue
from statequeue.api.queue import Queue
from statequeue.core.models import ItemState
from statequeue.store.journal import journal_file
from statequeue.store.journal.journal_reads import JournalReads
from statequeue.store.journal.store import JournalStore
from statequeue.store.memory import MemoryStore
from statequeue.store.records import record_reads
from statequeue.store.records.record_reads import RecordReads
from statequeue.store.records.record_store import RecordStore
from tests.test_result_lookup import _fill, _full_scan

DONE = 500


def _refused(self: Any, *args: Any) -> Any:
    raise AssertionError("a resumable call read every result (or every record) of the queue")


def _refuse_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, a pass over every result or record of a queue fails the test."""
    for cls in (RecordReads, RecordStore, JournalReads, JournalStore, MemoryStore):
        for name in ("_journal_records", "_archive_records", "results", "items"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, _refused)
    monkeypatch.setattr(record_reads, "iter_results", _refused)


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many journal records are decoded from now on (``records``)."""
    seen: Counter[str] = Counter()
    parse = journal_file.parse

    def counted(data: bytes, **kwargs: Any) -> Any:
        found = parse(data, **kwargs)
        seen["records"] += len(found[0])
        return found

    monkeypatch.setattr(journal_file, "parse", counted)
    return seen


def _resumable(name: str, store: str | None = None) -> tuple[Any, Counter[str]]:
    ran: Counter[str] = Counter()

    @statequeue.resumable(queue=name, store=store)
    def shout(item: str) -> dict[str, str]:
        ran[item] += 1
        return {"up": item.upper()}

    return shout, ran


def test_a_stored_resumable_call_reads_only_its_own_result(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch, decoded: Counter[str]
) -> None:
    shout, ran = _resumable("resume")
    for n in range(DONE):
        shout(f"x{n}")
    assert len(ran) == DONE
    _refuse_scans(monkeypatch)
    decoded.clear()
    for n in (0, 7, DONE // 2, DONE - 1):
        assert shout(f"x{n}") == {"up": f"X{n}"}
    assert sum(ran.values()) == DONE  # read back, not run again
    # Nothing new in the journal but this process's own records: none decoded
    # again (the call decoded every record, in 1 MB chunks, each time).
    assert decoded["records"] == 0
    assert shout("new one") == {"up": "NEW ONE"}  # a new item still runs
    assert ran["new one"] == 1


def test_a_small_map_in_a_big_queue_reads_its_items_only(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fn(item: str) -> str:
        if item == "bad":
            raise ValueError("bad")
        return item * 2

    # A Queue held open, as @resumable holds its own: a map by queue name opens
    # the store afresh each call, and a fresh store builds its dedupe keys once.
    with Queue("big") as q:
        statequeue.map(fn, [f"m{n}" for n in range(DONE)], queue=q, jobs=4)
        with pytest.raises(statequeue.MapFailed):
            statequeue.map(fn, ["bad"], queue=q)
        _refuse_scans(monkeypatch)
        items = ["m3", "fresh", "m0", "m3", f"m{DONE - 1}"]
        assert statequeue.map(fn, items, queue=q, jobs=2) == [
            "m3m3",
            "freshfresh",
            "m0m0",
            "m3m3",
            f"m{DONE - 1}" * 2,
        ]
        with pytest.raises(statequeue.MapFailed) as caught:  # failed before: runs again
            statequeue.map(fn, ["m1", "bad"], queue=q)
        assert caught.value.failures == [("bad", "ValueError: bad")]
        assert caught.value.results == ["m1m1", None]


def _check_results_of(q: Queue, texts: list[str]) -> None:
    """``results_of`` gives what ``result`` (and the full scan) gives, by
    lookups for a few ids and by one pass for many; unknown ids left out."""
    ids = q.find_ids(texts)
    expected = {ids[t]: r for t in texts if (r := _full_scan(q, t)) is not None}
    assert any(r.archived for r in expected.values())
    assert any(r.state is ItemState.FAILED for r in expected.values())
    few = q.results_of([*ids.values(), 10**6])
    assert few == expected
    every = [v.item_id for v in q.items()]
    assert q.results_of(every) == {r.item_id: r for r in q.results()}  # the pass over all
    assert q.results_of([]) == {}


def test_journal_results_of_answers_as_the_full_scan(sq_home: Path) -> None:
    with Queue("rj") as q:
        texts = _fill(q)
        _check_results_of(q, texts)
    with Queue("rj") as q:
        _check_results_of(q, texts)


def test_memory_results_of_answers_as_the_full_scan() -> None:
    with Queue("rm", store=MemoryStore("rm")) as q:
        texts = _fill(q)
        ids = q.find_ids(texts)
        expected = {ids[t]: r for t in texts if (r := _full_scan(q, t)) is not None}
        assert q.results_of(ids.values()) == expected


# -- PostgreSQL ---------------------------------------------------------------------


def test_postgres_results_of_answers_as_the_full_scan(sq_home: Path, pg_url: str) -> None:
    with Queue("rp", home=sq_home, store=pg_url) as q:
        _check_results_of(q, _fill(q))


def test_postgres_stored_resumable_call_reads_no_page_of_results(
    sq_home: Path, pg_url: str, statements: list[str]
) -> None:
    shout, ran = _resumable("resume", store=pg_url)
    for n in range(DONE):
        shout(f"x{n}")
    statements.clear()
    for n in (0, DONE - 1):
        assert shout(f"x{n}") == {"up": f"X{n}"}
    assert sum(ran.values()) == DONE
    # RESULTS_PAGE (every result, a page of ids at a time) is never sent.
    assert statements
    assert not [s for s in statements if "%(upto)s" in s]
