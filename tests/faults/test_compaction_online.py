"""Issue 14: compaction that never stops the world, and its crash points.

Compaction holds the queue lock only to note the journal's position and to
swap the files; meanwhile other processes enqueue, claim and finish. A kill
at any of its durable operations, with another process appending while it
runs, leaves the old files or the new ones: fsck passes, every acknowledged
record is there, no id is reused.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statequeue.core.fileio import FileOps
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.store.journal.fsck import fsck
from statequeue.store.journal.store import ARCHIVE, JOURNAL, JournalStore
from tests.faults.online_compactor import LATE

ROOT = Path(__file__).resolve().parents[2]
FIRST = [f"item-{i}" for i in range(1, 13)]  # ids 1..12


def build(folder: Path, *, done: int = 8) -> None:
    """12 items: ``done`` finished (one after a failed attempt), the rest pending."""
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(FIRST)
    runner = new_runner()
    claim = store.claim(runner)
    assert claim is not None
    store.finish(claim, Outcome(ok=False, exit_code=1), retry_at=0.0)
    for _ in range(done):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result={"n": claim.item_id}))
    store.close()


def texts_by_id(store: JournalStore) -> dict[int, str]:
    return {view.item_id: view.item for view in store.items()}


class DuringArchive(FileOps):
    """Runs ``action`` at the archive's fsync: the slow part of compaction."""

    def __init__(self, action: object) -> None:
        self.action = action
        self.ran = False
        self.archive_syncs = 0

    def fsync(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(ARCHIVE):
            self.archive_syncs += 1
            if not self.ran:
                self.ran = True
                self.action()  # type: ignore[operator]
        super().fsync(fd)


def test_others_write_while_compaction_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enqueue, claim and finish by another store succeed while the journal is
    being compacted (no wait for the queue lock), and none of it is lost."""
    folder = tmp_path / "q"
    build(folder)
    monkeypatch.setenv("STATEQUEUE_LOCK_TIMEOUT", "0.5")  # the old code held it throughout
    seen: dict[str, object] = {}

    def meanwhile() -> None:
        other = JournalStore(folder, create=False, auto_compact=0)
        try:
            assert other.enqueue(list(LATE)).added == 2
            claim = other.claim(new_runner())
            assert claim is not None
            other.finish(claim, Outcome(ok=True, result={"late": 1}))
            seen["finished"] = claim.item_id
            seen["counts"] = dict(other.status().counts)
        finally:
            other.close()

    ops = DuringArchive(meanwhile)
    store = JournalStore(folder, create=False, ops=ops, auto_compact=0)
    before = texts_by_id(store)
    result = store.compact()
    assert ops.ran
    assert result.archived == 8
    counts = dict(store.status().counts)
    assert counts == {**seen["counts"]}  # type: ignore[dict-item]
    assert counts["done"] == 9 and counts["pending"] == 5
    after = texts_by_id(store)
    assert {i: t for i, t in after.items() if i in before} == before  # no id reused
    assert after[13] == LATE[0] and after[14] == LATE[1]
    assert store.enqueue([*FIRST, *LATE]).added == 0  # dedupe across the archive
    store.close()
    assert not fsck(folder, repair=False).damaged
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]


def take_lock(fd: int) -> None:
    """flock ``fd``; AssertionError if it stays held (by compaction) for 5 s."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            assert time.monotonic() < deadline, "the queue lock stayed held"
            time.sleep(0.01)


def test_compaction_starts_again_when_the_journal_is_replaced(tmp_path: Path) -> None:
    """A repair that rewrites the journal (a new file) while compaction runs
    wins: the compaction notices at the swap, starts again from the new
    journal, and nothing is lost."""
    folder = tmp_path / "q"
    build(folder)

    def rewrite() -> None:
        fd = os.open(folder / "lock", os.O_RDWR)
        try:
            take_lock(fd)  # as fsck --repair does
            copy = folder / ".copy"
            copy.write_bytes((folder / JOURNAL).read_bytes())
            os.replace(copy, folder / JOURNAL)
        finally:
            os.close(fd)

    ops = DuringArchive(rewrite)
    store = JournalStore(folder, create=False, ops=ops, auto_compact=0)
    before = texts_by_id(store)
    result = store.compact()
    # The first attempt's append; the second cuts that back and appends again.
    assert ops.ran and ops.archive_syncs == 3
    assert result.archived == 8
    assert texts_by_id(store) == before
    assert dict(store.status().counts)["done"] == 8
    store.close()
    assert not fsck(folder, repair=False).damaged


def run_compactor(folder: Path, k: int) -> subprocess.CompletedProcess[str]:
    # A compaction that held the queue lock throughout would make the other
    # process give up waiting for it (exit 1, not the kill).
    env = dict(os.environ, PYTHONPATH=str(ROOT), STATEQUEUE_LOCK_TIMEOUT="2")
    return subprocess.run(
        [sys.executable, "-m", "tests.faults.online_compactor", str(folder), str(k)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def check_after_kill(folder: Path) -> None:
    """Old files or new, never a mix: fsck passes; every acknowledged
    enqueue and result is there; ids keep their items; all can finish."""
    noted = folder.parent / "acked"
    acked = noted.read_text().splitlines() if noted.exists() else []
    assert not fsck(folder, repair=False).damaged
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        ids = texts_by_id(store)
        assert [ids[i] for i in range(1, 13)] == FIRST
        done_ids = {v.item_id for v in store.items(ItemState.DONE)}
        for line in acked:
            if line == "enqueued":
                assert ids[13] == LATE[0] and ids[14] == LATE[1]
            elif line.startswith("done "):
                assert int(line.split()[1]) in done_ids
        assert store.enqueue([*FIRST, *LATE]).added == 2 - 2 * ("enqueued" in acked)
        store.compact()  # a later compaction cleans up after the killed one
        assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]
        runner = new_runner()
        while (claim := store.claim(runner)) is not None:
            store.finish(claim, Outcome(ok=True))
        assert dict(store.status().counts)["done"] == 14
        assert sorted(v.item_id for v in store.items()) == list(range(1, 15))
    finally:
        store.close()
    assert not fsck(folder, repair=False).damaged


def test_kill_at_every_step_with_concurrent_appends(tmp_path: Path) -> None:
    """SIGKILL the compactor at each durable operation in turn (the archive
    cut and append, its fsync, the new journal's writes and fsyncs, the
    rename, the folder fsync), another process appending while it runs."""
    for k in range(1, 60):
        folder = tmp_path / f"k{k}" / "q"
        build(folder)
        out = run_compactor(folder, k)
        check_after_kill(folder)
        if out.returncode == 0:
            break
        assert out.returncode == -9, out.stderr
    else:
        raise AssertionError("the compactor never finished")
    assert k >= 8  # every step was reached and killed once


def test_auto_compaction_runs_beside_the_runner(tmp_path: Path) -> None:
    """Dead records piling up start a compaction in a child process while the
    runner goes on recording results; closing waits for it; nothing is lost."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=30)
    texts = [f"a{i}" for i in range(1, 121)]
    store.enqueue(texts)
    runner = new_runner()
    while (claim := store.claim(runner)) is not None:
        store.finish(claim, Outcome(ok=True, result={"n": claim.item_id}))
    started = store._background.started if store._background is not None else 0
    store.close()
    assert started >= 1
    store = JournalStore(folder, create=False, auto_compact=0)
    try:
        assert dict(store.status().counts)["done"] == 120
        assert store.state.archived > 0  # a compaction took effect
        assert texts_by_id(store) == dict(enumerate(texts, start=1))
        assert len(list(store.results())) == 120
    finally:
        store.close()
    assert not fsck(folder, repair=False).damaged
