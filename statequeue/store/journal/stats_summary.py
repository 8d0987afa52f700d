"""The journal store's attempts and `stats` summary, read from its files.

The files are noted under the queue lock (a descriptor of their own and the
size that counts) and read after it, so that a long scan holds nobody up: a
compaction meanwhile replaces the journal and appends to the archive only past
the size noted. The summary comes from ``stats.ckpt`` plus the records after
it, and the store brings that cache up to each state checkpoint in a thread
(``stats_refresh``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, suppress
from itertools import chain
from typing import TYPE_CHECKING, TypeVar

from statequeue.core.errors import StateQueueError
from statequeue.store.journal.integrity import ARCHIVE, archive_missing
from statequeue.store.journal.journal_file import JournalFile
from statequeue.store.journal.stats_refresh import StatsRefresher
from statequeue.store.records.state import QueueState

# The cache's modules (stats, sketches, the attempt scan) are imported where
# used (``# lazy: start-up time``): `enqueue` never folds attempts.
if TYPE_CHECKING:
    from statequeue.stats.figures import StatsBuilder
    from statequeue.store.journal import stats_cache
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.journal.settings import JournalSettings

_T = TypeVar("_T")


class StatsSummary:
    """The attempts in the files of one journal store. ``locked`` is the
    store's read-modify-write section: the queue lock held, and the state
    brought up to date."""

    def __init__(
        self,
        folder: QueueFolder,
        journal: JournalFile,
        settings: JournalSettings,
        locked: Callable[[], AbstractContextManager[QueueState]],
    ) -> None:
        self.folder = folder
        self.journal = journal
        self.settings = settings
        self._locked = locked
        self._refresher = StatsRefresher(folder)  # stats.ckpt, brought up to each checkpoint

    def note_checkpoint(self, state: QueueState) -> None:
        """A state checkpoint was saved: the cache is to follow it once the
        queue lock is released (``refresh_noted``). Caller holds the lock."""
        with suppress(StateQueueError, OSError):  # stats.ckpt follows once the lock is released
            self._refresher.note(self._files_to_summarise(state))

    def refresh_noted(self) -> None:
        """Start bringing the cache up to the checkpoint noted, in a thread
        (after the queue lock is released: nobody waits for it)."""
        self._refresher.start()

    def wait(self) -> None:
        """Let a running refresh finish (before the store closes its files)."""
        self._refresher.wait()  # it reads through descriptors of its own, but writes in the folder

    def builder(self, *, read_only: bool) -> StatsBuilder:
        """Every finished attempt folded (what ``iter_attempt_batches`` yields,
        unfiltered), from the stats cache plus the records after it; the cache
        is brought up to date. The files are noted under the lock and read
        from duplicates after it, as ``scan`` does."""
        from statequeue.store.journal import stats_cache  # lazy: start-up time
        from statequeue.store.journal.attempt_scan import scan_attempt_batches  # lazy: start-up

        if not self.settings.caches:  # caches off: the files alone
            from statequeue.stats.figures import StatsBuilder  # lazy: start-up time

            builder = StatsBuilder(now=0.0)
            builder.add_all(self.scan(scan_attempt_batches))
            return builder
        archive, journal = self._note_files()
        try:
            save = not read_only
            return stats_cache.summarise(self.folder, archive, journal, save=save).builder
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
        from statequeue.store.journal import stats_cache  # lazy: start-up time

        j = self.journal
        journal = stats_cache.File(os.dup(j.fd), j.inode, j.offset, str(j.path))
        if not state.archive_size:
            return None, journal
        try:
            fd = self.folder.open_file(ARCHIVE, os.O_RDONLY)
        except FileNotFoundError:
            os.close(journal.fd)
            name = self.folder.path / ARCHIVE
            raise archive_missing(name) from None
        inode, path = os.fstat(fd).st_ino, str(self.folder.path / ARCHIVE)
        return stats_cache.File(fd, inode, state.archive_size, path), journal

    def scan(self, scan: Callable[..., Iterator[_T]]) -> Iterator[_T]:
        """``scan`` over the archive (up to what the snapshot vouches for),
        then the live journal, each from a duplicate taken now: a compaction
        meanwhile replaces the journal and appends past ``archive_size`` only."""
        with self._locked() as state:
            journal = scan(self.journal.fd, self.journal.offset, path=str(self.journal.path))
            if not state.archive_size:
                return journal
            name = self.folder.path / ARCHIVE
            try:
                fd = self.folder.open_file(ARCHIVE, os.O_RDONLY)
            except FileNotFoundError:
                raise archive_missing(name) from None
            try:
                archive = scan(fd, state.archive_size, path=str(name))
            finally:
                os.close(fd)
        return chain(archive, journal)
