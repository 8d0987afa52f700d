"""The read side of every record-based store (items, history, results,
exports): what `list`, `show`, `results`, `export` and `stats` ask, answered
from the ``QueueState`` and the records a backend reads back. Kept apart from
record_store.py, which holds the writes (claims, results, recovery)."""

from __future__ import annotations

import heapq
from abc import abstractmethod
from collections.abc import Collection, Container, Iterable, Iterator
from contextlib import AbstractContextManager
from itertools import chain
from typing import TYPE_CHECKING

from statequeue.core.errors import DamagedState
from statequeue.core.exported import ExportedItem
from statequeue.core.models import EnqueueResult, ItemState
from statequeue.core.records import Record
from statequeue.core.views import ItemHistory, ItemResult, ItemView
from statequeue.store import transitions
from statequeue.store.base import Store, attempts_since
from statequeue.store.records.history import item_history, iter_results, located_result
from statequeue.store.records.state import QueueState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from statequeue.stats.attempts import Attempt


FEW_RESULTS = 4
"""``results_of`` reads an item at a time while the ids asked for are at most
a 1/FEW_RESULTS share of the queue's items; past that, one pass over all."""


class RecordReads(Store):
    """Reads over a ``QueueState`` and the records a backend reads back."""

    name: str

    @abstractmethod
    def _locked(self) -> AbstractContextManager[QueueState]:
        """Hold the queue exclusively, with ``state`` brought up to date."""

    @abstractmethod
    def _load_text(self, item_id: int, loc: int) -> str:
        """The text of item ``item_id`` from the record at ``loc``."""

    @abstractmethod
    def _known_keys(self, state: QueueState) -> Container[str]:
        """The dedupe keys of every item, archived ones included."""

    @abstractmethod
    def _import(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        """Apply an import (``transfer.import_items`` with this store's backend)."""

    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        from statequeue.store.records.listing import item_views  # lazy: start-up time

        with self._locked() as st:
            merged = item_views(st, self._journal_records(), state)
        # The archive is in completion order, and an item retried after a
        # compaction can finish with a lower id than archived ones: merge by id.
        yield from heapq.merge(self._archived_views(state), merged, key=lambda v: v.item_id)

    @abstractmethod
    def _journal_records(self) -> Iterable[Record]:
        """Every record of the live journal, in order (taken under the lock; the
        iteration may run after it, on the same snapshot)."""

    def _archive_records(self) -> Iterator[Record]:
        """Every archived record; none for stores without an archive."""
        return iter(())

    def _log_paths(self, item_id: int) -> tuple[str, ...]:
        return ()

    def history(self, item_id: int) -> ItemHistory:
        with self._locked() as state:
            found = item_history(
                item_id,
                state,
                self._journal_records(),
                self._archive_records(),
                self._log_paths(item_id),
            )
        if found is None:
            raise transitions.unknown_item(item_id, self.name)
        return found

    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        with self._locked() as st:
            journal = self._journal_records()
        yield from iter_results(st, journal, self._archive_records(), state)

    def result(self, item_id: int) -> ItemResult | None:
        """From the record the state locates (``QueueState.result_loc``) and
        the item's own (its text), or the archive's: a few records read."""
        with self._locked() as state:
            current = state.state_of(item_id)
            if current is None:
                raise transitions.unknown_item(item_id, self.name)
            return self._located(state, item_id, current)

    def results_of(self, ids: Collection[int]) -> dict[int, ItemResult]:
        """Read an item at a time, as ``result`` does, unless the ids are
        more than a share of the queue's items (``FEW_RESULTS``): then one
        pass over every result is cheaper. A resumable call on a queue of
        done items read every result back before (O(N) per call)."""
        wanted = set(ids)
        if not wanted:
            return {}
        with self._locked() as state:
            if len(wanted) * FEW_RESULTS > state.next_id - 1:
                journal = self._journal_records()  # one pass, after the lock (as ``results``)
            else:
                found: dict[int, ItemResult] = {}
                for item_id in wanted:
                    current = state.state_of(item_id)
                    if current is not None and (r := self._located(state, item_id, current)):
                        found[item_id] = r
                return found
        every = iter_results(state, journal, self._archive_records(), None)
        return {r.item_id: r for r in every if r.item_id in wanted}

    def _located(self, state: QueueState, item_id: int, current: ItemState) -> ItemResult | None:
        """The result of known item ``item_id``, now in state ``current``
        (caller holds the lock): a few records read."""
        if current not in (ItemState.DONE, ItemState.FAILED):
            return None
        loc = state.result_loc(item_id)
        if loc < 0:
            # Failed items stay in the journal: only a done one is archived.
            return self._archived_result(item_id) if current is ItemState.DONE else None
        rec = self._record_at(loc)
        if rec.get("id") != item_id or rec.get("t") not in ("end", "item"):
            raise DamagedState(f"queue {self.name!r}: no result of item {item_id} at {loc}")
        return located_result(rec, current, lambda: self._load_text(item_id, state.locs[item_id]))

    def _record_at(self, loc: int) -> Record:
        """The live journal's record at locator ``loc`` (caller holds the lock)."""
        raise NotImplementedError

    def _archived_result(self, item_id: int) -> ItemResult | None:
        """The result of done item ``item_id`` from the archive (caller holds
        the lock); None when it is not there (no store archive here)."""
        return None

    def export_items(self) -> Iterator[ExportedItem]:
        from statequeue.store.records import transfer  # lazy: start-up time (not on enqueue)

        with self._locked() as state:
            # Taken whole under the lock: one consistent moment of the queue.
            found = list(
                transfer.export_items(state, self._journal_records(), self._archive_records())
            )
        yield from found

    def import_items(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        return self._import(entries)

    def live_texts(self, ids: Collection[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        with self._locked() as state:
            for item_id in ids:
                item = state.get(item_id)  # its text: one record read back
                if item is not None:
                    found[item_id] = item.text
        return found

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        with self._locked() as state:
            # The dedupe keys (text -> id), archived items included.
            get = getattr(self._known_keys(state), "get", None)
            if get is None:
                return super().find_ids(texts)
            found = {t: get(t) for t in texts}
        return {t: i for t, i in found.items() if isinstance(i, int)}

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        with self._locked() as state:
            found = {i: state.state_of(i) for i in ids}
        return {i: s for i, s in found.items() if s is not None}

    def _archived_views(self, state: ItemState | None) -> Iterator[ItemView]:
        """Items moved out by compaction (always done); none for stores without an archive."""
        return iter(())

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        from statequeue.stats.attempts import attempts_of  # lazy: start-up time (stats only)

        with self._locked():
            journal = self._journal_records()
        archived = attempts_of(self._archive_records())
        return attempts_since(chain(archived, attempts_of(journal)), since)
