"""A compacting process for tests/faults/test_compaction_online.py.

``python -m tests.faults.online_compactor FOLDER K`` compacts the queue in
FOLDER and SIGKILLs itself at its K-th durable operation (write, fsync,
truncate, rename or folder fsync; 0: never). While it compacts (at its first
fsync of the archive, when it holds no queue lock), another store in this
process enqueues two items and finishes two, as a runner and a cron job
would; what they acknowledged is appended to FOLDER/../acked, one line each.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from statequeue.core.fileio import FileOps
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal.store import JournalStore

LATE = ("late-1", "late-2")


class KillAt(FileOps):
    """Counts the compacting store's durable operations; kills at the k-th."""

    def __init__(self, k: int, folder: Path) -> None:
        self.k = k
        self.count = 0
        self.folder = folder
        self.concurrent_done = False

    def _hit(self) -> None:
        self.count += 1
        if self.count == self.k:
            os.kill(os.getpid(), signal.SIGKILL)

    def write_all(self, fd: int, data: bytes) -> None:
        self._hit()
        super().write_all(fd, data)

    def fsync(self, fd: int) -> None:
        self._hit()
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not self.concurrent_done and name.endswith("archive.jsonl"):
            self.concurrent_done = True
            concurrent(self.folder)
        super().fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        self._hit()
        super().truncate(fd, size)

    def replace(self, src: str, dst: str) -> None:
        self._hit()
        super().replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        self._hit()
        super().fsync_dir(path)


def concurrent(folder: Path) -> None:
    """Another process's work while the compaction runs (its own store and
    locks), each step noted once acknowledged."""
    acked = folder.parent / "acked"
    other = JournalStore(folder, create=False, auto_compact=0)
    try:
        other.enqueue(list(LATE))
        _note(acked, "enqueued")
        runner = new_runner()
        for _ in range(2):
            claim = other.claim(runner)
            assert claim is not None
            other.finish(claim, Outcome(ok=True, result={"late": claim.item_id}))
            _note(acked, f"done {claim.item_id}")
    finally:
        other.close()


def _note(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(argv: list[str]) -> int:
    folder, k = Path(argv[1]), int(argv[2])
    ops = KillAt(k, folder)
    store = JournalStore(folder, create=False, ops=ops, auto_compact=0)
    try:
        store.compact()
    finally:
        store.close()
    print(ops.count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
