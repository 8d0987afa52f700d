"""The journal store's state, kept in step with its journal.

On open (and whenever another process replaced the journal) the state is
read afresh: from the state checkpoint when it still matches, then the
records after it; else from the journal's first byte. Records others append
are applied as the queue lock is taken (``catch_up``), and a fresh checkpoint
is saved once enough records were applied since the last one, so that its
cost, which grows with the queue, stays a small share of the work it saves.
Every method is called under the queue lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from statequeue.core.errors import CorruptJournal
from statequeue.store.journal import checkpoint
from statequeue.store.journal.cache_file import Found
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.integrity import refuse_if_archive_short, refuse_if_incomplete
from statequeue.store.journal.journal_file import JournalFile, TornTail
from statequeue.store.journal.settings import JournalSettings
from statequeue.store.journal.stats_summary import StatsSummary
from statequeue.store.records.state import QueueState


class Replay:
    """Brings ``state`` up to ``journal``, and checkpoints it. ``notify``
    reports a torn tail to the store's user; ``read_only`` (given on each
    call: the store may be made read-only) leaves every file as found."""

    def __init__(
        self,
        folder: QueueFolder,
        journal: JournalFile,
        state: QueueState,
        settings: JournalSettings,
        *,
        summary: StatsSummary,
        notify: Callable[[str], None],
    ) -> None:
        self.folder = folder
        self.journal = journal
        self.state = state
        self.settings = settings
        self.summary = summary
        self.notify = notify
        self.checkpoint_lines = 0  # journal lines covered by the last checkpoint
        self.restored_from_checkpoint = False  # how the last (re)load went, for tests
        self.replayed_on_open = 0
        self.bulk = False  # inside enqueue: one checkpoint at the end, not one per batch
        self._torn_left: TornTail | None = None  # reported, not cut (read-only)

    def reload(self, *, read_only: bool) -> None:
        """Read the journal afresh (from the checkpoint, when it matches).

        Nothing on disk changes until the journal is known to be whole: a
        torn tail is cut, and a stale checkpoint removed, only after every
        check passed (promise 5: a refused queue is left byte for byte)."""
        self.checkpoint_lines = 0
        found, torn, restored = self._read_journal()
        refuse_if_incomplete(self.journal, self.state, found)
        refuse_if_archive_short(self.folder, self.state)
        if torn is not None:
            if not read_only:  # a read-only queue leaves it for its next writer
                self.journal.cut_torn(torn)
            self._note_torn(torn, read_only=read_only)
        if found.found is Found.STALE:
            checkpoint.remove_stale(self.folder)
        elif found.found is Found.RESTORED and not restored:
            checkpoint.discard(self.folder)  # it matched, yet the records after it disagree
        self.restored_from_checkpoint = restored
        self.checkpoint_lines = found.lines if restored else 0
        self.replayed_on_open = self.journal.lines - self.checkpoint_lines
        self.maybe_checkpoint(read_only=read_only)

    def _read_journal(self) -> tuple[checkpoint.Restore, TornTail | None, bool]:
        """Replay the journal into the state, from the checkpoint when it
        matches, changing nothing on disk. Returns the verdict on the
        checkpoint, the torn tail found (not cut yet), and whether the state
        came from the checkpoint."""
        self.journal.open()
        self.state.reset()
        found = checkpoint.Restore(Found.NONE)
        if self.settings.checkpoint_every > 0:
            found = checkpoint.restore(self.folder, self.journal, self.state)
        torn = self._replay_after_checkpoint() if found.found is Found.RESTORED else False
        if torn is not False:
            return found, torn, True
        # No checkpoint, or the records after it do not follow on from it:
        # trust the journal alone, from its first byte.
        self.journal.open()
        self.state.reset()
        return found, self.journal.replay(self.state.apply, repair=False), False

    def least_on_close(self) -> int:
        """New records that make a checkpoint worth writing when a command ends:
        a few for a small queue, an eighth of the items for a big one (so a
        status poll on a busy 10M-item queue does not rewrite 90 MB each time)."""
        return max(self.settings.checkpoint_on_close, len(self.state.codes) // 8)

    def maybe_checkpoint(self, least: int | None = None, *, read_only: bool) -> None:
        """Save a checkpoint once enough records were applied since the last one.

        By default that is CHECKPOINT_EVERY or an eighth of the item count,
        whichever is larger, so its cost (which grows with the queue) stays a
        small share of the work it saves. Caller holds the lock."""
        every = self.settings.checkpoint_every
        if every <= 0 or read_only or (self.bulk and least is None):
            return
        if least is None:
            least = max(every, len(self.state.codes) // 8)
        if self.journal.lines - self.checkpoint_lines < least:
            return
        # A checkpoint must never cover records that a power cut could still
        # take away (start records and group commits are not fsynced yet).
        self.journal.sync()
        checkpoint.save(self.folder, self.journal, self.state)
        self.checkpoint_lines = self.journal.lines  # not retried at once if it failed
        self.summary.note_checkpoint(self.state)

    def _replay_after_checkpoint(self) -> TornTail | Literal[False] | None:
        """Replay the records after a restored checkpoint, changing nothing on
        disk: the torn tail after them (None if none), or False if they do not
        continue it cleanly (a gap, damage: a full replay tells which)."""
        try:
            return self.journal.replay(self.state.apply, repair=False)
        except CorruptJournal:
            return False

    def catch_up(self, *, read_only: bool) -> None:
        """Apply the records appended since the last read (a torn tail among
        them is cut, unless ``read_only``)."""
        torn = self.journal.replay(self.state.apply, repair=not read_only)
        if torn is not None:
            self._note_torn(torn, read_only=read_only)

    def _note_torn(self, torn: TornTail, *, read_only: bool) -> None:
        """Report a torn tail: cut, or on a read-only queue left in place (said
        once, though every read finds it again)."""
        if read_only:
            if torn == self._torn_left:
                return
            self._torn_left = torn
        self.notify(torn.describe(cut=not read_only))
