"""What the local store reads back from its files: the records of the
journal and the archive, attempts and deferrals for `stats`, the logs, and
the event stream of `events --follow`. Kept apart from store.py, which holds
the queue lock, the writes and compaction."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from contextlib import suppress
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import StateQueueError
from statequeue.core.leftover_note import note_name
from statequeue.core.models import ItemState
from statequeue.core.records import Record, decode, item_text
from statequeue.store.base import attempts_since, deferrals_in
from statequeue.store.journal.archive_file import open_vouched, read_archive
from statequeue.store.journal.claims import ClaimLocks
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.integrity import ARCHIVE
from statequeue.store.journal.journal_file import JournalFile, iter_marked, iter_records, read_from
from statequeue.store.journal.leftover_notes import RUNNERS, held_by_leftovers
from statequeue.store.journal.stats_summary import StatsSummary
from statequeue.store.records.record_store import RecordStore

if TYPE_CHECKING:
    from statequeue.core.views import ItemView, LogsRemoved, Status
    from statequeue.stats.attempts import Attempt, AttemptBatch
    from statequeue.stats.figures import StatsBuilder


class JournalReads(RecordStore):
    """The read side of ``JournalStore`` (which sets these attributes)."""

    folder: Path
    dir: QueueFolder
    claims: ClaimLocks
    journal: JournalFile
    summary: StatsSummary
    read_only: bool

    def _archived_views(self, state: ItemState | None) -> Iterator[ItemView]:
        if state not in (None, ItemState.DONE):
            return
        from statequeue.core.views import ItemView  # lazy: start-up time

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

    def deferrals(self, since: float | None = None) -> int:
        marker = b'"t":"defer"'  # a defer record's, or one kept in an item's tries
        with self._locked():
            journal = iter_marked(
                self.journal.fd, self.journal.offset, marker, path=str(self.journal.path)
            )
            archived = self._archive_marked(marker)
        return deferrals_in(chain(archived, journal), since)

    def _archive_marked(self, marker: bytes) -> Iterator[Record]:
        """``iter_marked`` over the archive, up to the size the snapshot vouches for."""
        size = self.state.archive_size
        if size == 0:
            return iter(())
        fd = open_vouched(self.dir, ARCHIVE)
        try:
            return iter_marked(fd, size, marker, path=str(self.dir.path / ARCHIVE))
        finally:
            os.close(fd)

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        from statequeue.store.journal.attempt_scan import scan_attempts  # lazy: start-up time

        return attempts_since(self.summary.scan(scan_attempts), since)

    def iter_attempt_batches(self, since: float | None = None) -> Iterator[AttemptBatch]:
        from statequeue.store.journal.attempt_scan import scan_attempt_batches  # lazy: start-up

        return self.summary.scan(scan_attempt_batches)  # `stats` applies ``since`` itself

    def stats_summary(self) -> StatsBuilder:
        """Every finished attempt folded (what ``iter_attempt_batches`` yields,
        unfiltered), from the stats cache plus the records after it; the cache
        is brought up to date."""
        return self.summary.builder(read_only=self.read_only)

    def journal_folder(self) -> Path:
        """The queue's own folder: its records live there (see ``Store``)."""
        return self.folder

    # -- leftovers of earlier attempts (core/leftover_note.py) ------------------

    def leftover_note(self, runner_id: str) -> tuple[int, str] | None:
        with suppress(OSError, StateQueueError):  # no note: a hint, not a promise
            return self.dir.subfolder(RUNNERS), note_name(runner_id)
        return None

    def held_by_leftovers(self, among: Collection[int] | None = None) -> dict[int, tuple[int, ...]]:
        return held_by_leftovers(self.dir, self.state, self.claims, among)

    def status(self) -> Status:
        """The record stores' status, with the pending items a leftover holds."""
        found = super().status()
        held = self.held_by_leftovers()
        return replace(found, leftovers=tuple(sorted(held.items()))) if held else found

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

    def remove_finished_logs(self, keep: float) -> LogsRemoved:
        from statequeue.store.journal.compaction_logs import remove_finished_logs  # lazy: start-up

        def finished(item_id: int) -> bool:
            # Done: archived already, or by the compaction that follows.
            return self.state.state_of(item_id) is ItemState.DONE

        with self._locked():  # the state read is that of one moment
            return remove_finished_logs(self.dir, finished, keep)

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        try:
            # Never waiting on a FIFO, only a file of this user's (folder.py: UnsafeFolder).
            fd = self.dir.open_file(f"{item_id}.{attempt}.log", os.O_RDONLY, sub="logs")
        except FileNotFoundError:
            return None
        with open(fd, "rb") as f:
            f.seek(offset)
            return f.read()

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        inode, offset, seen = cursor if isinstance(cursor, tuple) else (None, 0, None)
        # The journal read so far, held open across a compaction that replaces
        # it: the records appended to it after the cursor and before the
        # compaction's position are in the new journal's snapshot only, as
        # item states, not as records. They are read from it (an outside
        # tester's `events --follow` lost ~1% of its end records so). This
        # store keeps it when another call reloaded first (JournalFile.previous).
        journal = self.journal
        journal.keep_previous = True
        followed = -1
        if inode is not None and inode == journal.inode and journal.fd >= 0:
            followed = os.dup(journal.fd)
        elif inode is not None and journal.previous is not None and journal.previous[0] == inode:
            followed = os.dup(journal.previous[1])
        try:
            with self._locked():
                compacted = inode != journal.inode
                start = 0 if compacted else offset  # compacted: from its snapshot
                data = read_from(journal.fd, start)[: journal.offset - start]
                found = [r for r in map(decode, data.splitlines()) if r is not None]
                earlier: list[Record] = []
                if compacted and found:
                    # lazy: start-up time (compaction's modules, only after one)
                    from statequeue.store.journal.compaction import (
                        continues_from,
                        unseen_after_compaction,
                    )

                    whole = followed >= 0 and continues_from(found[0], inode)
                    if whole:
                        # Replaced under the queue lock, which this holds: it ends here.
                        tail = read_from(followed, offset)
                        earlier = [r for r in map(decode, tail.splitlines()) if r is not None]
                        seen = earlier[-1]["seq"] if earlier else seen
                    found = unseen_after_compaction(found, inode, seen, read_to_end=whole)
                cursor = (journal.inode, journal.offset, journal.last_seq)
                return earlier + found, cursor
        finally:
            if followed >= 0:
                os.close(followed)
