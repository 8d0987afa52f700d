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
from collections.abc import Callable, Collection, Container, Iterator, Sequence
from contextlib import contextmanager, suppress
from itertools import accumulate, chain
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from statequeue.core.errors import (
    CorruptJournal,
    DamagedState,
    DurabilityError,
    NoAccess,
    QueueNotFound,
    StateQueueError,
    UsageError,
)
from statequeue.core.fileio import DEFAULT_OPS, FileOps
from statequeue.core.models import EnqueueResult, ItemState, RunnerInfo
from statequeue.core.records import Record, decode, encode_enqueued, item_text
from statequeue.store.base import attempts_since
from statequeue.store.journal import checkpoint, key_index
from statequeue.store.journal.archive_index import ArchiveIndex, archived_result
from statequeue.store.journal.background_compaction import BackgroundCompaction
from statequeue.store.journal.checkpoint import Found
from statequeue.store.journal.folder import SUBFOLDERS, QueueFolder
from statequeue.store.journal.integrity import ARCHIVE as ARCHIVE  # the names live with the checks
from statequeue.store.journal.integrity import (
    ARCHIVE_INDEX,
    STATS_CACHE,
    refuse_if_incomplete,
    refuse_if_not_new,
)
from statequeue.store.journal.integrity import JOURNAL as JOURNAL
from statequeue.store.journal.journal_file import (
    GROWN,
    REPLACED,
    JournalFile,
    TornTail,
    create_file,
    iter_records,
    parse,
    read_from,
    read_line,
    scan_item_texts,
)
from statequeue.store.journal.locks import (
    CLAIMS,
    OFD_LOCKS,
    lock_is_free,
    lock_range,
    lock_timeout,
    open_claims_probe,
    range_locked,
    try_lock,
    unlink_if_free,
    wait_for_lock,
)
from statequeue.store.journal.online_compaction import MARK, remove_stale_compaction
from statequeue.store.journal.stats_refresh import StatsRefresher
from statequeue.store.records.record_store import RecordStore
from statequeue.store.records.state import LiveItem, QueueState

_T = TypeVar("_T")

if TYPE_CHECKING:
    from statequeue.core.views import CompactResult, ItemResult, ItemView
    from statequeue.stats.attempts import Attempt, AttemptBatch
    from statequeue.stats.figures import StatsBuilder
    from statequeue.store.journal import stats_cache

LOCK = "lock"
AUTO_COMPACT_ENV = "STATEQUEUE_AUTO_COMPACT"
DEFAULT_AUTO_COMPACT = 100_000
CHECKPOINT_ENV = "STATEQUEUE_CHECKPOINT_EVERY"
CHECKPOINT_EVERY = 20_000
CHECKPOINT_ON_CLOSE = 1_000
KEYS_CACHE_AFTER = 20_000  # records read to build the dedupe keys that make caching them pay
# An enqueue of at most this many items probes the keys index (a binary search
# each) instead of loading every key: cheaper while it is a small share of the
# queue; a bigger one loads them all (one dict, C-speed membership).
FEW_ITEMS = 2_000


