"""``Queue.result(item)`` is an index lookup on every store (issue 21 point 12):
it reads the item's own records or rows, never every result, and answers as the
old full scan did (done, failed, pending, cancelled, retried, archived or
carried over by compaction, unknown). Not by timing: by what it reads."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import ItemNotFound
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome, RunnerInfo
from statequeue.core.views import ItemResult
from statequeue.store.journal import archive_index
from statequeue.store.memory import MemoryStore
from statequeue.store.records.record_store import RecordStore

ARCHIVED = 400
LIVE = 300


def _settle(q: Queue, runner: RunnerInfo, text: str, *, ok: bool, result: Any = None) -> None:
    claim = q.claim(runner)
    assert claim is not None and claim.item == text
    q.finish(claim, Outcome(ok=ok, result=result, reason="" if ok else f"bad {text}"))


def _fill(q: Queue) -> list[str]:
    """Items in every situation ``result`` answers for; returns their texts."""
    runner = new_runner()
    old = [f"old{i}" for i in range(ARCHIVED)]
    q.enqueue([*old, "oldfail"])
    for i, text in enumerate(old):
        _settle(q, runner, text, ok=True, result={"i": i, "text": text})
    _settle(q, runner, "oldfail", ok=False, result="kept")
    q.compact()  # done ones archived; the failed one carried over with its result
    new = [f"new{i}" for i in range(LIVE)]
    q.enqueue(new)
    for i, text in enumerate(new):  # done in the live journal
        _settle(q, runner, text, ok=True, result=i)
    q.enqueue(["done", "failed", "retried", "twice", "ünï\tcode", "cancelled", "pending"])
    ids = q.find_ids(["retried", "twice", "cancelled"])
    q.cancel([ids["cancelled"]])
    _settle(q, runner, "done", ok=True, result="D")
    _settle(q, runner, "failed", ok=False, result=[1, 2])
    _settle(q, runner, "retried", ok=False)
    _settle(q, runner, "twice", ok=False, result="first")
    _settle(q, runner, "ünï\tcode", ok=True, result={"x": None})
    q.retry([ids["retried"], ids["twice"]])
    _settle(q, runner, "retried", ok=True, result="R2")  # done on its second attempt
    claim = q.claim(runner)
    assert claim is not None and claim.item == "twice"
    q.release(claim, "stopped")  # pending again, its old failure kept on record
    lately = ["oldfail", "done", "failed", "retried", "twice", "cancelled", "pending", "ünï\tcode"]
    return [*old[:5], old[-1], new[0], new[-1], *lately]


def _full_scan(q: Queue, text: str) -> ItemResult | None:
    """What ``Queue.result`` answered before: every result read to find one."""
    item_id = q.find(text)
    state = q.states([item_id])[item_id]
    if state not in (ItemState.DONE, ItemState.FAILED):
        return None
    return next((r for r in q.results(state) if r.item_id == item_id), None)


def _check_same(q: Queue, texts: list[str], *, archive: bool = True) -> None:
    expected = {t: _full_scan(q, t) for t in texts}
    assert expected["old0"] is not None and expected["old0"].archived is archive
    assert expected["failed"] is not None and expected["failed"].result == [1, 2]
    assert expected["pending"] is None and expected["cancelled"] is None
    for text in texts:
        assert q.result(text) == expected[text], text
        assert q.result(q.find(text)) == expected[text], text
    with pytest.raises(ItemNotFound):
        q.result("never enqueued")
    with pytest.raises(ItemNotFound):
        q.result(10**6)


def _refuse_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, reading every record (the journal's, the archive's) fails the test."""
    from statequeue.store.journal.store import JournalStore

    for cls in (RecordStore, MemoryStore, JournalStore):
        for name in ("_journal_records", "_archive_records", "results", "items"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, _refused)


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Bytes this thread reads through os.pread and os.read from now on."""
    total = 0
    me = threading.get_ident()
    pread, read = os.pread, os.read

    def counted_pread(fd: int, n: int, offset: int) -> bytes:
        nonlocal total
        data = pread(fd, n, offset)
        total += len(data) if threading.get_ident() == me else 0
        return data

    def counted_read(fd: int, n: int) -> bytes:
        nonlocal total
        data = read(fd, n)
        total += len(data) if threading.get_ident() == me else 0
        return data

    monkeypatch.setattr(os, "pread", counted_pread)
    monkeypatch.setattr(os, "read", counted_read)
    return lambda: total


def test_journal_result_answers_as_the_full_scan(sq_home: Path) -> None:
    with Queue("rj") as q:
        texts = _fill(q)
        _check_same(q, texts)
    with Queue("rj") as q:  # reopened: from the checkpoint or a replay, the same answers
        _check_same(q, texts)


def test_memory_result_answers_as_the_full_scan() -> None:
    with Queue("rm", store=MemoryStore("rm")) as q:
        _check_same(q, _fill(q), archive=False)  # it has no archive


def test_journal_result_reads_a_few_records(
    sq_home: Path, bytes_read: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Queue("rr") as q:
        texts = _fill(q)
        expected = {t: _full_scan(q, t) for t in texts}
        assert q.path is not None
    archive_bytes = (q.path / "archive.jsonl").stat().st_size
    journal_bytes = (q.path / "journal.jsonl").stat().st_size
    with Queue("rr") as q:
        q.status()  # opened (and the archive's index built) before counting
        assert q.result("old1") == expected["old1"]
        assert (q.path / archive_index.NAME).exists()  # saved for the next process
        _refuse_scans(monkeypatch)
        start = bytes_read()
        for text in texts:
            assert q.result(text) == expected[text], text
        per_lookup = (bytes_read() - start) / len(texts)
    # A lookup reads a few records (a page each), not the journal or the archive.
    assert per_lookup <= 3 * 4096 < min(archive_bytes, journal_bytes)
    last = expected[f"old{ARCHIVED - 1}"]
    assert last is not None
    with Queue("rr") as q:  # a new process: the saved index, not a scan of the archive
        q.status()
        start = bytes_read()
        assert q.result(last.item_id) == last  # by id: text -> id is the dedupe index's
        assert bytes_read() - start < archive_bytes


def test_memory_result_reads_no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore("rs")
    with Queue("rs", store=store) as q:
        runner = new_runner()
        q.enqueue(["a", "b", "c"])
        _settle(q, runner, "a", ok=True, result=1)
        _settle(q, runner, "b", ok=False, result=2)
        _refuse_scans(monkeypatch)
        assert q.result("a") is not None and q.result("a").result == 1  # type: ignore[union-attr]
        assert q.result("b") is not None and q.result("b").state is ItemState.FAILED  # type: ignore[union-attr]
        assert q.result("c") is None


def test_a_wrong_archive_index_is_never_believed(sq_home: Path) -> None:
    with Queue("rw") as q:
        texts = _fill(q)
        expected = {t: _full_scan(q, t) for t in texts}
        q.result("old2")  # builds and saves the index
        assert q.path is not None
    path = q.path / archive_index.NAME
    data = bytearray(path.read_bytes())
    # Same length, valid checksums: every offset points at the first line.
    header = len(archive_index.MAGIC) + 8 + int.from_bytes(data[8:16], "little")
    count = (len(data) - 4 - header) // 16
    data[header + 8 * count : -4] = bytes(8 * count)
    body = bytes(data[:-4])
    path.write_bytes(body + zlib.crc32(body).to_bytes(4, "little"))
    with Queue("rw") as q:
        for text in texts:
            assert q.result(text) == expected[text], text


def _refused(self: Any, *args: Any) -> Any:
    raise AssertionError("result() read every record")


# -- PostgreSQL: the same answers, from one statement of index probes ---------------


def test_postgres_result_answers_as_the_full_scan(sq_home: Path, pg_url: str) -> None:
    with Queue("rp", home=sq_home, store=pg_url) as q:
        texts = _fill(q)
        _check_same(q, texts)


def test_postgres_result_is_one_statement(
    sq_home: Path, pg_url: str, statements: list[str]
) -> None:
    with Queue("rq", home=sq_home, store=pg_url) as q:
        texts = _fill(q)
        expected = {t: _full_scan(q, t) for t in texts}
        statements.clear()
        for text in texts:
            assert q.result(text) == expected[text], text
        # find (by the sha256 key) and the result: two statements per item,
        # none of them the paged reads of every item or every result.
        assert len(statements) == 2 * len(texts)
        assert not [s for s in statements if "LIMIT %(limit)s" in s or "%(upto)s" in s]
