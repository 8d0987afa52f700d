"""The state checkpoint: a cache that opening uses only while it still
describes the journal, and that never changes what a queue shows."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from statequeue.core.errors import CorruptJournal, DamagedState
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal import cache_file, checkpoint, dedupe_keys, key_index, stats_cache
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.store import JOURNAL, JournalStore
from tests.faults.helpers import fingerprint


def _open(folder: Path, *, every: int = 1) -> JournalStore:
    store = JournalStore(folder, create=True)
    store.settings.checkpoint_every = store.settings.checkpoint_on_close = every
    return store


def _busy_queue(folder: Path) -> None:
    """A queue with items in every state, a live claim, a retry waiting and a
    checkpoint taken part-way (so opening replays a tail after it)."""
    store = _open(folder)
    store.enqueue([f"item-{i}" for i in range(40)])
    runner = new_runner()
    store.register_runner(runner)
    for n in range(12):
        claim = store.claim(runner)
        assert claim is not None
        if n % 4 == 3:
            store.finish(claim, Outcome(ok=False, reason="bad"))
        elif n == 5:
            store.finish(claim, Outcome(ok=False), retry_at=2e9)  # retry far ahead
        else:
            store.finish(claim, Outcome(ok=True, result={"n": n}))
    store.retry([4])
    store.cancel([20, 21])
    store.set_paused(True)
    store.set_paused(False)
    store.settings.checkpoint_every = store.settings.checkpoint_on_close = 10**9  # a tail to replay
    store.enqueue(["late-1", "late-2", "item-3"])
    store.claim(runner)  # left running: its runner is this process, still alive
    store.journal.sync()
    store.close()


@contextmanager
def _opened(folder: Path) -> Iterator[QueueFolder]:
    qdir = QueueFolder.open(folder, create=False)
    try:
        yield qdir
    finally:
        qdir.close()


def _fresh_replay(folder: Path, tmp_path: Path) -> tuple[object, ...]:
    """The fingerprint of a copy of ``folder`` opened without any checkpoint."""
    copy = tmp_path / "no-checkpoint"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    with _opened(copy) as qdir:
        checkpoint.discard(qdir)
    store = JournalStore(copy, create=False)
    store.settings.checkpoint_every = 0
    try:
        return fingerprint(store)
    finally:
        store.close()


def test_opening_from_a_checkpoint_equals_a_full_replay(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    _busy_queue(folder)
    assert (folder / checkpoint.NAME).exists()
    store = JournalStore(folder, create=False)
    try:
        assert store.replay.restored_from_checkpoint
        assert 0 < store.replay.replayed_on_open < store.journal.lines  # only the tail
        assert fingerprint(store) == _fresh_replay(folder, tmp_path)
        # And it goes on the same way: the next claims come in the same order.
        runner = new_runner()
        taken = [c.item for c in iter(lambda: store.claim(runner), None)]
    finally:
        store.close()
    # item-3 failed and was retried; item-12 was left running by a runner now gone.
    assert taken[:3] == ["item-3", "item-12", "item-13"]
    assert taken[-2:] == ["late-1", "late-2"]
    assert "item-5" not in taken  # its retry is due only far ahead


def _cut_journal_behind_checkpoint(folder: Path) -> None:
    # The checkpoint covers only fsynced records (it is saved after an
    # fsync), so a journal that lost records it saw lost acknowledged ones.
    with _opened(folder) as qdir:
        parsed = checkpoint._parse(qdir, checkpoint.NAME)
    assert parsed is not None
    offset = parsed[0]["journal"]["offset"]
    path = folder / JOURNAL
    data = path.read_bytes()
    cut = data.rfind(b"\n", 0, data.rfind(b"\n", 0, offset - 1)) + 1  # two records back
    path.write_bytes(data[:cut])


def test_a_journal_cut_behind_its_checkpoint_is_refused(tmp_path: Path) -> None:
    # This case used to be "ignore the checkpoint and open what is left",
    # which turned a loss of acknowledged records into a silent torn tail
    # (issue 10, point 2). It is damage now, and nothing is changed.
    folder = tmp_path / "q"
    _busy_queue(folder)
    _cut_journal_behind_checkpoint(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    with pytest.raises(DamagedState, match="acknowledged records were lost"):
        JournalStore(folder, create=False)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def _flip_a_checkpoint_byte(folder: Path) -> None:
    path = folder / checkpoint.NAME
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate_checkpoint(folder: Path) -> None:
    path = folder / checkpoint.NAME
    path.write_bytes(path.read_bytes()[:100])


def _empty_checkpoint(folder: Path) -> None:
    (folder / checkpoint.NAME).write_bytes(b"")


def _compact_elsewhere(folder: Path) -> None:
    store = JournalStore(folder, create=False)
    store.settings.checkpoint_every = 0
    store.compact()
    store.close()
    os.utime(folder / JOURNAL)


def _checkpoint_of_another_queue(folder: Path) -> None:
    other = folder.parent / "other"
    store = _open(other)
    store.enqueue([f"x{i}" for i in range(500)])
    store.close()
    shutil.copy(other / checkpoint.NAME, folder / checkpoint.NAME)


@pytest.mark.parametrize(
    "damage",
    [
        _flip_a_checkpoint_byte,
        _truncate_checkpoint,
        _empty_checkpoint,
        _compact_elsewhere,
        _checkpoint_of_another_queue,
    ],
)
def test_a_checkpoint_that_no_longer_matches_is_ignored(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    folder = tmp_path / "q"
    _busy_queue(folder)
    damage(folder)
    store = JournalStore(folder, create=False)
    store.settings.checkpoint_every = 0
    try:
        assert not store.replay.restored_from_checkpoint
        assert fingerprint(store) == _fresh_replay(folder, tmp_path)
    finally:
        store.close()


def test_a_checkpoint_follows_a_compaction(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    _busy_queue(folder)
    store = _open(folder)
    store.compact()
    store.close()
    reopened = JournalStore(folder, create=False)
    try:
        assert reopened.replay.restored_from_checkpoint
        assert fingerprint(reopened) == _fresh_replay(folder, tmp_path)
    finally:
        reopened.close()


@pytest.mark.parametrize("name", [checkpoint.NAME, key_index.KEYS_NAME, stats_cache.NAME])
def test_stale_cache_temp_files_are_removed(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "q"
    _open(folder).close()
    stale = folder / f".{name}.999999.tmp"
    stale.write_bytes(b"half a cache file")
    JournalStore(folder, create=False).close()
    assert not stale.exists()


def test_checkpoints_can_be_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "q"
    _busy_queue(folder)  # leaves a checkpoint
    monkeypatch.setenv("STATEQUEUE_CHECKPOINT_EVERY", "off")
    store = JournalStore(folder, create=False)
    assert not store.replay.restored_from_checkpoint  # not used...
    store.enqueue([str(i) for i in range(3000)])
    store.close()
    off = tmp_path / "off"
    store = JournalStore(off, create=True)
    store.enqueue([str(i) for i in range(3000)])
    store.close()
    assert not (off / checkpoint.NAME).exists()  # ...nor written


def _keys_queue(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue whose dedupe keys span the archive and the journal, with a
    keys checkpoint saved by a re-enqueue that had to build them the slow way."""
    monkeypatch.setattr(dedupe_keys, "KEYS_CACHE_AFTER", 1)
    store = _open(folder)
    store.enqueue([f"old-{i}" for i in range(30)])
    runner = new_runner()
    for _ in range(10):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True))
    store.compact()  # old-0..old-9 now live only in the archive
    store.enqueue([f"mid-{i}" for i in range(5)])
    store.close()
    store = JournalStore(folder, create=False)
    assert not store.dedupe.from_cache
    assert store.enqueue([f"old-{i}" for i in range(30)]).added == 0
    store.close()
    assert (folder / key_index.KEYS_NAME).exists()


