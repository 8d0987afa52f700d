"""Compaction without stopping the world (the steps are in ``compaction.py``).

Who holds what, and for how long:

- ``compact.lock`` (flock, never renamed): held by the one compaction that
  runs, for its whole run. A second compaction waits for it (``compact``) or
  does not start (the runner's automatic one).
- the queue ``lock``: held twice, briefly: to note the journal's position and
  copy the state as of it (step 1), and to copy the records appended since,
  fsync and swap the files (step 3). Reading the journal, archiving and
  writing the new journal (step 2, the slow part) hold only ``compact.lock``.

Lock order is always ``compact.lock`` then ``lock``; a holder of the queue
lock only ever tries ``compact.lock`` without waiting, so they cannot deadlock.

The temp files of a compaction (``COMPACTING``) and their clean-up by an
opener are in ``compaction_files``.

The store hands compaction a ``CompactionSite``: its files, its settings and
the few of its steps compaction takes part in, and nothing else of it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from statequeue.core.errors import (
    CorruptJournal,
    DamagedState,
    LockTimeout,
    StateQueueError,
)
from statequeue.core.fileio import FileOps, durability_error, folder_at
from statequeue.core.records import decode, item_text
from statequeue.core.views import CompactResult
from statequeue.store.journal import checkpoint, key_index, stats_cache
from statequeue.store.journal.compaction import Built, Position, build
from statequeue.store.journal.compaction_files import (
    NEW_JOURNAL,
    NEW_KEYS,
    NEW_STATE,
    compaction_lock,
    remove_compacting,
)
from statequeue.store.journal.integrity import ARCHIVE, JOURNAL
from statequeue.store.journal.journal_file import JournalFile, parse, read_from, read_line
from statequeue.store.journal.settings import compaction_due
from statequeue.store.records.state import QueueState, TextLoader

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.journal.settings import JournalSettings

ATTEMPTS = 3  # a repair that replaced the journal meanwhile: start again from it


class _Superseded(Exception):
    """The journal or the archive was replaced while compacting (a repair)."""


@dataclass(frozen=True)
class CompactionSite:
    """What compaction needs of the store whose journal it compacts."""

    folder: QueueFolder
    ops: FileOps
    journal: JournalFile  # the store's open journal
    settings: JournalSettings  # caches on: stage the state, keys and stats caches too
    lock_fd: int  # the queue lock's descriptor (-1: a read-only queue without one)
    locked: Callable[[], AbstractContextManager[QueueState]]
    """The store's read-modify-write section, dead runners pruned: the queue
    lock held, the state brought up to date (reloaded if the journal was replaced)."""
    flock: Callable[[], AbstractContextManager[None]]
    """The queue lock alone: the journal as the store last read it."""
    catch_up: Callable[[], None]
    """Under ``flock``: apply the records appended since the store last read
    (validating them; a torn tail is cut)."""
    stage_keys: Callable[[JournalFile, str], None]
    """Write the dedupe keys index of the new journal to a staged name, if
    the keys are known without reading the files (``DedupeKeys.stage``)."""


def compact_online(site: CompactionSite, *, wait: float | None) -> CompactResult | None:
    """Compact the journal of the store that handed over ``site``, holding
    the queue lock only at the ends. None if another compaction runs and
    ``wait`` is None (else wait for it)."""
    with compaction_lock(site.folder, wait=wait) as held:
        if not held:
            return None
        for _ in range(ATTEMPTS):
            with contextlib.suppress(_Superseded):
                return _compact(site)
    raise LockTimeout(
        f"{site.folder.path}: its journal was replaced {ATTEMPTS} times while compacting "
        "(`fsck --repair`?); nothing was changed, try again"
    )


def _compact(site: CompactionSite) -> CompactResult:
    """One compaction, holding ``compact.lock``; _Superseded if another
    process replaced the journal or the archive meanwhile (nothing changed)."""
    remove_compacting(site.folder)  # a crashed compaction's (we hold compact.lock)
    pos, snapshot = _note_position(site)
    new = JournalFile(site.folder, NEW_JOURNAL, ops=site.ops)
    try:
        built = _build_body(site, pos, snapshot, new)
        if _gains_nothing(pos, snapshot, built, new):
            # Nothing renamed: the journal, its checkpoints and the archive
            # (which its header still vouches for) stay as they are.
            return CompactResult(
                bytes_before=pos.offset,
                bytes_after=pos.offset,
                archived=0,
                archive_bytes=built.archive_size,
            )
        copied = _stage_and_copy(site, pos, snapshot, built, new)
        return _swap(site, pos, built, copied, new)
    except OSError as exc:
        if exc.errno == errno.EISDIR:  # a folder where a checkpoint or cache goes
            # A rename names its target second.
            where = exc.filename2 or exc.filename or ""
            name = os.path.join(str(site.folder.path), str(where))
            raise folder_at(name) from None
        raise durability_error("compacting", str(site.folder.path), exc) from None
    finally:
        new.close()
        os.close(pos.fd)
        remove_compacting(site.folder)  # left only if the swap did not happen


def _note_position(site: CompactionSite) -> tuple[Position, QueueState]:
    """Step 1, under the queue lock: the journal's position, fsynced (a
    checkpoint must cover only durable records), and a copy of the state as of
    it."""
    try:
        # Most of the journal made durable before the lock is taken (a runner
        # leaves its start records unsynced): the fsync under it then writes
        # only what came since, instead of stalling every process meanwhile.
        site.ops.fsync(site.journal.fd)
    except OSError as exc:
        raise durability_error("fsync of", str(site.journal.path), exc) from None
    _queue_lock_soon(site)
    with site.locked() as state:
        journal = site.journal
        journal.sync()
        pos = Position(
            fd=os.dup(journal.fd),
            inode=journal.inode,
            offset=journal.offset,
            lines=journal.lines,
            last_seq=journal.last_seq or 0,
            path=journal.path,
        )
        meta, codes, locs = state.export()
    try:
        snapshot = QueueState(_reader(pos))
        snapshot.restore(meta, codes, locs)
        return pos, snapshot
    except BaseException:
        os.close(pos.fd)
        raise


def _queue_lock_soon(site: CompactionSite) -> None:
    """Take the queue lock, trying every millisecond (up to the lock timeout):
    the usual wait's backoff would starve compaction of a lock that busy
    processes take and give back every few milliseconds. The ``locked`` or
    ``flock`` that follows takes it again on the same descriptor at once."""
    fd = site.lock_fd
    if fd < 0:
        return
    deadline = time.monotonic() + site.settings.lock_limit
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"{site.folder.path / 'lock'} is held by another process (waited "
                    f"{site.settings.lock_limit:g}s; set STATEQUEUE_LOCK_TIMEOUT to wait longer)"
                ) from None
            time.sleep(_POLL)


_POLL = 0.001


def _reader(pos: Position) -> TextLoader:
    """Reads an item's text from the noted journal (by its own descriptor:
    the store may reopen its journal meanwhile)."""

    def load(item_id: int, loc: int) -> str:
        record = decode(read_line(pos.fd, loc).removesuffix(b"\n"))
        if record is None or record.get("t") not in ("enq", "item") or record["id"] != item_id:
            raise DamagedState(f"{pos.path}: no record of item {item_id} at offset {loc}")
        return item_text(record)

    return load


@dataclass(frozen=True)
class _Copied:
    """The records appended after the noted position that were copied into
    the new journal before the swap, without the queue lock."""

    end: int  # where they end in the old journal
    data: bytes  # their bytes there, compared again under the lock
    lines: int  # lines of the old journal up to ``end``
    last_seq: int  # the old seq of the last of them


def _build_body(
    site: CompactionSite, pos: Position, snapshot: QueueState, new: JournalFile
) -> Built:
    """Step 2's first half, holding only ``compact.lock``: archive, and write
    the new journal's body (fsynced) to the temp file ``new`` creates."""
    fd = site.folder.open_file(NEW_JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(fd)
    new.open()
    return build(pos=pos, folder=site.folder, state=snapshot, new=new, ops=site.ops)


def _gains_nothing(pos: Position, snapshot: QueueState, built: Built, new: JournalFile) -> bool:
    """Whether the body in ``new`` is not worth putting in place: it archived
    nothing, is no smaller than the journal up to ``pos``, and drops too few
    records to speed up replay. An ``item`` record says more than the ``enq``
    record it replaces (state, counts, enqueue time), so a queue of pending
    items alone would grow. Records dropped that outnumber the live items are
    what the automatic compaction starts for (``compaction_due``, asked the
    same here): such a rewrite is always put in place, so no runner starts
    one again and again that each time gives up."""
    if built.archived or new.offset < pos.offset:
        return False
    live, runners = snapshot.live_count(), len(snapshot.runners)
    return not compaction_due(pos.lines, live, runners, 1)


def _stage_and_copy(
    site: CompactionSite,
    pos: Position,
    snapshot: QueueState,
    built: Built,
    new: JournalFile,
) -> _Copied:
    """Step 2's second half: stage the keys index that names the new body (at
    its end: its items are those of the noted position, which this store's
    journal is still at), copy the records appended since, and stage the state
    checkpoint after them, so the swap copies, and every process that reopens
    replays, only what came after that."""
    if site.settings.checkpoint_every > 0:  # while ``new`` holds the body alone: see ``stage``
        archived = (snapshot.archive_size, built.archive_size)
        stats_cache.stage(site.folder, old=pos, new=new, archived=archived)
    if site.settings.checkpoint_every > 0:
        site.stage_keys(new, NEW_KEYS)
    copied = _copy_ahead(pos, new)
    if site.settings.checkpoint_every > 0:
        fresh = QueueState()
        _replay_written(new, fresh)
        checkpoint.save(site.folder, new, fresh, staged=NEW_STATE)
    return copied


def _copy_ahead(pos: Position, new: JournalFile) -> _Copied:
    """Copy the complete records appended after ``pos`` so far to ``new``
    (renumbered), fsynced. Others append meanwhile: a record being written
    is not complete yet and waits for the swap; the swap checks that the
    bytes copied are still there (a writer whose fsync failed cuts its own)."""
    data = read_from(pos.fd, pos.offset)
    try:
        found, used, last_seq = parse(
            data, path=str(pos.path), first_line=pos.lines + 1, last_seq=pos.last_seq
        )
    except CorruptJournal:  # seen half-written: all left to the swap, which holds the lock
        found, used, last_seq = [], 0, pos.last_seq
    if found:
        new.append(found, sync=True)
    return _Copied(pos.offset + used, data[:used], pos.lines + len(found), last_seq or 0)


def _replay_written(new: JournalFile, state: QueueState) -> None:
    """Apply what ``new`` holds so far to ``state`` (for its checkpoint)."""
    offset, lines, last_seq = new.offset, new.lines, new.last_seq
    new.offset, new.lines, new.last_seq = 0, 0, None
    new.replay(state.apply, repair=False)
    if (new.offset, new.lines, new.last_seq) != (offset, lines, last_seq):
        raise StateQueueError(f"{new.path}: changed while compacting")


def _swap(
    site: CompactionSite, pos: Position, built: Built, copied: _Copied, new: JournalFile
) -> CompactResult:
    """Step 3, under the queue lock: copy the records appended since those
    copied ahead, fsync, rename over the journal, fsync the folder, put the
    staged checkpoints in place."""
    folder = site.folder
    _queue_lock_soon(site)
    with site.flock():
        if site.journal.replaced() or folder.stat(ARCHIVE).st_ino != built.archive_inode:
            raise _Superseded()
        site.catch_up()  # validates the records since (cuts a torn tail)
        if os.pread(pos.fd, len(copied.data), pos.offset) != copied.data:
            raise _Superseded()  # a writer cut records copied ahead (its fsync failed)
        end = site.journal.offset
        tail = read_from(pos.fd, copied.end)[: end - copied.end]
        records, used, _ = parse(
            tail, path=str(pos.path), first_line=copied.lines + 1, last_seq=copied.last_seq
        )
        if used != len(tail):
            raise StateQueueError(f"{pos.path}: changed while compacting")
        new.append(records, sync=True)  # renumbered after the new body
        site.ops.replace(folder.entry(NEW_JOURNAL), folder.entry(JOURNAL))
        site.ops.fsync_dir(folder.itself())
        for staged, name in (
            (NEW_STATE, checkpoint.NAME),
            (NEW_KEYS, key_index.KEYS_NAME),
            (stats_cache.STAGED, stats_cache.NAME),
        ):
            # Caches: no fsync. A stale one never matches the new journal.
            if folder.exists(staged):
                os.replace(staged, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    return CompactResult(
        bytes_before=pos.offset,
        bytes_after=new.offset,
        archived=built.archived,
        archive_bytes=built.archive_size,
    )
