"""The local store: an append-only journal in one folder per queue.

Layout of a queue folder (0700; files 0600)::

    journal.jsonl   live records: a snapshot header, then events since
    archive.jsonl   results of finished items moved out by compaction
    lock            flock'd for every read-modify-write; never renamed
    claims.lock     claims: byte ID is write-locked (an OFD lock) while item ID
                    is claimed; never renamed or deleted
    claims/ID.lock  claims of platforms without OFD locks (and of older versions)
    runners/ID.lock held by a live runner for its whole life
    logs/           per-item output
    reserve         64 KiB a run keeps, freed to give its items back on a
                    full disk (space_reserve.py)

Liveness is told by locks, not by pid: the kernel drops a lock when the last
process holding it dies, so a claim is free exactly when the runner, the run's
keeper and every child that inherited the claim are gone (promises 3 and 4).
All claims live in one file, not one file per item, so that deleting files
under ``claims/`` (a natural "clear stale locks" reflex) cannot free a claim
that a live process holds.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Collection, Container, Iterator, Sequence
from contextlib import contextmanager, suppress
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import (
    DamagedState,
    DiskFull,
    DurabilityError,
    NoAccess,
    QueueNotFound,
    StateQueueError,
)
from statequeue.core.fileio import DEFAULT_OPS, FileOps
from statequeue.core.models import EnqueueResult, RunnerInfo
from statequeue.core.records import Record, decode, encode_enqueued, item_text
from statequeue.store.journal.claims import ClaimLocks
from statequeue.store.journal.compaction_files import remove_stale_temp_files
from statequeue.store.journal.dedupe_keys import FEW_ITEMS, DedupeKeys
from statequeue.store.journal.folder import SUBFOLDERS, QueueFolder
from statequeue.store.journal.integrity import ARCHIVE as ARCHIVE  # the names live with the checks
from statequeue.store.journal.integrity import JOURNAL as JOURNAL
from statequeue.store.journal.integrity import refuse_if_not_new
from statequeue.store.journal.journal_file import (
    GROWN,
    REPLACED,
    JournalFile,
    create_file,
    read_line,
)
from statequeue.store.journal.journal_reads import JournalReads
from statequeue.store.journal.locks import wait_for_lock
from statequeue.store.journal.rate_file import RateFile
from statequeue.store.journal.replay import Replay
from statequeue.store.journal.settings import JournalSettings, compaction_due
from statequeue.store.journal.stats_summary import StatsSummary
from statequeue.store.rate_bucket import Bucket, BucketChange
from statequeue.store.records.state import LiveItem, QueueState

# What only reading, stats, logs and compaction need is imported where used
# (each ``# lazy: start-up time``): a plain `enqueue` loads none of it.
if TYPE_CHECKING:
    from statequeue.core.views import CompactResult, ItemResult, WorkerView
    from statequeue.store.journal.archive_index import ArchiveIndex
    from statequeue.store.journal.background_compaction import BackgroundCompaction
    from statequeue.store.journal.online_compaction import CompactionSite

LOCK = "lock"


class JournalStore(JournalReads):
    """A queue kept in ``folder`` as a checksummed JSON-lines journal.

    It keeps the queue lock and the ``Store`` contract; its other jobs are
    objects it holds: ``settings``, ``replay`` (the state kept in step with
    the journal, and its checkpoints), ``dedupe`` (the keys that make enqueue
    add only new items), ``summary`` (attempts and the `stats` summary read
    from the files) and ``claims`` (the locks of its claims and runners)."""

    folder: Path  # always set: the folder holds the queue

    def __init__(
        self,
        folder: Path,
        *,
        create: bool,
        ops: FileOps = DEFAULT_OPS,
        auto_compact: int | None = None,
    ) -> None:
        super().__init__(folder.name)
        self.folder = folder
        self.ops = ops
        # Read first: a bad STATEQUEUE_* value is refused before the folder is made.
        self.settings = JournalSettings.from_environment(auto_compact=auto_compact)
        self.dir = QueueFolder.open(folder, create=create, ops=ops)
        self.read_only = False  # the user may read the queue but not write it
        self.journal = JournalFile(self.dir, JOURNAL, ops=ops)
        self.claims = ClaimLocks(self.dir)
        self.rate = RateFile(self.dir)  # the shared start rate (run --rate)
        self._archive_index: ArchiveIndex | None = None  # where archived results are
        self._broken: DurabilityError | None = None
        self._reserve_freed = False  # space_reserve_freed removed the reserve
        self.dedupe = DedupeKeys(self.dir, self.journal, self.state, self.settings)
        self.summary = StatsSummary(self.dir, self.journal, self.settings, self._locked)
        self.replay = Replay(
            self.dir,
            self.journal,
            self.state,
            self.settings,
            summary=self.summary,
            notify=self._notify,
        )
        self._lock_fd = -1
        self._lock_path = folder / LOCK  # for the message only: built once, not per lock
        self._background: BackgroundCompaction | None = None  # made when first due
        try:
            if not self.dir.exists(JOURNAL):
                refuse_if_not_new(self.dir)
                if not create:
                    raise QueueNotFound(f"no queue named {folder.name!r} in {folder.parent}")
            self._prepare(create)
        except BaseException:
            self._close_files()
            raise

    # -- opening ---------------------------------------------------------------

    def _prepare(self, create: bool) -> None:
        self._lock_fd = self._open_lock(create)
        if not self.read_only:
            for sub in SUBFOLDERS:
                self.dir.subfolder(sub, create=True)
        with self._flock():
            if not self.dir.exists(JOURNAL):
                # A new queue (or one whose creation died before its journal
                # was renamed into place), unless something says otherwise.
                refuse_if_not_new(self.dir)
                create_file(self.dir, JOURNAL, [_header(seq=1)], ops=self.ops)
            try:
                self._reload()
            except NoAccess as exc:
                if self.read_only:
                    raise
                # The journal itself may not be written (its mode, not the
                # folder's): read it as a read-only queue is read.
                self.read_only = True
                self.journal.writable, self.journal.denied = False, exc.why
                self._reload()
            # Only now that the journal opened: a damaged queue is left as found.
            if not self.read_only:
                remove_stale_temp_files(self.dir)

    def _open_lock(self, create: bool) -> int:
        """The lock file, open for writing; if the user may not write the queue
        (and is not creating it), open read-only and make this store read-only:
        it reads as usual, and a write is refused with NoAccess naming the file."""
        try:
            return self.dir.open_file(LOCK, os.O_RDWR | os.O_CREAT)
        except NoAccess as exc:
            # Creating a queue that exists opens it (the library's default,
            # `Queue(name)`): read-only there too, as `statequeue status`
            # reads it, where it refused even a look (an outside tester's
            # read-only mount).
            if create and not self.dir.exists(JOURNAL):
                raise
            self.journal.denied = exc.why
        self.read_only = True
        self.journal.writable = False
        try:
            return self.dir.open_file(LOCK, os.O_RDONLY)  # flock needs no write access
        except FileNotFoundError:
            return -1  # nothing to lock against: no writer could create it either

    @contextmanager
    def _flock(self) -> Iterator[None]:
        if self._lock_fd < 0:  # a read-only queue without a lock file
            yield
            return
        wait_for_lock(self._lock_fd, self._lock_path, self.settings.lock_limit)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self.summary.refresh_noted()  # after the lock, in a thread: nobody waits for it

    def _reload(self) -> None:
        self.dedupe.forget()
        self.replay.reload(read_only=self.read_only)

    def _maybe_checkpoint(self, least: int | None = None) -> None:
        self.replay.maybe_checkpoint(least, read_only=self.read_only)

    def _catch_up(self) -> None:
        self.replay.catch_up(read_only=self.read_only)

    def _notify(self, notice: str) -> None:
        self._notices.append(notice)

    # -- RecordStore hooks -----------------------------------------------------

    def _locked(self) -> _Locked:
        """The queue lock held, the state brought up to the files (``with``)."""
        return _Locked(self)

    def _write(self, batch: list[Record], *, sync: bool) -> None:
        if not batch:
            return
        starts = self.journal.append(batch, sync=sync)
        apply = self.state.apply
        for record, loc in zip(batch, starts, strict=True):
            apply(record, loc)

    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        # A big enqueue is many short locked sections; a checkpoint after each
        # would rewrite the whole state every few batches. One at the end.
        self.replay.bulk = True
        self.dedupe.few = len(items) <= FEW_ITEMS
        self.dedupe.may_write = not self.read_only
        try:
            result = super().enqueue(items)
        finally:
            self.replay.bulk = self.dedupe.few = False
        least = self.replay.least_on_close()
        if self.dedupe.worth_saving or self.journal.lines - self.replay.checkpoint_lines >= least:
            with self._locked():
                self._maybe_checkpoint(self.replay.least_on_close())
                self.dedupe.save(read_only=self.read_only)
        return result

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        # A few texts: probe the keys index, as a small enqueue does.
        self.dedupe.few = len(texts) <= FEW_ITEMS
        self.dedupe.may_write = not self.read_only
        try:
            return super().find_ids(texts)
        finally:
            self.dedupe.few = False

    def _append_enqueued(self, first_id: int, texts: list[str]) -> None:
        journal = self.journal
        encoded = encode_enqueued(first_id, (journal.last_seq or 0) + 1, texts, time.time())
        if encoded is None:  # a text that is not UTF-8: the general encoder
            super()._append_enqueued(first_id, texts)
            return
        data, sizes = encoded
        if not sizes:
            return
        locs = list(accumulate(sizes[:-1], initial=journal.offset))
        journal.append_encoded(data, len(sizes), sync=True)
        self.state.apply_enqueued(first_id, locs, texts)

    def _load_text(self, item_id: int, loc: int) -> str:
        """The text of item ``item_id``, whose record starts at offset ``loc``."""
        record = decode(read_line(self.journal.fd, loc).removesuffix(b"\n"))
        if record is None or record.get("t") not in ("enq", "item") or record["id"] != item_id:
            raise DamagedState(f"{self.journal.path}: no record of item {item_id} at offset {loc}")
        return item_text(record)

    def _record_at(self, loc: int) -> Record:
        record = decode(read_line(self.journal.fd, loc).removesuffix(b"\n"))
        if record is None:
            raise DamagedState(f"{self.journal.path}: no intact record at offset {loc}")
        return record

    def _archived_result(self, item_id: int) -> ItemResult | None:
        from statequeue.store.journal.archive_index import archived_result  # lazy: start-up time

        found, self._archive_index = archived_result(
            self.dir, self.state.archive_size, item_id, self._archive_index, save=not self.read_only
        )
        return found

    def sync(self) -> None:
        with self._locked():
            self.journal.sync()

    def _sync_written(self) -> None:
        self.journal.sync()

    def keep_space_reserve(self) -> None:
        if not self.read_only:
            from statequeue.store.journal import space_reserve  # lazy: start-up time (run only)

            space_reserve.keep(self.dir)

    @contextmanager
    def space_reserve_freed(self, failure: BaseException | None = None) -> Iterator[bool]:
        broken = self._broken
        failure = broken if failure is None else failure
        if not (failure is broken and isinstance(broken, DiskFull) and broken.appendable):
            yield False
            return
        from statequeue.store.journal import space_reserve  # lazy: start-up time (run only)

        if not (self._reserve_freed or space_reserve.free(self.dir)):
            yield False
            return
        self._reserve_freed = True  # one stop: the library gives its items back a call each
        self._broken = None
        self.replay.bulk = True  # no checkpoint meanwhile: the room freed is for the records
        try:
            yield True
        finally:
            self.replay.bulk = False
            self._broken = self._broken or broken  # stopped, as after any DurabilityError

    def bucket_update(self, change: BucketChange, *, create: bool = True) -> Bucket | None:
        return self.rate.update(change, create=create)

    def _claim_free(self, item: LiveItem) -> bool:
        return self.claims.free(item.id)

    def _take_claim(self, item_id: int) -> tuple[int, ...] | None:
        return self.claims.take(item_id)

    def _drop_claim(self, item_id: int) -> None:
        self.claims.drop(item_id)

    def _runner_alive(self, runner_id: str) -> bool:
        return self.claims.runner_alive(runner_id)

    def _forget_runner(self, runner_id: str) -> None:
        self.claims.forget_runner(runner_id)

    def publish_workers(self, runner_id: str, workers: Sequence[WorkerView]) -> None:
        self.claims.publish(runner_id, [[w.slot, w.pid, w.items, w.rss] for w in workers])

    def published_workers(self, runner_id: str) -> tuple[WorkerView, ...]:
        from statequeue.core.views import WorkerView  # lazy: start-up time

        with suppress(TypeError):  # rows not as written: nothing shown
            return tuple(WorkerView(*row) for row in self.claims.published(runner_id))
        return ()

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        self.claims.lock_runner(runner.runner_id)
        try:
            super().register_runner(runner, exclusive=exclusive)
        except BaseException:
            self.claims.undo_lock_runner(runner.runner_id)
            raise

    def liveness_fds(self, runner_id: str) -> tuple[int, ...]:
        return self.claims.liveness_fds(runner_id)

    def unregister_runner(self, runner_id: str) -> None:
        super().unregister_runner(runner_id)
        # The end of a run leaves a checkpoint (and so the stats summary) at
        # the journal's end: the `status` or `stats` after it replays and
        # folds nothing, instead of up to an eighth of the items' records.
        if self.settings.caches and not self.read_only:
            with self._locked():
                self._maybe_checkpoint(self.settings.checkpoint_on_close)
        self.claims.unlock_runner(runner_id)

    def _known_keys(self, state: QueueState) -> Container[str]:
        self.dedupe.prepare(state)
        return self.dedupe.joined(super()._known_keys(state))

    # -- compaction --------------------------------------------------------------

    def _maybe_compact(self, state: QueueState) -> None:
        # A checkpoint first, so that the child opens the queue without
        # replaying (under the queue lock) what this store has read.
        if self._background is None:
            limit, lines = self.settings.auto_compact, self.journal.lines
            if not compaction_due(lines, state.live_count(), len(state.runners), limit):
                return  # the usual case: nothing more to import
            # lazy: start-up time (subprocess and online compaction's modules)
            from statequeue.store.journal.background_compaction import BackgroundCompaction

            self._background = BackgroundCompaction()
        notice = self._background.start_if_due(
            self.dir,
            state,
            lines=self.journal.lines,
            limit=self.settings.auto_compact,
            before=lambda: self._maybe_checkpoint(0),
        )
        if notice:
            self._notices.append(notice)

    def compact(self) -> CompactResult:
        result = self._compact_online(wait=self.settings.lock_limit)
        assert result is not None  # it waited for the compaction lock
        return result

    def compact_if_free(self) -> CompactResult | None:
        """Compact unless another compaction runs now (then None at once)."""
        return self._compact_online(wait=None)

    def _compact_online(self, *, wait: float | None) -> CompactResult | None:
        if self._broken is not None:
            raise self._broken
        from statequeue.store.journal.online_compaction import compact_online  # lazy: start-up

        try:
            return compact_online(self._compaction_site(), wait=wait)
        except DurabilityError as exc:
            self._broken = exc  # a failed fsync is never retried
            raise

    def _compaction_site(self) -> CompactionSite:
        """What compaction needs of this store, and nothing more."""
        from statequeue.store.journal.online_compaction import CompactionSite  # lazy: start-up

        return CompactionSite(
            folder=self.dir,
            ops=self.ops,
            journal=self.journal,
            settings=self.settings,
            lock_fd=self._lock_fd,
            locked=self._locked_pruned,
            flock=self._flock,
            catch_up=self._catch_up,
            stage_keys=self.dedupe.stage,
        )

    @contextmanager
    def _locked_pruned(self) -> Iterator[QueueState]:
        """``_locked``, with the records of runners that died pruned first."""
        with self._locked() as state:
            self.prune_dead_runners(state)
            yield state

    def close(self) -> None:
        if (
            self.settings.caches
            and self._broken is None
            and self._lock_fd >= 0
            and self.journal.fd >= 0
            and self.journal.lines - self.replay.checkpoint_lines >= self.replay.least_on_close()
        ):
            # Leave a checkpoint for the next opener (status, run) to start from.
            with suppress(StateQueueError), self._locked():
                self._maybe_checkpoint(self.replay.least_on_close())
        if self._background is not None:
            self._background.wait()
        self.dedupe.forget()
        self._close_files()
        # The state points back at this store (its text loader), a cycle that
        # only a full collection frees: a long-lived process opening queues
        # in a loop would hold every closed one's state (1M items: ~50 MB) till then.
        self.state.reset()

    def _close_files(self) -> None:
        self.summary.wait()
        self.rate.close()
        self.claims.close()
        self.journal.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        self.dir.close()


def _header(*, seq: int) -> Record:
    return {
        "seq": seq,
        "t": "snap",
        "v": 1,
        "next_id": 1,
        "archived": 0,
        "archive_size": 0,
        "watermark": 0,
    }


class _Locked:
    """``JournalStore._locked()``: the queue lock held (flock), the state
    brought up to the journal (another process's records, or its compaction);
    on the way out a checkpoint if one is due, the lock let go, then the stats
    cache refresh noted. A DurabilityError breaks the store for good (never
    retried). A class, not a generator: every call of the store (the runner's
    one per item) passes here."""

    __slots__ = ("_fd", "_store")

    def __init__(self, store: JournalStore) -> None:
        self._store = store
        self._fd = -1

    def __enter__(self) -> QueueState:
        store = self._store
        if store._broken is not None:
            raise store._broken
        fd = store._lock_fd
        if fd >= 0:  # else: a read-only queue without a lock file
            wait_for_lock(fd, store._lock_path, store.settings.lock_limit)
            self._fd = fd
        try:
            seen = store.journal.look()
            if seen == REPLACED:
                store._reload()  # compaction by another process replaced the file
            elif seen == GROWN:
                store._catch_up()
        except BaseException as exc:
            self._leave(exc)
            raise
        return store.state

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None:
            self._leave(exc)
            return
        try:
            self._store._maybe_checkpoint()
        except BaseException as failed:
            self._leave(failed)
            raise
        self._unlock()
        if self._fd >= 0:
            self._store.summary.refresh_noted()  # after the lock, in a thread: nobody waits

    def _leave(self, exc: BaseException) -> None:
        if isinstance(exc, DurabilityError):
            self._store._broken = exc  # never retry: this store refuses further work
        self._unlock()

    def _unlock(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