def test_dedupe_keys_come_from_their_checkpoint_plus_the_journal_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "q"
    _keys_queue(folder, monkeypatch)
    other = JournalStore(folder, create=False)
    other.enqueue(["late"])  # after the keys checkpoint: found by the tail scan
    other.close()
    store = JournalStore(folder, create=False)
    try:
        wanted = ["old-3", "old-25", "mid-4", "late", "new-1", "new-1", "new-2"]
        result = store.enqueue(wanted)
        assert store.dedupe.from_cache
        assert (result.added, result.skipped) == (2, 5)
        assert [v.item for v in store.items()][-2:] == ["new-1", "new-2"]
    finally:
        store.close()


def test_a_keys_checkpoint_that_no_longer_matches_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "q"
    _keys_queue(folder, monkeypatch)
    store = JournalStore(folder, create=False)
    store.settings.checkpoint_every = 0  # so the compaction does not carry the keys over
    claim = store.claim(new_runner())  # an item to archive: a rewrite with nothing to
    assert claim is not None  # drop would not be put in place
    store.finish(claim, Outcome(ok=True))
    store.compact()  # a new journal file: the keys checkpoint names the old one
    store.close()
    store = JournalStore(folder, create=False)
    try:
        result = store.enqueue(["old-1", "old-29", "mid-0", "brand-new"])
        assert not store.dedupe.from_cache
        assert (result.added, result.skipped) == (1, 3)
    finally:
        store.close()