class JournalStore(RecordStore):
    """A queue kept in ``folder`` as a checksummed JSON-lines journal."""

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
        self.dir = QueueFolder.open(folder, create=create, ops=ops)
        self.read_only = False  # the user may read the queue but not write it
        self._torn_left: TornTail | None = None  # reported, not cut (read-only)
        self.journal = JournalFile(self.dir, JOURNAL, ops=ops)
        self._claims: dict[int, int] = {}
        self._claims_probe = -1  # claims.lock, opened once, to test other holders' claims
        self._runner_locks: dict[str, int] = {}
        self._archived: dict[str, int] | None = None
        self._index: _IndexKeys | None = None  # the keys index probed by a small enqueue
        self._archive_index: ArchiveIndex | None = None  # where archived results are
        self._few = False  # this enqueue is small enough to probe the index
        self._broken: DurabilityError | None = None
        self._checkpoint_lines = 0  # journal lines covered by the last checkpoint
        self._stats = StatsRefresher(self.dir)  # stats.ckpt, brought up to each checkpoint
        self.restored_from_checkpoint = False  # how the last (re)load went, for tests
        self._bulk = False  # inside enqueue: one checkpoint at the end, not one per batch
        self._save_keys = False  # the dedupe keys were costly to build: cache them
        self._keys_were_empty = False  # this enqueue started on a queue with no items
        self.keys_from_cache = False  # for tests
        self.replayed_on_open = 0
        self.checkpoint_every = checkpoint_threshold()
        self.checkpoint_on_close = min(CHECKPOINT_ON_CLOSE, self.checkpoint_every)
        self._lock_fd = -1
        self._lock_path = folder / LOCK  # for the message only: built once, not per lock
        self._lock_limit = lock_timeout()
        self.auto_compact = auto_compact_threshold() if auto_compact is None else auto_compact
        self._background = BackgroundCompaction()
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
            self._reload()
            # Only now that the journal opened: a damaged queue is left as found.
            self._remove_stale_temp_files()

    def _open_lock(self, create: bool) -> int:
        """The lock file, open for writing; if the user may not write the queue
        (and is not creating it), open read-only and make this store read-only:
        it reads as usual, and a write is refused with NoAccess naming the file."""
        try:
            return self.dir.open_file(LOCK, os.O_RDWR | os.O_CREAT)
        except NoAccess:
            if create:
                raise
        self.read_only = True
        self.journal.writable = False
        try:
            return self.dir.open_file(LOCK, os.O_RDONLY)  # flock needs no write access
        except FileNotFoundError:
            return -1  # nothing to lock against: no writer could create it either

    def _remove_stale_temp_files(self) -> None:
        # Temp files are written only under the queue lock, which the caller
        # holds: any found now was left by a process that died mid-rewrite.
        # A compaction's are written without it (under compact.lock): those
        # only while no compaction runs.
        if self.read_only:
            return
        # stats.ckpt's are written without the queue lock: removing one being
        # written costs that `stats` its cache save, nothing more.
        kinds = (
            JOURNAL,
            ARCHIVE,
            checkpoint.NAME,
            checkpoint.KEYS_NAME,
            STATS_CACHE,
            ARCHIVE_INDEX,
        )
        prefixes = tuple(f".{name}." for name in kinds)
        for tmp in self.dir.names():
            if tmp.startswith(prefixes) and tmp.endswith(".tmp") and MARK not in tmp:
                with suppress(FileNotFoundError):
                    self.dir.unlink(tmp)
        remove_stale_compaction(self.dir)

    @contextmanager
    def _flock(self) -> Iterator[None]:
        if self._lock_fd < 0:  # a read-only queue without a lock file
            yield
            return
        wait_for_lock(self._lock_fd, self._lock_path, self._lock_limit)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._stats.start()  # after the lock, in a thread: nobody waits for it

    def _reload(self) -> None:
        """Read the journal afresh (from the checkpoint, when it matches).

        Nothing on disk changes until the journal is known to be whole: a
        torn tail is cut, and a stale checkpoint removed, only after every
        check passed (promise 5: a refused queue is left byte for byte)."""
        self._archived = None
        self._close_index()
        self._checkpoint_lines = 0
        found, torn, restored = self._read_journal()
        refuse_if_incomplete(self.journal, self.state, found)
        if torn is not None:
            if not self.read_only:  # a read-only queue leaves it for its next writer
                self.journal.cut_torn(torn)
            self._note_torn(torn)
        if found.found is Found.STALE:
            checkpoint.remove_stale(self.dir)
        elif found.found is Found.RESTORED and not restored:
            checkpoint.discard(self.dir)  # it matched, yet the records after it disagree
        self.restored_from_checkpoint = restored
        self._checkpoint_lines = found.lines if restored else 0
        self.replayed_on_open = self.journal.lines - self._checkpoint_lines
        self._maybe_checkpoint()

    def _read_journal(self) -> tuple[checkpoint.Restore, TornTail | None, bool]:
        """Replay the journal into the state, from the checkpoint when it
        matches, changing nothing on disk. Returns the verdict on the
        checkpoint, the torn tail found (not cut yet), and whether the state
        came from the checkpoint."""
        self.journal.open()
        self.state.reset()
        found = checkpoint.Restore(Found.NONE)
        if self.checkpoint_every > 0:
            found = checkpoint.restore(self.dir, self.journal, self.state)
        torn = self._replay_after_checkpoint() if found.found is Found.RESTORED else False
        if torn is not False:
            return found, torn, True
        # No checkpoint, or the records after it do not follow on from it:
        # trust the journal alone, from its first byte.
        self.journal.open()
        self.state.reset()
        return found, self.journal.replay(self.state.apply, repair=False), False

    def _least_on_close(self) -> int:
        """New records that make a checkpoint worth writing when a command ends:
        a few for a small queue, an eighth of the items for a big one (so a
        status poll on a busy 10M-item queue does not rewrite 90 MB each time)."""
        return max(self.checkpoint_on_close, len(self.state.codes) // 8)

    def _maybe_checkpoint(self, least: int | None = None) -> None:
        """Save a checkpoint once enough records were applied since the last one.

        By default that is CHECKPOINT_EVERY or an eighth of the item count,
        whichever is larger, so its cost (which grows with the queue) stays a
        small share of the work it saves. Caller holds the lock."""
        if self.checkpoint_every <= 0 or self.read_only or (self._bulk and least is None):
            return
        if least is None:
            least = max(self.checkpoint_every, len(self.state.codes) // 8)
        if self.journal.lines - self._checkpoint_lines < least:
            return
        # A checkpoint must never cover records that a power cut could still
        # take away (start records and group commits are not fsynced yet).
        self.journal.sync()
        checkpoint.save(self.dir, self.journal, self.state)
        self._checkpoint_lines = self.journal.lines  # not retried at once if it failed
        with suppress(StateQueueError, OSError):  # stats.ckpt follows once the lock is released
            self._stats.note(self._files_to_summarise(self.state))

    def _replay_after_checkpoint(self) -> TornTail | Literal[False] | None:
        """Replay the records after a restored checkpoint, changing nothing on
        disk: the torn tail after them (None if none), or False if they do not
        continue it cleanly (a gap, damage: a full replay tells which)."""
        try:
            return self.journal.replay(self.state.apply, repair=False)
        except CorruptJournal:
            return False

    def _catch_up(self) -> None:
        torn = self.journal.replay(self.state.apply, repair=not self.read_only)
        if torn is not None:
            self._note_torn(torn)

    def _note_torn(self, torn: TornTail) -> None:
        """Report a torn tail: cut, or on a read-only queue left in place (said
        once, though every read finds it again)."""
        if self.read_only:
            if torn == self._torn_left:
                return
            self._torn_left = torn
        self._notices.append(torn.describe(cut=not self.read_only))

    # -- RecordStore hooks -----------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[QueueState]:
        if self._broken is not None:
            raise self._broken
        with self._flock():
            try:
                seen = self.journal.look()
                if seen == REPLACED:
                    self._reload()  # compaction by another process replaced the file
                elif seen == GROWN:
                    self._catch_up()
                yield self.state
                self._maybe_checkpoint()
            except DurabilityError as exc:
                self._broken = exc  # never retry: this store refuses further work
                raise

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
        self._bulk = True
        self._few = len(items) <= FEW_ITEMS
        try:
            result = super().enqueue(items)
        finally:
            self._bulk = self._few = False
        if (
            self._save_keys
            or self._keys_were_empty
            or self.journal.lines - self._checkpoint_lines >= self._least_on_close()
        ):
            with self._locked():
                self._maybe_checkpoint(self._least_on_close())
                self._store_keys()
        return result

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        # A few texts: probe the keys index, as a small enqueue does.
        self._few = len(texts) <= FEW_ITEMS
        try:
            return super().find_ids(texts)
        finally:
            self._few = False

    def _append_enqueued(self, first_id: int, texts: list[str]) -> None:
        journal = self.journal
        encoded = encode_enqueued(first_id, (journal.last_seq or 0) + 1, texts)
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
        found, self._archive_index = archived_result(
            self.dir, self.state.archive_size, item_id, self._archive_index, save=not self.read_only
        )
        return found

    def sync(self) -> None:
        with self._locked():
            self.journal.sync()

    def _sync_written(self) -> None:
        self.journal.sync()

    def _claim_path(self, item_id: int) -> tuple[QueueFolder, str, str]:
        """The per-item claim file (no OFD locks, or an older version's claim)."""
        return self.dir, "claims", f"{item_id}.lock"

    def _claim_free(self, item: LiveItem) -> bool:
        if item.id in self._claims:
            return False
        if OFD_LOCKS:
            if self._claims_probe < 0:
                self._claims_probe = open_claims_probe(self.dir)
            if self._claims_probe >= 0 and range_locked(self._claims_probe, item.id):
                return False
        return lock_is_free(*self._claim_path(item.id))

    def _take_claim(self, item_id: int) -> tuple[int, ...] | None:
        fd: int | None
        if not OFD_LOCKS:
            fd = try_lock(*self._claim_path(item_id), create=True)
        else:
            # Its own open file description per claim: the lock lasts until
            # the runner, the keeper and the child have all closed theirs.
            fd = self.dir.open_file(CLAIMS, os.O_RDWR | os.O_CREAT)
            if not lock_range(fd, item_id):
                os.close(fd)
                fd = None
        if fd is None:
            return None
        self._claims[item_id] = fd
        return (fd,)

    def _drop_claim(self, item_id: int) -> None:
        fd = self._claims.pop(item_id, None)
        if fd is None:
            return
        os.close(fd)
        if OFD_LOCKS:
            return
        # Remove the lock file only if nobody else holds it. A descendant of
        # the child may still hold it: deleting the file then would let the
        # next claim create a fresh one and run a second copy alongside.
        unlink_if_free(*self._claim_path(item_id))

    def _runner_alive(self, runner_id: str) -> bool:
        if runner_id in self._runner_locks:
            return True
        return not lock_is_free(self.dir, "runners", f"{runner_id}.lock")

    def _forget_runner(self, runner_id: str) -> None:
        unlink_if_free(self.dir, "runners", f"{runner_id}.lock")

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        path = f"{runner.runner_id}.lock"
        fd = try_lock(self.dir, "runners", path, create=True)
        if fd is None:
            raise UsageError(f"runner id {runner.runner_id} is already in use")
        self._runner_locks[runner.runner_id] = fd
        try:
            super().register_runner(runner, exclusive=exclusive)
        except BaseException:
            del self._runner_locks[runner.runner_id]
            self.dir.unlink(path, sub="runners")
            os.close(fd)
            raise

    def unregister_runner(self, runner_id: str) -> None:
        super().unregister_runner(runner_id)
        # The end of a run leaves a checkpoint (and so the stats summary) at
        # the journal's end: the `status` or `stats` after it replays and
        # folds nothing, instead of up to an eighth of the items' records.
        if self.checkpoint_every > 0 and not self.read_only:
            with self._locked():
                self._maybe_checkpoint(self.checkpoint_on_close)
        fd = self._runner_locks.pop(runner_id, None)
        if fd is not None:
            with suppress(FileNotFoundError):
                self.dir.unlink(f"{runner_id}.lock", sub="runners")
            os.close(fd)

    def _known_keys(self, state: QueueState) -> Container[str]:
        cached = state.keys is None and self._archived is None and self.checkpoint_every > 0
        if cached and not (self._few and self._probe_index(state)):
            self._load_cached_keys(state)
        if state.keys is None:
            # Built the slow way below (every record decoded): worth caching
            # for the next enqueue (a cron job re-enqueueing everything).
            self._save_keys = self.journal.lines + state.archived >= KEYS_CACHE_AFTER
            self._keys_were_empty = state.next_id == 1
        if self._archived is None:
            # Dedupe must hold for items compaction moved out: load their keys
            # once, only when something is enqueued.
            self._archived = {
                item_text(r): r["id"] for r in read_archive(self.dir, ARCHIVE, state.archive_size)
            }
        live = super()._known_keys(state)
        if self._index is not None:
            return _Either(live, self._index)
        return _Either(live, self._archived) if self._archived else live

    def _probe_index(self, state: QueueState) -> bool:
        """Take the dedupe keys as the keys index (probed, not loaded) plus
        the journal records after it; False if there is no matching index."""
        index = key_index.open_index(self.dir, self.journal)
        if index is None:
            return False
        tail = scan_item_texts(self.journal.fd, index.covers, self.journal.offset)
        if tail is None:
            index.close()
            return False
        state.keys = dict(tail)
        self._index = _IndexKeys(index, self._keys_the_slow_way)
        self._archived = {}  # the index holds them
        self.keys_from_cache = True
        # A long tail is scanned by every enqueue: worth a fresh index.
        self._save_keys = len(tail) >= KEYS_CACHE_AFTER
        return True

    def _keys_the_slow_way(self) -> dict[str, int]:
        """Every item text (text -> id), from every record of the journal and
        the archive (the keys index failed a checksum meanwhile)."""
        key_index.discard(self.dir)
        self._save_keys = True
        keys = {
            item_text(r): r["id"] for r in read_archive(self.dir, ARCHIVE, self.state.archive_size)
        }
        for r in self._journal_records():
            if r.get("t") in ("enq", "item"):
                keys[item_text(r)] = r["id"]
        return keys

    def _close_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    def _load_cached_keys(self, state: QueueState) -> None:
        """Dedupe keys from keys.ckpt (archived items included) plus the journal
        records after it, if it still matches the journal."""
        found = self._cached_keys()
        if found is None:
            return
        state.keys, tail = found
        self.keys_from_cache = True
        self._archived = {}  # the cache holds them
        self._save_keys = tail >= KEYS_CACHE_AFTER

    def _cached_keys(self) -> tuple[dict[str, int], int] | None:
        """Every item text (text -> id) from keys.ckpt plus the records after
        it, and how many came from those records; None if it does not match."""
        cached = key_index.load_keys(self.dir, self.journal)
        if cached is None:
            return None
        keys, offset = cached
        tail = scan_item_texts(self.journal.fd, offset, self.journal.offset)
        if tail is None:
            return None
        keys.update(tail)
        return keys, len(tail)

    def _store_keys(self) -> None:
        """Save keys.ckpt when building the keys was costly, or when this
        process filled a new queue with many items (so the first re-enqueue
        is fast too; the texts are at hand in id order). Caller holds the lock."""
        state = self.state
        fresh = state.enqueued_texts() if self._keys_were_empty else None
        self._keys_were_empty = False
        if self.checkpoint_every <= 0 or self._archived is None or self.read_only:
            return
        texts: list[str] | None = None
        if fresh is not None and len(fresh) >= KEYS_CACHE_AFTER:
            texts = fresh
        elif self._save_keys and self._index is not None and self._index.index is not None:
            # The index plus a long tail: merged into a fresh one, no sort of all.
            self._save_keys = False
            self.journal.sync()  # as for the state checkpoint
            with suppress(key_index.IndexDamaged):
                self._extend_index(self._index.index, self.journal, None)
            return
        elif self._save_keys:
            texts = self._texts_in_memory(state)
        if texts is None:
            return
        self._save_keys = False
        self.journal.sync()  # as for the state checkpoint
        key_index.save(self.dir, self.journal, texts)

    def _texts_in_memory(self, state: QueueState) -> list[str] | None:
        """Every item text in id order from the dedupe keys this process holds
        (journal and archive), or None if it has not loaded them."""
        keys = state.merged_keys()
        if keys is None or self._archived is None:
            return None
        if self._index is not None:
            return self._index.texts_with(keys, state.next_id)
        every = {**self._archived, **keys} if self._archived else keys
        return checkpoint.texts_by_id(every, state.next_id)

    def _archived_views(self, state: ItemState | None) -> Iterator[ItemView]:
        from statequeue.core.views import ItemView

        if state not in (None, ItemState.DONE):
            return
        rows = [
            (r["id"], item_text(r), r.get("attempt", 0))
            for r in read_archive(self.dir, ARCHIVE, self.state.archive_size)
        ]
        rows.sort()  # archived in completion order; listed in id order
        for item_id, text, attempt in rows:
            yield ItemView(item_id, text, ItemState.DONE, attempt)

    # -- reading back ------------------------------------------------------------

    def _journal_records(self) -> Iterator[Record]:
        return iter_records(self.journal.fd, self.journal.offset, path=str(self.journal.path))

    def _archive_records(self) -> Iterator[Record]:
        return read_archive(self.dir, ARCHIVE, self.state.archive_size)

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        from statequeue.store.journal.attempt_scan import scan_attempts

        return attempts_since(self._scan_files(scan_attempts), since)

    def iter_attempt_batches(self, since: float | None = None) -> Iterator[AttemptBatch]:
        from statequeue.store.journal.attempt_scan import scan_attempt_batches

        return self._scan_files(scan_attempt_batches)  # `stats` applies ``since`` itself

    def stats_summary(self) -> StatsBuilder:
        """Every finished attempt folded (what ``iter_attempt_batches`` yields,
        unfiltered), from the stats cache plus the records after it; the cache
        is brought up to date. The files are noted under the lock and read
        from duplicates after it, as ``_scan_files`` does."""
        from statequeue.store.journal import stats_cache

        if self.checkpoint_every <= 0:  # caches off: the files alone
            from statequeue.stats.figures import StatsBuilder

            builder = StatsBuilder(now=0.0)
            builder.add_all(self.iter_attempt_batches())
            return builder
        archive, journal = self._note_files()
        try:
            save = not self.read_only
            return stats_cache.summarise(self.dir, archive, journal, save=save).builder
        finally:
            os.close(journal.fd)
            if archive is not None:
                os.close(archive.fd)

    def _note_files(self) -> tuple[stats_cache.File | None, stats_cache.File]:
        """The archive (None if empty) and the journal, each with a descriptor
        of its own and the size that counts, noted under the queue lock."""
        with self._locked() as state:
            return self._files_to_summarise(state)

    def _files_to_summarise(
        self, state: QueueState
    ) -> tuple[stats_cache.File | None, stats_cache.File]:
        """``_note_files``, for a caller holding the queue lock."""
        from statequeue.store.journal import stats_cache

        j = self.journal
        journal = stats_cache.File(os.dup(j.fd), j.inode, j.offset, str(j.path))
        if not state.archive_size:
            return None, journal
        try:
            fd = self.dir.open_file(ARCHIVE, os.O_RDONLY)
        except FileNotFoundError:
            os.close(journal.fd)
            name = self.dir.path / ARCHIVE
            raise DamagedState(f"{name} is missing but the journal refers to it") from None
        inode, path = os.fstat(fd).st_ino, str(self.dir.path / ARCHIVE)
        return stats_cache.File(fd, inode, state.archive_size, path), journal

    def _scan_files(self, scan: Callable[..., Iterator[_T]]) -> Iterator[_T]:
        """``scan`` over the archive (up to what the snapshot vouches for),
        then the live journal, each from a duplicate taken now: a compaction
        meanwhile replaces the journal and appends past ``archive_size`` only."""
        with self._locked() as state:
            journal = scan(self.journal.fd, self.journal.offset, path=str(self.journal.path))
            if not state.archive_size:
                return journal
            name = self.dir.path / ARCHIVE
            try:
                fd = self.dir.open_file(ARCHIVE, os.O_RDONLY)
            except FileNotFoundError:
                raise DamagedState(f"{name} is missing but the journal refers to it") from None
            try:
                archive = scan(fd, state.archive_size, path=str(name))
            finally:
                os.close(fd)
        return chain(archive, journal)

    def journal_folder(self) -> Path:
        """The queue's own folder: its records live there (see ``Store``)."""
        return self.folder

    @property
    def logs_fd(self) -> int:
        """The fd of the ``logs`` folder, for the runner to open logs relative
        to (-1 if a read-only queue has none)."""
        try:
            return self.dir.subfolder("logs", create=not self.read_only)
        except FileNotFoundError:
            return -1

    def _log_paths(self, item_id: int) -> tuple[str, ...]:
        prefix = f"{item_id}."
        found = sorted(
            (n for n in self.dir.names("logs") if n.startswith(prefix) and n.endswith(".log")),
            key=lambda n: int(n.split(".")[1]),
        )
        return tuple(self.dir.shown(n, "logs") for n in found)

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        try:
            fd = self.dir.open_file(f"{item_id}.{attempt}.log", os.O_RDONLY, sub="logs")
        except FileNotFoundError:
            return None
        with open(fd, "rb") as f:
            f.seek(offset)
            return f.read()

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        inode, offset, seen = cursor if isinstance(cursor, tuple) else (None, 0, None)
        with self._locked():
            compacted = inode != self.journal.inode
            if compacted:
                offset = 0  # the journal was compacted: continue from its snapshot
            data = read_from(self.journal.fd, offset)[: self.journal.offset - offset]
            found = [r for r in map(decode, data.splitlines()) if r is not None]
            if compacted and found:
                found = _unseen_after_compaction(found, inode, seen)
            return found, (self.journal.inode, self.journal.offset, self.journal.last_seq)

    # -- compaction --------------------------------------------------------------

    def _maybe_compact(self, state: QueueState) -> None:
        # Dead records: everything in the journal beyond one record per live
        # item and runner. Compacting once they outnumber the live ones (and a
        # floor) keeps replay and appends cheap however long the history grows.
        # It runs in a child process that holds the queue lock only briefly,
        # so the runners carry on meanwhile (``online_compaction``).
        limit = self.auto_compact
        if limit <= 0:
            return
        live = state.live_count()
        dead = self.journal.lines - live - len(state.runners) - 1
        if dead >= limit and dead > live:
            # A checkpoint first, so that the child opens the queue without
            # replaying (under the queue lock) what this store has read.
            notice = self._background.start(self.dir, before=lambda: self._maybe_checkpoint(0))
            if notice:
                self._notices.append(notice)

    def compact(self) -> CompactResult:
        result = self._compact_online(wait=self._lock_limit)
        assert result is not None  # it waited for the compaction lock
        return result

    def compact_if_free(self) -> CompactResult | None:
        """Compact unless another compaction runs now (then None at once)."""
        return self._compact_online(wait=None)

    def _compact_online(self, *, wait: float | None) -> CompactResult | None:
        from statequeue.store.journal.online_compaction import compact_online

        if self._broken is not None:
            raise self._broken
        try:
            return compact_online(self, wait=wait)
        except DurabilityError as exc:
            self._broken = exc  # a failed fsync is never retried
            raise

    def _stage_keys(self, new: JournalFile, staged: str) -> None:
        """Write the keys index of ``new`` (a compacted journal naming the
        same items as this store's journal up to its read position) to
        ``staged``, if the keys are known without reading the journal and the
        archive (in memory, or an index that still matches, extended by the
        records after it): the dedupe cache survives compaction instead of
        being rebuilt by the next enqueue."""
        if self.checkpoint_every <= 0:
            return
        texts = self._texts_in_memory(self.state)
        if texts is not None:
            key_index.save(self.dir, new, texts, staged=staged)
            return
        index = key_index.open_index(self.dir, self.journal)
        if index is None:
            return
        try:
            self._extend_index(index, new, staged)
        except key_index.IndexDamaged:
            key_index.discard(self.dir)
        finally:
            index.close()

    def _extend_index(
        self, index: key_index.KeyIndex, journal: JournalFile, staged: str | None
    ) -> None:
        """Write ``index`` plus the items after it in this store's journal as
        the index of ``journal`` (at its end)."""
        tail = scan_item_texts(self.journal.fd, index.covers, self.journal.offset)
        if tail is None:
            return
        next_id = self.state.next_id
        keys = dict(tail)
        if key_index.save_extended(self.dir, journal, index, keys, next_id, staged=staged) is None:
            texts = _overlay(index.texts(), keys, next_id)
            key_index.save(self.dir, journal, texts, staged=staged)

    def close(self) -> None:
        if (
            self.checkpoint_every > 0
            and self._broken is None
            and self._lock_fd >= 0
            and self.journal.fd >= 0
            and self.journal.lines - self._checkpoint_lines >= self._least_on_close()
        ):
            # Leave a checkpoint for the next opener (status, run) to start from.
            with suppress(StateQueueError), self._locked():
                self._maybe_checkpoint(self._least_on_close())
        self._background.wait()
        self._close_index()
        self._close_files()
        # The state points back at this store (its text loader), a cycle that
        # only a full collection frees: a long-lived process opening queues
        # in a loop would hold every closed one's state (1M items: ~50 MB) till then.
        self.state.reset()
        self._archived = None

    def _close_files(self) -> None:
        self._stats.wait()  # it reads through descriptors of its own, but writes in self.dir
        for item_id in list(self._claims):
            os.close(self._claims.pop(item_id))
        if self._claims_probe >= 0:
            os.close(self._claims_probe)
            self._claims_probe = -1
        for rid in list(self._runner_locks):
            os.close(self._runner_locks.pop(rid))
        self.journal.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        self.dir.close()


def auto_compact_threshold() -> int:
    """Dead records that trigger automatic compaction: $STATEQUEUE_AUTO_COMPACT
    (0 or "off" disables it), default 100,000."""
    return _records_setting(AUTO_COMPACT_ENV, DEFAULT_AUTO_COMPACT)


def checkpoint_threshold() -> int:
    """Records between state checkpoints: $STATEQUEUE_CHECKPOINT_EVERY
    (0 or "off": neither written nor used), default 20,000 (or an eighth of
    the items, whichever is more)."""
    return _records_setting(CHECKPOINT_ENV, CHECKPOINT_EVERY)


def _records_setting(name: str, default: int) -> int:
    """A count of records from environment variable ``name``: "on" or unset for
    ``default``, 0 or "off" for none."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "on"):
        return default
    if raw in ("0", "off", "no", "false"):
        return 0
    try:
        return max(0, int(raw))
    except ValueError:
        raise UsageError(f"{name} must be a number of records or off, not {raw!r}") from None


class _Either:
    """Membership in either of two key sets (live journal, archive)."""

    def __init__(self, first: Container[str], second: Container[str]) -> None:
        self.first = first
        self.second = second

    def __contains__(self, key: object) -> bool:
        return key in self.first or key in self.second

    def get(self, key: str) -> int | None:
        """The id of item ``key`` (for ``find``), from whichever set holds it."""
        for keys in (self.first, self.second):
            get = getattr(keys, "get", None)  # a dict, or the keys index
            found = get(key) if get is not None else None
            if isinstance(found, int):
                return found
        return None


class _IndexKeys:
    """Membership in the keys index; if it fails a checksum, in the keys
    built the slow way instead (dedupe never trusts a damaged index)."""

    def __init__(self, index: key_index.KeyIndex, slow: Callable[[], dict[str, int]]) -> None:
        self.index: key_index.KeyIndex | None = index
        self.slow = slow
        self.keys: dict[str, int] = {}

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def get(self, key: str) -> int | None:
        if self.index is not None:
            try:
                return self.index.get(key)
            except key_index.IndexDamaged:
                self.close()
                self.keys = self.slow()
        return self.keys.get(key)

    def texts_with(self, keys: dict[str, int], next_id: int) -> list[str] | None:
        """Every item text in id order: the index's, then ``keys`` over them."""
        if self.index is None:
            return checkpoint.texts_by_id({**self.keys, **keys}, next_id)
        try:
            texts = self.index.texts()
        except key_index.IndexDamaged:
            return None
        return _overlay(texts, keys, next_id)

    def close(self) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None


def _overlay(texts: list[str], keys: dict[str, int], next_id: int) -> list[str]:
    """``texts`` (by id) grown to ``next_id - 1`` ids, with ``keys`` (text -> id) set over them."""
    texts += [""] * (next_id - 1 - len(texts))
    for text, item_id in keys.items():
        if 0 < item_id < next_id:
            texts[item_id - 1] = text
    return texts


def _unseen_after_compaction(found: list[Record], inode: object, seen: object) -> list[Record]:
    """A compacted journal's records for a follower of the journal it replaced
    (``inode``, read up to seq ``seen``): its snapshot, then the records copied
    after it that the follower has not read there (copied in order, renumbered
    from the snapshot's end: old seq = new seq - follow - 1)."""
    header = found[0]
    source = header.get("from")
    if (
        header.get("t") != "snap"
        or not isinstance(source, dict)
        or source.get("inode") != inode
        or not isinstance(seen, int)
        or header["seq"] != source.get("seq", -1) + 1
    ):
        return found
    follow = header.get("follow", 0)
    body_end = header["seq"] + follow
    return [r for r in found if r["seq"] <= body_end or r["seq"] - follow - 1 > seen]


def read_archive(folder: QueueFolder, name: str, size: int) -> Iterator[Record]:
    """The archived item records, up to ``size`` bytes (what the snapshot vouches for)."""
    if size == 0:
        return
    path = folder.path / name
    try:
        fd = folder.open_file(name, os.O_RDONLY)
    except FileNotFoundError:
        raise DamagedState(f"{path} is missing but the journal refers to it") from None
    try:
        # Only the first ``size`` bytes count: a compaction that died after
        # appending here but before its journal took effect left the rest.
        data = read_from(fd, 0)[:size]
    finally:
        os.close(fd)
    found, used, _ = parse(data, path=str(path), first_line=1, last_seq=None)
    if used < size:
        raise DamagedState(f"{path}: damaged or shorter than the journal says ({used} < {size})")
    for record in found:
        if record.get("t") == "arch":
            yield record


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
