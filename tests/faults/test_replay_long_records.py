"""Replay of records longer than its read chunk (journal._REPLAY_CHUNK, 1 MB
since issue 15's memory goal; a result may be up to 1 MB, so its record can be
longer): a whole one is read alone, not with everything after it, and a torn
one -- the write of a long record cut by a crash -- is cut like any torn
tail. With a 4 KB chunk here, so the records stay small."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal import journal_file as journal
from statequeue.store.journal.store import JOURNAL, JournalStore
from tests.faults.test_compaction_online import ROOT

CHUNK = 4096
BIG = "x" * (3 * CHUNK)  # a result whose record spans several chunks


def _build(folder: Path) -> list[int]:
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue([f"item-{i}" for i in range(6)])
    runner = new_runner()
    for i in range(6):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result=BIG if i % 2 == 0 else i))
    store.close()
    data = (folder / JOURNAL).read_bytes()
    return [0, *[i + 1 for i, b in enumerate(data) if b == ord("\n")][:-1]]


def test_records_longer_than_the_chunk_replay_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal, "_REPLAY_CHUNK", CHUNK)
    folder = tmp_path / "q"
    _build(folder)
    reads: list[int] = []
    real = journal.read_line

    def read_line(fd: int, offset: int) -> bytes:
        line = real(fd, offset)
        reads.append(len(line))
        return line

    monkeypatch.setattr(journal, "read_line", read_line)
    store = JournalStore(folder, create=False)
    try:
        assert store.status().counts["done"] == 6
        assert store.replay.replayed_on_open > 0 and not store.notices()
    finally:
        store.close()
    assert reads and max(reads) < 4 * CHUNK  # each long record alone, never the rest


def _open_in_child(folder: Path) -> subprocess.CompletedProcess[str]:
    """Open the queue in a child process (the old loop never ended on a torn
    record longer than a chunk), with the small chunk."""
    code = (
        "import sys; from pathlib import Path;"
        "from statequeue.store.journal import journal_file as journal;"
        f"journal._REPLAY_CHUNK = {CHUNK};"
        "from statequeue.store.journal.store import JournalStore;"
        "s = JournalStore(Path(sys.argv[1]), create=False);"
        "print(s.status().counts['done'], *s.notices(), sep='|'); s.close()"
    )
    env = {**os.environ, "STATEQUEUE_CHECKPOINT_EVERY": "0"}
    return subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_a_torn_record_longer_than_the_chunk_is_cut(tmp_path: Path, keep: float) -> None:
    folder = tmp_path / "q"
    starts = _build(folder)
    path = folder / JOURNAL
    data = path.read_bytes()
    long_starts = [
        s for s, e in zip(starts, [*starts[1:], len(data)], strict=False) if e - s > CHUNK
    ]
    cut_from = long_starts[-1]
    end = next(s for s in starts if s > cut_from)
    torn = data[: cut_from + int((end - cut_from) * keep)]  # a crash inside its write
    assert len(torn) - cut_from > CHUNK * keep
    path.write_bytes(torn)
    done = _open_in_child(folder)
    assert done.returncode == 0, done.stderr
    counts, *notices = done.stdout.strip().split("|")
    assert any("torn tail" in n for n in notices), done.stdout
    assert path.read_bytes() == data[:cut_from]  # cut back to the last whole record
    assert int(counts) == 4  # the item whose end was torn is not done