def test_a_damaged_record_after_the_keys_checkpoint_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "q"
    _keys_queue(folder, monkeypatch)
    other = _open(folder)  # a state checkpoint after the enqueue (enough new records)
    other.enqueue([f"late-{i}" for i in range(1, 13)])
    other.close()
    path = folder / JOURNAL
    data = bytearray(path.read_bytes())
    at = data.find(b"late-1")
    data[at] ^= 0x01  # bit rot in a record before the state checkpoint...
    path.write_bytes(bytes(data))
    store = JournalStore(folder, create=False)
    try:
        assert store.replay.restored_from_checkpoint  # ...so opening does not read it...
        with pytest.raises(CorruptJournal):  # ...but dedupe does, and says so
            store.enqueue(["late-1"])
    finally:
        store.close()


def test_filling_a_new_queue_leaves_a_keys_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dedupe_keys, "KEYS_CACHE_AFTER", 5)
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True)
    store.enqueue(["a", "b", "a"])  # too few to be worth a file
    store.enqueue([f"x{i}" for i in range(10)])  # not a new queue any more
    store.close()
    assert not (folder / key_index.KEYS_NAME).exists()
    fresh = tmp_path / "fresh"
    store = JournalStore(fresh, create=True)
    store.enqueue([f"f{i}" for i in range(12)] + ["f3"])
    store.close()
    assert (fresh / key_index.KEYS_NAME).exists()
    store = JournalStore(fresh, create=False)
    try:
        result = store.enqueue(["f0", "f11", "f12"])
        assert store.dedupe.from_cache  # the first re-enqueue reads no journal
        assert (result.added, result.skipped) == (1, 2)
    finally:
        store.close()


def test_records_that_do_not_follow_on_from_a_checkpoint_mean_a_full_replay(
    tmp_path: Path,
) -> None:
    # A checkpoint that passes the journal checks but disagrees with what
    # follows (here: its last seq is off by one) must never make opening
    # refuse the queue or cut acknowledged records as a "torn tail".
    folder = tmp_path / "q"
    _busy_queue(folder)
    with _opened(folder) as qdir:
        parsed = checkpoint._parse(qdir, checkpoint.NAME)
        assert parsed is not None
        header, codes, locs = parsed
        header["journal"]["last_seq"] -= 1
        cache_file.write_framed(qdir, checkpoint.NAME, checkpoint.MAGIC, header, (codes, locs))
    before = (folder / JOURNAL).read_bytes()
    store = JournalStore(folder, create=False)
    try:
        assert not store.replay.restored_from_checkpoint
        assert store.notices() == []  # nothing was cut
        assert fingerprint(store) == _fresh_replay(folder, tmp_path)
    finally:
        store.close()
    assert (folder / JOURNAL).read_bytes()[: len(before)] == before


def test_the_keys_checkpoint_survives_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "q"
    _keys_queue(folder, monkeypatch)
    store = JournalStore(folder, create=False)
    store.enqueue(["after-cache"])  # a record after the keys checkpoint
    runner = new_runner()
    for _ in range(5):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True))
    store.compact()  # old-10..old-14 move to the archive
    store.close()
    store = JournalStore(folder, create=False)
    try:
        result = store.enqueue(["old-0", "old-12", "mid-1", "after-cache", "newer"])
        assert store.dedupe.from_cache  # neither the archive nor the journal was read
        assert (result.added, result.skipped) == (1, 4)
    finally:
        store.close()
