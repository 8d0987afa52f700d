"""Failing writes, fsyncs and renames at every operation index.

The operation must stop with DurabilityError (exit 6 from the CLI), nothing
unacknowledged may appear acknowledged, the journal must stay recoverable,
and a failed fsync is never retried.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from statequeue.core.errors import DurabilityError
from statequeue.core.fileio import FileOps
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal.store import JournalStore

FAULT_CASES = {"count": 0}


class Injected(OSError):
    pass


class FaultyOps(FileOps):
    """Fails the ``fail_at``-th operation of ``kind`` (1-based) with ``err``;
    ``short`` makes a write put down only part of its bytes first."""

    def __init__(self, kind: str, fail_at: int, err: int = errno.EIO, short: bool = False) -> None:
        self.kind = kind
        self.fail_at = fail_at
        self.err = err
        self.short = short
        self.counts: dict[str, int] = {}
        self.after_failure: list[str] = []
        self.failed = False

    def _tick(self, kind: str) -> bool:
        if self.failed:
            self.after_failure.append(kind)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        hit = kind == self.kind and self.counts[kind] == self.fail_at
        if hit:
            self.failed = True
        return hit

    def write_all(self, fd: int, data: bytes) -> None:
        if self._tick("write"):
            if self.short and len(data) > 1:
                os.write(fd, data[: len(data) // 2])
            raise Injected(self.err, os.strerror(self.err))
        super().write_all(fd, data)

    def fsync(self, fd: int) -> None:
        if self._tick("fsync"):
            raise Injected(self.err, os.strerror(self.err))
        super().fsync(fd)

    def replace(self, src: str, dst: str) -> None:
        if self._tick("rename"):
            raise Injected(self.err, os.strerror(self.err))
        super().replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        if self._tick("dirfsync"):
            raise Injected(self.err, os.strerror(self.err))
        super().fsync_dir(path)


def workload(store: JournalStore, acked: list[str]) -> None:
    """Enqueue, run and compact, noting what was acknowledged."""
    for batch in (["a", "b", "c"], ["d", "e"]):
        store.enqueue(batch)
        acked.extend(f"enq:{x}" for x in batch)
    runner = new_runner()
    store.register_runner(runner)
    for _ in range(3):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result=claim.item))
        acked.append(f"done:{claim.item}")
    store.compact()
    acked.append("compact")
    store.enqueue(["f"])
    acked.append("enq:f")


def observed(folder: Path) -> set[str]:
    store = JournalStore(folder, create=False)
    try:
        seen = {f"enq:{r.item}" for r in store.items()}
        seen |= {f"done:{r.item}" for r in store.results()}
        return seen
    finally:
        store.close()


@pytest.mark.parametrize(
    ("kind", "err", "short"),
    [
        ("write", errno.EIO, False),
        ("write", errno.ENOSPC, True),
        ("fsync", errno.EIO, False),
        ("fsync", errno.ENOSPC, False),
        ("rename", errno.EIO, False),
        ("dirfsync", errno.EIO, False),
    ],
)
def test_fault_at_every_operation_index(tmp_path: Path, kind: str, err: int, short: bool) -> None:
    dry = FaultyOps("none", 0)
    workload(JournalStore(tmp_path / "dry", create=True, ops=dry), [])
    total = dry.counts.get(kind, 0)
    assert total > 0
    for k in range(1, total + 1):
        folder = tmp_path / f"{kind}{k}"
        ops = FaultyOps(kind, k, err=err, short=short)
        acked: list[str] = []
        store = None
        with pytest.raises(DurabilityError) as info:
            store = JournalStore(folder, create=True, ops=ops)
            workload(store, acked)
        if store is not None:
            # The store refuses further work instead of retrying.
            with pytest.raises(DurabilityError):
                store.enqueue(["late"])
            store.close()
        assert "failed" in str(info.value)
        if kind == "fsync":
            assert "fsync" not in ops.after_failure, "a failed fsync was retried"
        FAULT_CASES["count"] += 1
        if not (folder / "journal.jsonl").exists():
            assert not acked  # the queue was never created, nothing acknowledged
            continue
        seen = observed(folder)
        missing = {a for a in acked if a != "compact"} - seen
        assert not missing, (kind, k, missing)
