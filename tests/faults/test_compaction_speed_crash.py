"""Issue 14, compaction speed: the spliced ``arch`` records and the keys index
that compaction stages, with a kill at every durable step.

A kill at any point leaves the old files or the new ones, and dedupe stays
exact whichever keys index the queue is left with (the old journal's, the
staged one, or none): an existing item is never added again, a new one once.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from statequeue.core.errors import CorruptJournal, LockTimeout
from statequeue.core.exported import ARCHIVED_KEYS
from statequeue.core.fileio import FileOps
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal import key_index
from statequeue.store.journal.fsck import fsck
from statequeue.store.journal.key_index import KEYS_NAME
from statequeue.store.journal.online_compaction import NEW_JOURNAL, NEW_KEYS
from statequeue.store.journal.store import ARCHIVE, JournalStore
from tests.faults.test_compaction_online import (
    FIRST as FIRST_ITEMS,
)
from tests.faults.test_compaction_online import (
    DuringArchive,
    build,
    check_after_kill,
    run_compactor,
)

# Texts and results whose JSON needs escapes, or holds the bytes the splice
# looks for ("seq" keys inside a result, quotes, a backslash before a quote).
TRICKY = [
    'say "hi"',
    "back\\slash\\",
    'ends with \\"',
    "ünïcødé ✓",
    "tab\there",
    '","seq":1,"item":"x',
]


def finish_all(store: JournalStore, result: object) -> None:
    runner = new_runner()
    while (claim := store.claim(runner)) is not None:
        store.finish(claim, Outcome(ok=True, result=result, stderr_tail='e","seq":9'))


def test_spliced_archive_records_read_back_as_decoded_ones(tmp_path: Path) -> None:
    """Items done at their first try are archived from their own bytes; what
    `results`, `items` and `history` say is the same before and after."""
    store = JournalStore(tmp_path / "q", create=True, auto_compact=0)
    store.enqueue(TRICKY)
    finish_all(store, {"seq": 5, "a": {"seq": [1, ',"seq":']}, "item": "no"})
    before = sorted(store.results(), key=lambda r: r.item_id)
    views = list(store.items())
    histories = [_outcome(store, i) for i in range(1, len(TRICKY) + 1)]
    ends = [r for r in store._journal_records() if r["t"] == "end"]
    # What the general path archives: the text, and the end record's result keys.
    expected = [
        {"t": "arch", "id": r["id"], "item": TRICKY[r["id"] - 1]}
        | {k: r[k] for k in ARCHIVED_KEYS if k in r}
        for r in ends
    ]
    assert store.compact().archived == len(TRICKY)
    after = sorted(store.results(), key=lambda r: r.item_id)
    assert [replace(r, archived=False) for r in after] == before
    assert all(r.archived for r in after)
    assert list(store.items()) == views
    assert [_outcome(store, i) for i in range(1, len(TRICKY) + 1)] == histories
    assert store.enqueue(TRICKY).added == 0
    store.close()
    lines = (tmp_path / "q" / ARCHIVE).read_bytes().splitlines()
    spliced = [json.loads(line) for line in lines]
    assert [{k: v for k, v in r.items() if k not in ("seq", "crc")} for r in spliced] == expected
    # The splice keeps the end record's key order: attempt right after item.
    assert all(line.startswith(b'{"t":"arch","id":') for line in lines)
    assert all(list(r)[3] == "attempt" for r in spliced)
    assert not fsck(tmp_path / "q", repair=False).damaged


def _outcome(store: JournalStore, item_id: int) -> tuple[object, ...]:
    found = store.history(item_id)
    return found.item, found.state, found.result, found.stderr_tail


def test_a_damaged_line_is_refused_not_spliced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line damaged after the checkpoint vouched for it is not copied into
    the archive: the compaction stops and names the line."""
    monkeypatch.setenv("STATEQUEUE_CHECKPOINT_EVERY", "1")
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(["a", "b", "c"])
    finish_all(store, None)
    store.close()
    journal = folder / "journal.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data.replace(b'"item":"b"', b'"item":"B"'))
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        assert store.replay.restored_from_checkpoint  # line 3 is not read on open
        with pytest.raises(CorruptJournal, match=r"line 3: bad checksum"):
            store.compact()
    finally:
        store.close()
    assert not (folder / ARCHIVE).exists() or b'"B"' not in (folder / ARCHIVE).read_bytes()


def indexed(folder: Path) -> None:
    """The 12-item queue of test_compaction_online, with a keys index."""
    build(folder)
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        texts = [view.item for view in store.items()]
        store.journal.sync()
        assert key_index.save(store.dir, store.journal, texts)
    finally:
        store.close()


def test_kill_at_every_step_with_a_keys_index(tmp_path: Path) -> None:
    """SIGKILL the compactor at each durable step, another process appending
    meanwhile, on a queue with a keys index: every check of the online
    crash-point test holds (dedupe included: it probes the index left)."""
    staged_seen = 0
    for k in range(1, 60):
        folder = tmp_path / f"k{k}" / "q"
        indexed(folder)
        out = run_compactor(folder, k)
        staged_seen += (folder / NEW_KEYS).exists()
        check_after_kill(folder)
        if out.returncode == 0:
            assert (folder / KEYS_NAME).exists()  # staged, and renamed in with the journal
            break
        assert out.returncode == -9, out.stderr
    else:
        raise AssertionError("the compactor never finished")
    assert staged_seen >= 1  # some kills came between staging and the swap


