"""The reading methods of ``Queue``: items, results, logs, lookups by text,
histories and events. A base class of ``Queue`` (queue.py), so they are its
methods; the work behind the ones that are more than one store call is in
queue_reading.py."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from statequeue.api import queue_reading as reading
from statequeue.api.shared_store import SharedStore
from statequeue.core.models import ItemState
from statequeue.core.records import Record

if TYPE_CHECKING:  # views are imported where built: enqueue never needs them
    from statequeue.core.views import ItemHistory, ItemResult, ItemView


class QueueReads:
    """What ``Queue`` answers about its items (it sets ``_shared``)."""

    _shared: SharedStore

    def items(self, state: ItemState | str | None = None) -> list[ItemView]:
        """Every item (or those in ``state``, a member or its name such as
        ``"pending"``; UnknownState for another), in id order, archived ones included."""
        return list(self.iter_items(state))

    def iter_items(self, state: ItemState | str | None = None) -> Iterator[ItemView]:
        """``items()`` streamed (for a million items). A running item whose
        runner died (``status`` lists it as interrupted, as of the start of
        the listing) has ``interrupted`` set."""
        wanted = reading.wanted_state(state)
        return reading.stream(self._shared, lambda store: reading.items_marked(store, wanted))

    def results(self, state: ItemState | str | None = None) -> list[ItemResult]:
        """The stored result of every finished item (or those in ``state``:
        done or failed; another state is a UsageError), archived ones included."""
        return list(self.iter_results(state))

    def iter_results(self, state: ItemState | str | None = None) -> Iterator[ItemResult]:
        """``results()`` streamed."""
        wanted = reading.wanted_result_state(state)
        return reading.stream(self._shared, lambda store: store.results(wanted))

    def results_of(self, ids: Collection[int]) -> dict[int, ItemResult]:
        """The stored result of each of ``ids`` that has one now (id -> its
        ``result``; the others are left out): read an item at a time when
        they are few beside the queue (a resumable call), so that its cost
        follows the ids asked for, not the queue's length."""
        with self._shared.using() as store:
            return store.results_of(ids)

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        """The output an attempt logged from byte ``offset`` on (None: none logged)."""
        with self._shared.using() as store:
            return store.read_log(item_id, attempt, offset)

    def live_texts(self, ids: Collection[int]) -> dict[int, str]:
        """The text of each of ``ids`` that names an item not done (others
        are left out): cheap for a few ids, on a queue of any size."""
        with self._shared.using() as store:
            return store.live_texts(ids)

    def find(self, item: str) -> int:
        """The id of the item whose text is exactly ``item``; ItemNotFound if none."""
        return reading.find(self._shared, item)

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        """The id of each of ``texts`` that names an item; the others are left out."""
        with self._shared.using() as store:
            return store.find_ids(texts)

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        """The current state of each of ``ids`` that names an item."""
        with self._shared.using() as store:
            return store.states(ids)

    def result(self, item: str | int) -> ItemResult | None:
        """The stored result of one item, named by its exact text (or its id).

        Returns None while the item has no result (pending, running, held or
        cancelled); raises ItemNotFound when no item has that text."""
        item_id = reading.item_id(self._shared, item)
        with self._shared.using() as store:
            return store.result(item_id)  # an index lookup on every store

    def history(self, item: int | str) -> ItemHistory:
        """Everything recorded about one item, by id or by exact text; ItemNotFound
        if unknown. ``interrupted`` is set on a running item whose runner died."""
        item_id = reading.item_id(self._shared, item)
        with self._shared.using() as store:
            return reading.history_marked(store, item_id)

    def events(self, *, follow: bool = False, poll: float = 0.25) -> Iterator[Record]:
        """The journal's records as dicts, oldest first (``statequeue events
        --json`` prints them with a schema number, and a non-UTF-8 item in
        base64); ``follow`` keeps polling every ``poll`` seconds."""
        for batch in self.event_batches(follow=follow, poll=poll):
            yield from batch

    def event_batches(self, *, follow: bool = False, poll: float = 0.25) -> Iterator[list[Record]]:
        """``events()`` in the batches read at once (an empty batch while following and idle)."""
        return reading.event_batches(self._shared, follow=follow, poll=poll)
