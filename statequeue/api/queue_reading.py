"""The read side of ``Queue``: items, results, histories and events, by id or
by exact item text, as the frozen dataclasses the CLI renders."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

from statequeue.core.errors import ItemNotFound, UsageError
from statequeue.core.items import check_item
from statequeue.core.models import ItemState, item_state
from statequeue.core.records import Record
from statequeue.core.textsafe import shown
from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.core.views import ItemHistory, ItemResult, ItemView

_T = TypeVar("_T")
STREAM_BATCH = 1000


class QueueReading:
    """Queue's reading methods (a mixin: Queue provides ``_using`` and ``name``)."""

    name: str

    def _using(self) -> AbstractContextManager[Store]:
        raise NotImplementedError

    def items(self, state: ItemState | str | None = None) -> list[ItemView]:
        """Every item (or those in ``state``, a member or its name such as
        ``"pending"``; UnknownState for another), in id order, archived ones included."""
        return list(self.iter_items(state))

    def iter_items(self, state: ItemState | str | None = None) -> Iterator[ItemView]:
        """``items()`` streamed (for a million items)."""
        wanted = None if state is None else item_state(state)
        return self._stream(lambda store: store.items(wanted))

    def results(self, state: ItemState | str | None = None) -> list[ItemResult]:
        """The stored result of every finished item (or those in ``state``:
        done or failed; another state is a UsageError), archived ones included."""
        return list(self.iter_results(state))

    def iter_results(self, state: ItemState | str | None = None) -> Iterator[ItemResult]:
        """``results()`` streamed."""
        wanted = None if state is None else item_state(state)
        if wanted not in (None, ItemState.DONE, ItemState.FAILED):
            raise UsageError("results exist only for done or failed items")
        return self._stream(lambda store: store.results(wanted))

    def _stream(self, start: Callable[[Store], Iterator[_T]]) -> Iterator[_T]:
        """The values of a store's stream, read under the Queue's lock a batch
        at a time, so that other threads may use the Queue in between (and a
        million items do not pay for a million lock turns)."""
        with self._using() as store:
            stream = start(store)
        while True:
            with self._using():
                batch = list(islice(stream, STREAM_BATCH))
            if not batch:
                return
            yield from batch

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        """The output an attempt logged from byte ``offset`` on (None: none logged)."""
        with self._using() as store:
            return store.read_log(item_id, attempt, offset)

    def find(self, item: str) -> int:
        """The id of the item whose text is exactly ``item``; ItemNotFound if none."""
        check_item(item)
        with self._using() as store:
            found = store.find_ids([item]).get(item)
        if found is None:
            raise ItemNotFound(f"no item {shown(item, 200)!r} in queue {self.name!r}")
        return found

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        """The id of each of ``texts`` that names an item; the others are left out."""
        with self._using() as store:
            return store.find_ids(texts)

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        """The current state of each of ``ids`` that names an item."""
        with self._using() as store:
            return store.states(ids)

    def result(self, item: str | int) -> ItemResult | None:
        """The stored result of one item, named by its exact text (or its id).

        Returns None while the item has no result (pending, running, held or
        cancelled); raises ItemNotFound when no item has that text."""
        item_id = item if isinstance(item, int) else self.find(item)
        with self._using() as store:
            return store.result(item_id)  # an index lookup on every store

    def history(self, item: int | str) -> ItemHistory:
        """Everything recorded about one item, by id or by exact text; ItemNotFound if unknown."""
        item_id = item if isinstance(item, int) else self.find(item)
        with self._using() as store:
            return store.history(item_id)

    def events(self, *, follow: bool = False, poll: float = 0.25) -> Iterator[Record]:
        """The journal's records as dicts, oldest first (``statequeue events
        --json`` prints them with a schema number, and a non-UTF-8 item in
        base64); ``follow`` keeps polling every ``poll`` seconds."""
        for batch in self.event_batches(follow=follow, poll=poll):
            yield from batch

    def event_batches(self, *, follow: bool = False, poll: float = 0.25) -> Iterator[list[Record]]:
        """``events()`` in the batches read at once (an empty batch while following and idle)."""
        cursor: object | None = None
        while True:
            with self._using() as store:
                found, cursor = store.read_events(cursor)
            yield found
            if not follow:
                return
            time.sleep(poll)
