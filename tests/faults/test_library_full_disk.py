"""A library loop stopped by a full disk gives its items back, as `run` does.

`run` keeps a space reserve in the queue folder and frees it to write the
records that give its items in flight back (test_full_disk_give_back.py).
The library's loops (``Queue.work()``, ``statequeue.map``) did not: a
``done()`` that found the disk full ended the loop with the item still
recorded as running, and the next run recovered it as "its runner died",
counting a crash (three such stops hold an innocent item as poison).

The full disk here is a fault layer over the journal's writes in this
process: once ``full`` is set, every write fails with ENOSPC until the
queue's ``reserve`` is removed (if it had one then), as on a disk whose only
free space is the reserve. A failed fsync must write nothing more
(DESIGN.md): its items are left to recovery, as before.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import statequeue
from statequeue import Queue
from statequeue.core import fileio
from statequeue.core.errors import DiskFull


class FullDisk:
    """ENOSPC for the journal's writes (or fsyncs) from ``fill()`` on, until
    the reserve the queue had then is removed; ``written`` counts the
    writes attempted after the first failure."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path, fail: str) -> None:
        self.reserve = folder / "reserve"
        self.full = False
        self.reserved: bool | None = None
        self.failed = 0
        self.written = 0
        plain_write, plain_fsync = fileio.DEFAULT_OPS.write_all, fileio.DEFAULT_OPS.fsync

        def write_all(fd: int, data: bytes) -> Any:
            if self.failed:
                self.written += 1
            if fail == "write" and self._refused():
                self._refuse()
            return plain_write(fd, data)

        def fsync(fd: int) -> Any:
            if fail == "fsync" and self._refused():
                self._refuse()
            return plain_fsync(fd)

        monkeypatch.setattr(fileio.DEFAULT_OPS, "write_all", write_all)
        monkeypatch.setattr(fileio.DEFAULT_OPS, "fsync", fsync)

    def fill(self) -> None:
        self.full = True
        self.reserved = self.reserve.exists()

    def empty(self) -> None:
        self.full = False

    def _refused(self) -> bool:
        return self.full and not (self.reserved and not self.reserve.exists())

    def _refuse(self) -> None:
        self.failed += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_work_loop_stopped_by_a_full_disk_gives_its_item_back_uncounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    q = Queue("q", home=home)
    q.enqueue(["a", "b", "c"])
    disk = FullDisk(monkeypatch, home / "q", "write")
    with pytest.raises(DiskFull):
        for item in q.work():
            if item.item == "b":
                assert (home / "q" / "reserve").exists()  # kept as the loop began
                disk.fill()
            item.done()
    q.close()
    assert disk.failed >= 1
    disk.empty()
    with Queue("q", home=home) as again:
        status = again.status()
        assert status.counts["running"] == 0 and not status.interrupted, status
        b = next(v for v in again.items() if v.item == "b")
        assert b.state.value == "pending" and "disk was full" in b.reason, b
        assert [i.item for i in again.work() if i.done() or True] == ["b", "c"]
        assert again.status().counts["done"] == 3


def test_a_map_stopped_by_a_full_disk_gives_every_item_in_flight_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    with Queue("q", home=home):
        pass
    disk = FullDisk(monkeypatch, home / "q", "write")
    together = threading.Barrier(4, timeout=30)

    def work(item: str) -> str:
        together.wait()  # all four in flight at once
        if item == "a":
            disk.fill()
        return item

    with pytest.raises(DiskFull):
        statequeue.map(work, ["a", "b", "c", "d"], queue="q", home=home, jobs=4)
    disk.empty()
    with Queue("q", home=home) as q:
        status = q.status()
        assert status.counts["running"] == 0 and not status.interrupted, status
        assert status.counts["pending"] + status.counts["done"] == 4, status
        # a's result (at least) found the disk full; each in flight went back
        assert status.counts["pending"] >= 1, status
    again = statequeue.map(str.upper, ["a", "b", "c", "d"], queue="q", home=home)
    assert [r.lower() for r in again] == list("abcd")  # the one done before keeps its result


def test_after_a_failed_fsync_the_loop_writes_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    q = Queue("q", home=home)
    q.enqueue(["a", "b"])
    disk = FullDisk(monkeypatch, home / "q", "fsync")
    with pytest.raises(DiskFull):
        for item in q.work():
            disk.fill()
            item.done()
    q.close()
    assert disk.failed == 1 and disk.written == 0  # never retried, nothing after it
    disk.empty()
    with Queue("q", home=home) as again:  # left to recovery, as before
        assert again.status().counts["done"] + again.status().counts["running"] >= 1


def test_async_loops_stopped_by_a_full_disk_give_their_items_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    with Queue("w", home=home) as q:
        q.enqueue(["a", "b", "c"])
    disk = FullDisk(monkeypatch, home / "w", "write")

    async def work_all() -> None:
        with Queue("w", home=home) as queue:
            async with asyncio.TaskGroup() as tasks:
                async for item in queue.work_async(concurrency=3):
                    tasks.create_task(handle(item))

    async def handle(item: statequeue.AsyncWorkItem) -> None:
        if item.item == "b":
            disk.fill()
        await item.done()

    with pytest.raises(BaseException) as raised:
        asyncio.run(work_all())
    assert (
        raised.group_contains(DiskFull)
        if isinstance(raised.value, BaseExceptionGroup)
        else (raised.type is DiskFull)
    ), raised.value
    disk.empty()
    with Queue("w", home=home) as q:
        status = q.status()
        assert status.counts["running"] == 0 and not status.interrupted, status

    with Queue("m", home=home):
        pass
    disk = FullDisk(monkeypatch, home / "m", "write")

    async def answer(item: str) -> str:
        await asyncio.sleep(0.01)
        if item == "a":
            disk.fill()
        return item

    with pytest.raises(BaseException) as raised:
        asyncio.run(statequeue.map_async(answer, ["a", "b", "c"], queue="m", home=home))
    disk.empty()
    with Queue("m", home=home) as q:
        status = q.status()
        assert status.counts["running"] == 0 and not status.interrupted, status
