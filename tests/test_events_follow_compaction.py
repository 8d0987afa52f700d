"""`events --follow` on the local store reads every record once across a
compaction.

A compaction folds the journal up to the position it notes into a snapshot
of item states, and copies only the records appended after that position.
A follower that had read up to an earlier point got the snapshot and the
copied records, never the records between its point and the compaction's
position: an outside tester's follower missed ~1% of the `end` records of
a 2,000-item run with two `compact`s, and saw stale `item` states after
each. The follower now reads those from the journal it followed (kept open
across the swap), and gets the snapshot's header alone as a mark.
"""

from __future__ import annotations

from pathlib import Path

from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.core.records import Record
from statequeue.store.journal.store import JournalStore


def _drain(store: JournalStore, cursor: object | None) -> tuple[list[Record], object]:
    got: list[Record] = []
    while True:
        found, cursor = store.read_events(cursor)
        if not found:
            return got, cursor
        got += found


def _work(store: JournalStore, n: int) -> None:
    runner = new_runner()
    for _ in range(n):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, exit_code=0))


def test_a_follower_reads_every_record_across_a_compaction(tmp_path: Path) -> None:
    writer = JournalStore(tmp_path / "q", create=True)
    follower = JournalStore(tmp_path / "q", create=False)
    try:
        writer.enqueue([f"i{n}" for n in range(30)])
        seen, cursor = _drain(follower, None)
        _work(writer, 10)  # after the follower's point, before the compaction's
        writer.compact()
        _work(writer, 10)  # after the compaction
        more, cursor = _drain(follower, cursor)
        seen += more
    finally:
        follower.close()
        writer.close()
    ends = [r["id"] for r in seen if r["t"] == "end"]
    starts = [r["id"] for r in seen if r["t"] == "start"]
    assert ends == list(range(1, 21)) and starts == list(range(1, 21))
    assert [r["t"] for r in more].count("snap") == 1
    assert not [r for r in more if r["t"] == "item"]  # no stale states


def test_a_follower_polling_between_two_compactions_reads_every_record(tmp_path: Path) -> None:
    writer = JournalStore(tmp_path / "q", create=True)
    follower = JournalStore(tmp_path / "q", create=False)
    try:
        writer.enqueue([f"i{n}" for n in range(30)])
        seen, cursor = _drain(follower, None)
        for _ in range(2):
            _work(writer, 5)
            writer.compact()
            _work(writer, 5)
            more, cursor = _drain(follower, cursor)
            seen += more
    finally:
        follower.close()
        writer.close()
    assert [r["id"] for r in seen if r["t"] == "end"] == list(range(1, 21))


def test_status_rate_and_start_rate_are_the_same_after_a_compaction(tmp_path: Path) -> None:
    """`status`'s rate counts the finishes of the last minute, from the
    records the state replays: a compaction archived them, and the rate fell
    (by a third mid-run, to none after the last item). The snapshot now
    keeps their times. Found by the same outside tester."""
    writer = JournalStore(tmp_path / "q", create=True)
    try:
        writer.enqueue([f"i{n}" for n in range(30)])
        _work(writer, 20)
        before = writer.status()
        ends, starts = list(writer.state.recent_ends), list(writer.state.recent_starts)
        writer.compact()
    finally:
        writer.close()
    reader = JournalStore(tmp_path / "q", create=False)  # replays the new journal
    try:
        after = reader.status()
        # The same times, so the same rate at any moment (it is measured to now).
        assert list(reader.state.recent_ends) == ends and len(ends) == 20
        assert list(reader.state.recent_starts) == starts and len(starts) == 20
    finally:
        reader.close()
    assert before.rate is not None and after.rate is not None
    assert before.starts is not None and after.starts is not None
    assert after.starts.count == before.starts.count == 20


def test_a_follower_whose_store_reloaded_meanwhile_reads_every_record(tmp_path: Path) -> None:
    """The store that follows may have reloaded the new journal before its
    next read: a `status` on it (`status --watch` does both), or its own
    compaction. It keeps the journal it replaced open for that read. Found
    by a review of the fix above."""
    writer = JournalStore(tmp_path / "q", create=True)
    follower = JournalStore(tmp_path / "q", create=False)
    try:
        writer.enqueue([f"i{n}" for n in range(40)])
        seen, cursor = _drain(follower, None)
        _work(writer, 10)
        writer.compact()
        follower.status()  # reloads the new journal
        _work(writer, 10)
        more, cursor = _drain(follower, cursor)
        seen += more
        # The same store writes, compacts and follows.
        _work(follower, 10)
        follower.compact()
        _work(follower, 10)
        more, cursor = _drain(follower, cursor)
        seen += more
    finally:
        follower.close()
        writer.close()
    assert [r["id"] for r in seen if r["t"] == "end"] == list(range(1, 41))
    assert not [r for r in seen if r["t"] == "item"]
