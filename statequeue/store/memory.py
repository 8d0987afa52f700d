"""An in-memory store, for tests and for trying the library without a disk.

It keeps the records it would have written, so a test can inspect them, and
``crash()`` simulates the death of every process using it: claims and runners
are dropped, exactly as the kernel drops flocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from statequeue.core.errors import DamagedState
from statequeue.core.models import RunnerInfo
from statequeue.core.records import Record, item_text
from statequeue.core.views import CompactResult, WorkerView
from statequeue.store.rate_bucket import Bucket, BucketChange
from statequeue.store.records.record_store import RecordStore
from statequeue.store.records.state import LiveItem, QueueState


class MemoryStore(RecordStore):
    """A queue that lives only as long as this object."""

    def __init__(self, name: str = "memory") -> None:
        super().__init__(name)
        self.records: list[Record] = []
        self._mutex = threading.RLock()
        self._claims: set[int] = set()
        self._runners: set[str] = set()
        self._rate: Bucket | None = None  # the shared start rate (rate_bucket.py)
        self._workers: dict[str, tuple[WorkerView, ...]] = {}

    @contextmanager
    def _locked(self) -> Iterator[QueueState]:
        with self._mutex:
            yield self.state

    def _write(self, batch: list[Record], *, sync: bool) -> None:
        for record in batch:
            loc = len(self.records)
            record["seq"] = loc + 1
            self.records.append(record)
            self.state.apply(record, loc)

    def _load_text(self, item_id: int, loc: int) -> str:
        record = self.records[loc]
        if record.get("id") != item_id:
            raise DamagedState(f"record {loc} is not about item {item_id}")
        return item_text(record)

    def _record_at(self, loc: int) -> Record:
        return self.records[loc]

    def sync(self) -> None:
        """Nothing to do: memory is as durable as it gets here."""

    def publish_workers(self, runner_id: str, workers: Sequence[WorkerView]) -> None:
        self._workers[runner_id] = tuple(workers)

    def published_workers(self, runner_id: str) -> tuple[WorkerView, ...]:
        return self._workers.get(runner_id, ())

    def _claim_free(self, item: LiveItem) -> bool:
        return item.id not in self._claims

    def _take_claim(self, item_id: int) -> tuple[int, ...] | None:
        if item_id in self._claims:
            return None
        self._claims.add(item_id)
        return ()

    def _drop_claim(self, item_id: int) -> None:
        self._claims.discard(item_id)

    def bucket_update(self, change: BucketChange, *, create: bool = True) -> Bucket | None:
        with self._mutex:
            found = change(self._rate, time.time())
            if found is not None:
                self._rate = found
            return self._rate

    def _runner_alive(self, runner_id: str) -> bool:
        return runner_id in self._runners

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        with self._mutex:
            super().register_runner(runner, exclusive=exclusive)
            self._runners.add(runner.runner_id)

    def unregister_runner(self, runner_id: str) -> None:
        with self._mutex:
            super().unregister_runner(runner_id)
            self._runners.discard(runner_id)

    def compact(self) -> CompactResult:
        """Nothing to rewrite: the state is already in memory."""
        return CompactResult(bytes_before=0, bytes_after=0, archived=0, archive_bytes=0)

    def close(self) -> None:
        """Nothing to release (claims stay held, as a live process's would)."""

    def _journal_records(self) -> list[Record]:
        return list(self.records)

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        start = cursor if isinstance(cursor, int) else 0
        with self._mutex:
            return self.records[start:], len(self.records)

    def crash(self) -> None:
        """Simulate the death of every process using this store."""
        with self._mutex:
            self._claims.clear()
            self._runners.clear()
