"""The journal store's dedupe keys: every item text ever enqueued, archived
ones included, so that `enqueue` adds only what is new.

Building them the slow way decodes every record of the journal and the
archive, so they come from the caches when those match: a small enqueue
probes the keys index (``key_index``: a binary search per item), a big one
loads it whole (one dict, C-speed membership), and either scans only the
journal records after it. When building them was costly, or a new queue was
just filled, a fresh index is saved for the next enqueue (a cron job
re-enqueueing everything), and a compaction carries it over (``stage``).
The index a new queue's filling leaves has no sorted table (the sort was
most of that enqueue's cost): a big enqueue loads its texts all the same,
and the first small one sorts the index's own items into its table, writes
it whole and probes it.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from contextlib import suppress
from typing import TYPE_CHECKING

from statequeue.core.records import item_text
from statequeue.store.journal import checkpoint, key_index
from statequeue.store.journal.archive_file import read_archive
from statequeue.store.journal.integrity import ARCHIVE
from statequeue.store.journal.journal_file import JournalFile, iter_records, scan_item_texts
from statequeue.store.records.state import QueueState

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.journal.settings import JournalSettings

KEYS_CACHE_AFTER = 20_000  # records read to build the dedupe keys that make caching them pay
# An enqueue of at most this many items probes the keys index (a binary search
# each) instead of loading every key: cheaper while it is a small share of the
# queue; a bigger one loads them all (one dict, C-speed membership).
FEW_ITEMS = 2_000


class DedupeKeys:
    """The dedupe keys of the queue whose ``journal`` and ``state`` the store
    holds; every method is called under the queue lock."""

    def __init__(
        self,
        folder: QueueFolder,
        journal: JournalFile,
        state: QueueState,
        settings: JournalSettings,
    ) -> None:
        self.folder = folder
        self.journal = journal
        self.state = state
        self.settings = settings
        self.archived: dict[str, int] | None = None  # the archive's keys, once loaded
        self.index: IndexedKeys | None = None  # the keys index probed by a small enqueue
        self.few = False  # this enqueue is small enough to probe the index
        self.may_write = True  # the store may write files (a read-only one never sorts for one)
        self.from_cache = False  # for tests
        self._save = False  # the dedupe keys were costly to build: cache them
        self._were_empty = False  # this enqueue started on a queue with no items
        self._complete = False  # the index has no table: write it whole, to be probed

    @property
    def worth_saving(self) -> bool:
        """Whether ``save`` would write a keys index now."""
        return self._save or self._were_empty

    def prepare(self, state: QueueState) -> None:
        """Put the keys the caches hold into ``state`` (the store then builds
        any it still lacks from the journal) and load the archive's."""
        cached = state.keys is None and self.archived is None and self.settings.caches
        if cached and not (self.few and self._probe_index(state)):
            self._load_cached_keys(state)
        if state.keys is None:
            # Built the slow way below (every record decoded): worth caching
            # for the next enqueue (a cron job re-enqueueing everything).
            self._save = self.journal.lines + state.archived >= KEYS_CACHE_AFTER
            self._were_empty = state.next_id == 1
        if self.archived is None:
            # Dedupe must hold for items compaction moved out: load their keys
            # once, only when something is enqueued.
            self.archived = {
                item_text(r): r["id"]
                for r in read_archive(self.folder, ARCHIVE, state.archive_size)
            }

    def joined(self, live: Container[str]) -> Container[str]:
        """The journal's keys ``live`` (after ``prepare``) with the archive's or the index's."""
        if self.index is not None:
            return _Either(live, self.index)
        return _Either(live, self.archived) if self.archived else live

    def _probe_index(self, state: QueueState) -> bool:
        """Take the dedupe keys as the keys index (probed, not loaded) plus
        the journal records after it; False if there is no matching index."""
        index = key_index.open_index(self.folder, self.journal)
        if index is None:
            return False
        if not index.has_table:
            if self.may_write:
                index = self._with_table(index)
            else:  # a read-only store: it could not keep the table it sorted
                index.close()
                index = None
            if index is None:  # loaded instead (by the caller), then written whole
                self._complete = True
                return False
        tail = scan_item_texts(self.journal.fd, index.covers, self.journal.offset)
        if tail is None:
            index.close()
            return False
        state.keys = dict(tail)
        self.index = IndexedKeys(index, self._keys_the_slow_way)
        self.archived = {}  # the index holds them
        self.from_cache = True
        # A long tail is scanned by every enqueue: worth a fresh index.
        self._save = len(tail) >= KEYS_CACHE_AFTER
        return True

    def _with_table(self, index: key_index.KeyIndex) -> key_index.KeyIndex | None:
        """``index`` (without a table) written whole and opened again, or None."""
        try:
            written = key_index.with_table(self.folder, index)
        except key_index.IndexDamaged:
            written = False
        finally:
            index.close()
        return key_index.open_index(self.folder, self.journal) if written else None

    def _keys_the_slow_way(self) -> dict[str, int]:
        """Every item text (text -> id), from every record of the journal and
        the archive (the keys index failed a checksum meanwhile)."""
        key_index.discard(self.folder)
        self._save = True
        keys = {
            item_text(r): r["id"]
            for r in read_archive(self.folder, ARCHIVE, self.state.archive_size)
        }
        journal = self.journal
        for r in iter_records(journal.fd, journal.offset, path=str(journal.path)):
            if r.get("t") in ("enq", "item"):
                keys[item_text(r)] = r["id"]
        return keys

    def forget(self) -> None:
        """Drop what is loaded (the journal was read afresh, or the store closes)."""
        self.archived = None
        if self.index is not None:
            self.index.close()
            self.index = None

    def _load_cached_keys(self, state: QueueState) -> None:
        """Dedupe keys from keys.ckpt (archived items included) plus the journal
        records after it, if it still matches the journal."""
        found = self._cached_keys()
        if found is None:
            return
        state.keys, tail = found
        self.from_cache = True
        self.archived = {}  # the cache holds them
        self._save = tail >= KEYS_CACHE_AFTER or self._complete
        self._complete = False

    def _cached_keys(self) -> tuple[dict[str, int], int] | None:
        """Every item text (text -> id) from keys.ckpt plus the records after
        it, and how many came from those records; None if it does not match."""
        cached = key_index.load_keys(self.folder, self.journal)
        if cached is None:
            return None
        keys, offset = cached
        tail = scan_item_texts(self.journal.fd, offset, self.journal.offset)
        if tail is None:
            return None
        keys.update(tail)
        return keys, len(tail)

    def save(self, *, read_only: bool) -> None:
        """Save keys.ckpt when building the keys was costly, or when this
        process filled a new queue with many items (so the first re-enqueue
        is fast too; the texts are at hand in id order). Caller holds the lock."""
        state = self.state
        fresh = state.enqueued_texts() if self._were_empty else None
        self._were_empty = False
        if not self.settings.caches or self.archived is None or read_only:
            return
        texts: list[str] | None = None
        table = True
        if fresh is not None and len(fresh) >= KEYS_CACHE_AFTER:
            # Without the sorted table: a re-enqueue of them all never reads
            # it, and the first small enqueue writes the index whole.
            texts, table = fresh, False
        elif self._save and self.index is not None and self.index.index is not None:
            # The index plus a long tail: merged into a fresh one, no sort of all.
            self._save = False
            self.journal.sync()  # as for the state checkpoint
            with suppress(key_index.IndexDamaged):
                self._extend_index(self.index.index, self.journal, None)
            return
        elif self._save:
            texts = self._texts_in_memory(state)
        if texts is None:
            return
        self._save = False
        self.journal.sync()  # as for the state checkpoint
        key_index.save(self.folder, self.journal, texts, table=table)

    def _texts_in_memory(self, state: QueueState) -> list[str] | None:
        """Every item text in id order from the dedupe keys this process holds
        (journal and archive), or None if it has not loaded them."""
        keys = state.merged_keys()
        if keys is None or self.archived is None:
            return None
        if self.index is not None:
            return self.index.texts_with(keys, state.next_id)
        every = {**self.archived, **keys} if self.archived else keys
        return checkpoint.texts_by_id(every, state.next_id)

    def stage(self, new: JournalFile, staged: str) -> None:
        """Write the keys index of ``new`` (a compacted journal naming the
        same items as this store's journal up to its read position) to
        ``staged``, if the keys are known without reading the journal and the
        archive (in memory, or an index that still matches, extended by the
        records after it): the dedupe cache survives compaction instead of
        being rebuilt by the next enqueue."""
        if not self.settings.caches:
            return
        texts = self._texts_in_memory(self.state)
        if texts is not None:
            key_index.save(self.folder, new, texts, staged=staged)
            return
        index = key_index.open_index(self.folder, self.journal)
        if index is None:
            return
        try:
            self._extend_index(index, new, staged)
        except key_index.IndexDamaged:
            key_index.discard(self.folder)
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
        saved = key_index.save_extended(self.folder, journal, index, keys, next_id, staged=staged)
        if saved is None:
            texts = _overlay(index.texts(), keys, next_id)
            key_index.save(self.folder, journal, texts, staged=staged)


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


class IndexedKeys:
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
