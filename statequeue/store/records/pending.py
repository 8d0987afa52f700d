"""The order in which pending items are claimed: lowest id first, each only
once it is due, and never one whose claim a live process still holds.

Fresh items are taken by a cursor over the state codes that only moves forward
(O(1) amortised per claim); items that come back to pending (retries,
recoveries) go through a heap, and retries that must wait through a second
heap ordered by due time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from statequeue.store.records.items import P_CODE, PENDING, LiveItem

if TYPE_CHECKING:  # the state holds this order: a type only, no import at run time
    from statequeue.store.records.state import QueueState

TakeClaim = Callable[[int], "tuple[int, ...] | None"]
"""Holds an item's claim; returns fds to inherit, or None if held elsewhere."""


class PendingOrder:
    """The pending order of one ``QueueState`` (which it reads: codes, items)."""

    def __init__(self, state: QueueState, cursor: int = 1) -> None:
        self.state = state
        self.cursor = cursor
        self.from_cursor = False
        self.heap: list[int] = []
        self.deferred: list[tuple[float, int]] = []

    def push(self, item_id: int, not_before: float) -> None:
        """An item back to pending: due at once, or at ``not_before``."""
        if not_before:
            heapq.heappush(self.deferred, (not_before, item_id))
        else:
            heapq.heappush(self.heap, item_id)

    def push_behind(self, item_id: int) -> None:
        """A new pending item the cursor has passed already."""
        if item_id < self.cursor:
            heapq.heappush(self.heap, item_id)  # behind the cursor: use the heap

    def next_pending(self, now: float) -> LiveItem | None:
        """The pending item with the lowest id (enqueue order) that is due at ``now``."""
        deferred = self.deferred
        while deferred and deferred[0][0] <= now:
            heapq.heappush(self.heap, heapq.heappop(deferred)[1])
        heap = self.heap
        while heap:
            item = self.state.get(heap[0])
            if item is not None and item.state is PENDING and item.not_before <= now:
                break
            heapq.heappop(heap)  # stale entry, or a retry that waits in deferred
        fresh = self._fresh_head()
        if heap and (fresh is None or heap[0] < fresh.id):
            self.from_cursor = False
            return self.state.items[heap[0]]
        self.from_cursor = fresh is not None
        return fresh

    def _fresh_head(self) -> LiveItem | None:
        state = self.state
        codes = state.codes
        limit = len(codes)
        while self.cursor < limit:
            cursor = self.cursor
            if codes[cursor] == P_CODE:
                item = state.items.get(cursor)
                if item is None:
                    return state.materialize(cursor)
                if not item.not_before:
                    return item
            else:
                found = codes.find(P_CODE, cursor + 1)  # skip done items in C
                self.cursor = found if found > 0 else limit
                continue
            self.cursor += 1
        return None

    def pop(self) -> int:
        """Take the head of the pending order out (after ``next_pending`` returned it)."""
        if self.from_cursor:
            self.cursor += 1
            return self.cursor - 1
        return heapq.heappop(self.heap)

    def put_back(self, ids: list[int]) -> None:
        """Put back ids taken out by ``pop`` whose claim a live
        process still holds. They wait among the deferred retries, at their due time
        (0.0: due now): so ``next_due`` still names them, and a runner polls for
        the claim rather than ending with the item pending (issue 21, point 8)."""
        for item_id in ids:
            item = self.state.items.get(item_id)  # next_pending materialized it
            due = item.not_before if item is not None else 0.0
            heapq.heappush(self.deferred, (due, item_id))

    def next_due(self) -> float | None:
        """When the earliest deferred retry becomes due, or None if none waits."""
        deferred = self.deferred
        while deferred:
            item = self.state.items.get(deferred[0][1])
            if item is not None and item.state is PENDING:
                return deferred[0][0]
            heapq.heappop(deferred)
        return None

    def waiting(self, now: float) -> tuple[int, float | None]:
        """How many pending items are not due at ``now`` (a retry's backoff, a
        deferral), and when the earliest of them comes due (``status``). Only
        the deferred heap is read: every such item waits there (``push``)."""
        items = self.state.items
        ids = {
            i
            for _, i in self.deferred
            if (item := items.get(i)) is not None
            and item.state is PENDING
            and item.not_before > now
        }
        if not ids:
            return 0, None
        return len(ids), min(items[i].not_before for i in ids)

    def due_among(self, among: Collection[int]) -> float | None:
        """The earliest due time of the pending items among ``among``."""
        items = self.state.items
        waits = [
            item.not_before
            for i in among
            if (item := items.get(i)) is not None and item.state is PENDING
        ]
        return min(waits) if waits else None

    def first_claimable(
        self, now: float, among: Collection[int] | None, take: TakeClaim
    ) -> tuple[LiveItem, tuple[int, ...]] | None:
        """The first due pending item (of ``among``, if given) whose claim
        ``take`` could hold, with the fds it returned."""
        state = self.state
        if among is not None:
            candidates = sorted(i for i in among if (it := state.get(i)) and is_due(it, now))
            for item_id in candidates:
                fds = take(item_id)
                if fds is not None:
                    return state.get(item_id), fds  # type: ignore[return-value]
            return None
        skipped: list[int] = []
        try:
            while (item := self.next_pending(now)) is not None:
                fds = take(item.id)
                if fds is not None:
                    return item, fds
                # A process from an earlier attempt still holds the claim:
                # leave the item pending until it is gone (promise 4).
                skipped.append(self.pop())
            return None
        finally:
            self.put_back(skipped)

    def export(self) -> dict[str, Any]:
        """The order's part of a checkpoint (see ``QueueState.export``)."""
        return {"cursor": self.cursor, "pending": self.heap, "deferred": self.deferred}

    def restore_export(self, meta: dict[str, Any]) -> None:
        """Become the order ``export`` returned (raises on malformed input)."""
        self.cursor = meta["cursor"]
        self.heap = [int(i) for i in meta["pending"]]
        self.deferred = [(float(t), int(i)) for t, i in meta["deferred"]]


def is_due(item: LiveItem, now: float) -> bool:
    """True for a pending item whose retry need not wait at ``now``."""
    return item.state is PENDING and item.not_before <= now
