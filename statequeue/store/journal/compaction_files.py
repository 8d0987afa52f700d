"""The files a compaction leaves while it runs, and their clean-up by an opener.

Every open of a writable queue removes the temp files of rewrites that died;
that is all an open needs of compaction. It lives here, apart from
``online_compaction`` (the compaction itself, which imports the stats and
archive machinery), so that `enqueue` and `status` start without loading it.

The temp files of a compaction (``COMPACTING``) are written without the queue
lock, so an opener removes stale ones only while it can take ``compact.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from statequeue.store.journal import checkpoint, key_index
from statequeue.store.journal.integrity import ARCHIVE, ARCHIVE_INDEX, JOURNAL, STATS_CACHE
from statequeue.store.journal.locks import wait_for_lock

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder

COMPACT_LOCK = "compact.lock"
MARK = ".compacting."
NEW_JOURNAL = f".{JOURNAL}{MARK}tmp"
NEW_STATE = f".{checkpoint.NAME}{MARK}tmp"
NEW_KEYS = f".{key_index.KEYS_NAME}{MARK}tmp"
NEW_STATS = f".{STATS_CACHE}{MARK}tmp"
COMPACTING = (NEW_JOURNAL, NEW_STATE, NEW_KEYS, NEW_STATS)


@contextmanager
def compaction_lock(folder: QueueFolder, *, wait: float | None) -> Iterator[bool]:
    """Hold ``compact.lock``: yields False at once, holding nothing, if
    another compaction holds it and ``wait`` is None; else waits up to
    ``wait`` seconds (LockTimeout after)."""
    fd = folder.open_file(COMPACT_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        if wait is None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        else:
            wait_for_lock(fd, folder.path / COMPACT_LOCK, wait)
        yield True
    finally:
        os.close(fd)  # drops the lock


def remove_stale_compaction(folder: QueueFolder) -> None:
    """Remove the temp files of a compaction that died, if none runs now
    (caller holds the queue lock; ``compact.lock`` is only tried)."""
    if not any(folder.exists(name) for name in COMPACTING):
        return
    with contextlib.suppress(OSError), compaction_lock(folder, wait=None) as held:
        if held:
            remove_compacting(folder)


def remove_stale_temp_files(folder: QueueFolder) -> None:
    """Remove the temp files of rewrites that died (caller holds the queue
    lock, and may write the queue)."""
    # Temp files are written only under the queue lock, which the caller
    # holds: any found now was left by a process that died mid-rewrite.
    # A compaction's are written without it (under compact.lock): those
    # only while no compaction runs.
    # stats.ckpt's are written without the queue lock: removing one being
    # written costs that `stats` its cache save, nothing more.
    kinds = (
        JOURNAL,
        ARCHIVE,
        checkpoint.NAME,
        key_index.KEYS_NAME,
        STATS_CACHE,
        ARCHIVE_INDEX,
    )
    prefixes = tuple(f".{name}." for name in kinds)
    for tmp in folder.names():
        if tmp.startswith(prefixes) and tmp.endswith(".tmp") and MARK not in tmp:
            with contextlib.suppress(FileNotFoundError):
                folder.unlink(tmp)
    remove_stale_compaction(folder)


def remove_compacting(folder: QueueFolder) -> None:
    """Remove a compaction's temp files (caller holds ``compact.lock``)."""
    for name in COMPACTING:
        with contextlib.suppress(FileNotFoundError):
            folder.unlink(name)
