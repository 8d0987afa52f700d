"""Issue 11, point 21: a done item keeps its attempts count and a summary of
each attempt, before compaction, after it, and across several."""

from __future__ import annotations

from pathlib import Path

import orjson

from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.core.records import decode, encode
from statequeue.store.journal.store import ARCHIVE, JOURNAL, JournalStore


def _retried_once(store: JournalStore, text: str) -> None:
    """Enqueue ``text``; its first attempt fails (exit 3, retry due at once)."""
    store.enqueue([text])
    runner = new_runner()
    claim = store.claim(runner)
    assert claim is not None and claim.item == text
    store.finish(claim, Outcome(ok=False, exit_code=3, reason="exit code 3"), retry_at=1.0)


def _finish_next(store: JournalStore, *, ok: bool = True) -> None:
    claim = store.claim(new_runner())
    assert claim is not None
    store.finish(claim, Outcome(ok=ok, exit_code=0 if ok else 4, result={"n": claim.attempt}))


def _ends(store: JournalStore, item_id: int) -> list[tuple[int, str]]:
    """(attempt, state) of every attempt `show` lists for the item."""
    events = store.history(item_id).events
    return [(e["attempt"], e["state"]) for e in events if e.get("t") == "end"]


def _attempts_listed(store: JournalStore) -> dict[int, int]:
    return {v.item_id: v.attempts for v in store.items()}


def test_list_shows_the_attempts_of_a_done_item_before_compaction(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "q", create=True)
    try:
        _retried_once(store, "a")
        _finish_next(store)
        assert store.history(1).state is ItemState.DONE
        assert _attempts_listed(store) == {1: 2}
    finally:
        store.close()


def test_show_after_compaction_keeps_every_attempt(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "q", create=True)
    try:
        _retried_once(store, "a")
        _finish_next(store)
        before = _ends(store, 1)
        store.compact()
        assert _ends(store, 1) == before == [(1, "pending"), (2, "done")]
        assert _attempts_listed(store) == {1: 2}
        history = store.history(1)
        assert history.result == {"n": 2}
    finally:
        store.close()


def test_attempts_survive_a_compaction_while_the_item_was_live(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "q", create=True)
    try:
        _retried_once(store, "a")
        store.compact()  # carried over as a pending item with one attempt behind it
        _finish_next(store)
        store.compact()
        assert _ends(store, 1) == [(1, "pending"), (2, "done")]
        assert _attempts_listed(store) == {1: 2}
    finally:
        store.close()


def test_an_archive_written_without_attempt_summaries_still_reads(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True)
    _retried_once(store, "a")
    _finish_next(store)
    store.compact()
    store.close()
    # Strip the new fields, as an older statequeue wrote the archive.
    lines = (folder / ARCHIVE).read_bytes().splitlines()
    old = []
    for line in lines:
        rec = decode(line)
        assert rec is not None and "tries" in rec
        del rec["tries"]
        old.append(encode(rec))
    (folder / ARCHIVE).write_bytes(b"".join(old))
    header = decode((folder / JOURNAL).read_bytes().splitlines()[0])
    assert header is not None and header["t"] == "snap"
    header["archive_size"] = (folder / ARCHIVE).stat().st_size
    (folder / JOURNAL).write_bytes(encode(header))
    store = JournalStore(folder, create=False)
    try:
        assert _attempts_listed(store) == {1: 2}
        events = store.history(1).events
        assert [e["t"] for e in events] == ["arch"]
        assert orjson.loads(orjson.dumps(events[0]))["attempt"] == 2
    finally:
        store.close()


def _episodes(store: JournalStore, item_id: int) -> list[tuple[str, int]]:
    """(kind, episode) of each start/end/intr/set event `show` lists."""
    kinds = ("start", "end", "intr", "set")
    return [(e["t"], e["episode"]) for e in store.history(item_id).events if e["t"] in kinds]


def test_episodes_are_numbered_the_same_after_compaction(tmp_path: Path) -> None:
    # A crash (recovered: same episode), a failure for good, a user's retry
    # (a new episode), then done: `show` numbers them the same afterwards.
    crashed = JournalStore(tmp_path / "q", create=True)
    crashed.enqueue(["a"])
    assert crashed.claim(new_runner()) is not None
    crashed.close()  # its claim is free, no end record: as after a kill -9
    store = JournalStore(tmp_path / "q", create=False)
    try:
        assert store.recover().retried == [1]
        _finish_next(store, ok=False)
        store.retry([1])
        _finish_next(store)
        before = _episodes(store, 1)
        assert {n for kind, n in before if kind == "end"} == {1, 2}
        store.compact()
        after = _episodes(store, 1)
        assert [n for kind, n in after if kind == "end"] == [1, 2]
        assert [n for kind, n in after if kind == "intr"] == [1]
    finally:
        store.close()


def test_a_failed_attempt_with_a_retry_to_come_reads_the_same_after_compaction(
    tmp_path: Path,
) -> None:
    """`show` said "end #2 attempt 1: failed, retry due at ..." before a
    compaction and "pending" after it: the summary left out ``retry_at``.
    Found by an outside tester comparing `show` before and after `compact`."""
    from statequeue.cli.event_text import describe_event

    store = JournalStore(tmp_path / "q", create=True)
    try:
        _retried_once(store, "a")
        before = [e for e in store.history(1).events if e.get("t") == "end"]
        _finish_next(store)
        store.compact()
        after = [e for e in store.history(1).events if e.get("t") == "end"]
        assert before[0]["retry_at"] == 1.0 and after[0]["retry_at"] == 1.0
        assert "failed, retry due at" in describe_event(after[0])
    finally:
        store.close()