def test_a_staged_index_without_its_journal_is_never_used(tmp_path: Path) -> None:
    """The staged index names the new journal: put in place over the old
    journal (as a crash between the renames could not, but a careless copy
    might), it does not match and dedupe goes by the journal."""
    folder = tmp_path / "q"
    indexed(folder)
    store = JournalStore(folder, create=False, auto_compact=0)
    store.compact()
    store.close()
    saved = (folder / KEYS_NAME).read_bytes()
    other = tmp_path / "other"
    indexed(other)
    os.replace(other / "journal.jsonl", folder / "journal.jsonl")
    (folder / KEYS_NAME).write_bytes(saved)
    for name in ("state.ckpt", ARCHIVE):
        (folder / name).unlink()
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        assert store.enqueue(["item-1", "item-12", "new"]).added == 1
        assert store.dedupe.index is None  # the index was not of this journal
    finally:
        store.close()


def test_fsck_repair_waits_for_a_running_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction writes its archive tail and new journal holding only
    compact.lock: a repair that rewrote the files meanwhile would race it, so
    `fsck --repair` takes compact.lock first (and gives up after the lock
    timeout, changing nothing). A plain check does not wait."""
    folder = tmp_path / "q"
    build(folder)
    journal = folder / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'"item-', b'"ITEM-')  # damage in the middle
    journal.write_bytes(b"".join(lines))
    before = journal.read_bytes()
    monkeypatch.setenv("STATEQUEUE_LOCK_TIMEOUT", "0.2")
    fd = os.open(folder / "compact.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running compaction holds it
        assert fsck(folder, repair=False).damaged
        with pytest.raises(LockTimeout, match=r"compact\.lock"):
            fsck(folder, repair=True)
        assert journal.read_bytes() == before
    finally:
        os.close(fd)
    assert fsck(folder, repair=True).repaired


def test_following_events_across_a_compaction_repeats_nothing(tmp_path: Path) -> None:
    """Records appended while a compaction runs are read once by a follower
    (`events --follow`, `stats --watch`): in the old journal, and not again
    when the new journal copies them after its snapshot."""
    folder = tmp_path / "q"
    build(folder)
    follower = JournalStore(folder, create=False, auto_compact=0)
    seen, cursor = follower.read_events(None)

    def meanwhile() -> None:
        nonlocal cursor
        other = JournalStore(folder, create=False, auto_compact=0)
        try:
            other.enqueue(["during-1", "during-2"])
        finally:
            other.close()
        found, cursor = follower.read_events(cursor)
        seen.extend(found)

    store = JournalStore(folder, create=False, ops=DuringArchive(meanwhile), auto_compact=0)
    store.compact()
    store.enqueue(["after"])
    store.close()
    found, cursor = follower.read_events(cursor)
    follower.close()
    seen.extend(found)
    enqueued = [r["item"] for r in seen if r["t"] == "enq"]
    assert enqueued.count("during-1") == 1 and enqueued.count("during-2") == 1
    assert enqueued.count("after") == 1
    assert any(r["t"] == "snap" for r in found)  # it did cross the compaction


class AfterCopyAhead(FileOps):
    """Runs ``early`` at the archive's fsync (records then appended are copied
    ahead, without the queue lock) and ``late`` at the new journal's second
    fsync (the copy ahead's: what comes after is the swap's to copy)."""

    def __init__(self, early: Callable[[], None], late: Callable[[], None]) -> None:
        self.early, self.late = early, late
        self.new_syncs = 0
        self.ran_early = False

    def fsync(self, fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(ARCHIVE) and not self.ran_early:
            self.ran_early = True
            self.early()
        super().fsync(fd)
        if name.endswith(NEW_JOURNAL):
            self.new_syncs += 1
            if self.new_syncs == 2:
                self.late()


def _enqueue(folder: Path, items: list[str]) -> None:
    other = JournalStore(folder, create=False, auto_compact=0)
    try:
        assert other.enqueue(items).added == len(items)
    finally:
        other.close()


def test_records_appended_during_compaction_are_copied_ahead(tmp_path: Path) -> None:
    """Records appended while compaction writes the new journal are copied
    into it before the swap, and its staged state checkpoint covers them:
    the swap copies, and the next opener replays, only what came later."""
    folder = tmp_path / "q"
    build(folder)
    early = [f"early-{i}" for i in range(50)]
    ops = AfterCopyAhead(lambda: _enqueue(folder, early), lambda: _enqueue(folder, ["late"]))
    store = JournalStore(folder, create=False, ops=ops, auto_compact=0)
    store.compact()
    store.close()
    assert ops.new_syncs == 3  # body, copy ahead, swap
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        assert store.replay.restored_from_checkpoint
        assert store.replay.replayed_on_open == 1  # "late" only
        assert store.enqueue([*FIRST_ITEMS, *early, "late"]).added == 0
        assert dict(store.status().counts)["pending"] == 4 + 51
    finally:
        store.close()
    assert not fsck(folder, repair=False).damaged


def test_records_cut_after_the_copy_ahead_are_not_kept(tmp_path: Path) -> None:
    """A writer whose fsync failed cuts its unacknowledged records, perhaps
    after they were copied ahead: the swap finds the bytes gone and the
    compaction starts again, so the new journal never holds them."""
    folder = tmp_path / "q"
    build(folder)
    journal = folder / "journal.jsonl"
    sizes: list[int] = []

    def early() -> None:
        sizes.append(journal.stat().st_size)
        _enqueue(folder, ["doomed"])

    def cut() -> None:
        if len(sizes) == 1:
            os.truncate(journal, sizes.pop())  # as the failed writer does, under its lock

    ops = AfterCopyAhead(early, cut)
    store = JournalStore(folder, create=False, ops=ops, auto_compact=0)
    store.compact()
    store.close()
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        assert "doomed" not in {view.item for view in store.items()}
        assert store.enqueue(["doomed"]).added == 1
    finally:
        store.close()
    assert not fsck(folder, repair=False).damaged
