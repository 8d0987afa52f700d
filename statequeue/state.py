"""The queue's state in memory, rebuilt by applying journal records in order.

Done items keep only their text (for dedupe); their results stay on disk.
Everything that changes state is a record: ``apply`` is the one place that
knows what each record type means, so replay and live updates cannot differ.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from statequeue.models import ItemState
from statequeue.records import Record, item_text

RATE_WINDOW_ITEMS = 2000
PENDING = ItemState.PENDING
RUNNING = ItemState.RUNNING
DONE = ItemState.DONE
FAILED = ItemState.FAILED
CANCELLED = ItemState.CANCELLED
HELD = ItemState.HELD


class LiveItem:
    """An item that is not done yet (done items are kept only as dedupe keys)."""

    __slots__ = (
        "attempts",
        "crashes",
        "id",
        "interrupted",
        "last_seq",
        "not_before",
        "reason",
        "runner",
        "state",
        "text",
    )

    def __init__(self, item_id: int, text: str) -> None:
        self.id = item_id
        self.text = text
        self.state = PENDING
        self.attempts = 0
        self.crashes = 0
        self.runner = ""
        self.reason = ""
        self.last_seq = 0
        self.interrupted = False  # its last attempt died with its runner
        self.not_before = 0.0  # wall-clock time before which a retry must wait


class QueueState:
    """Counts, live items, the pending order and the dedupe keys of one queue."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: a snapshot record or a reload starts afresh."""
        self.next_id = 1
        self.archived = 0
        self.archive_size = 0
        self.watermark = 0
        # Dedupe keys (text -> id) are built only when something is enqueued
        # (see the stores' _known_keys); status and run never pay for them.
        self.keys: dict[str, int] | None = None
        self.items: dict[int, LiveItem] = {}
        # Ids of items in the states that are usually few, so that recovery,
        # status and listings never scan the (possibly huge) pending set.
        self.ids_in: dict[ItemState, set[int]] = {
            s: set() for s in (RUNNING, FAILED, HELD, CANCELLED)
        }
        self.counts: dict[ItemState, int] = dict.fromkeys(ItemState, 0)
        self.runners: dict[str, dict[str, Any]] = {}
        self.paused = False
        self.orphans = 0
        self.recent_ends: deque[float] = deque(maxlen=RATE_WINDOW_ITEMS)
        self.commands: list[list[str]] = []
        # Pending order: fresh items are taken by a cursor that only moves
        # forward (O(1) amortised per claim); items that come back to pending
        # (retries, recoveries) go through a heap.
        self._cursor = 1
        self._from_cursor = False
        self._pending: list[int] = []
        self._deferred: list[tuple[float, int]] = []

    # -- queries -------------------------------------------------------------

    def next_pending(self, now: float) -> LiveItem | None:
        """The pending item with the lowest id (enqueue order) that is due at ``now``."""
        deferred = self._deferred
        while deferred and deferred[0][0] <= now:
            heapq.heappush(self._pending, heapq.heappop(deferred)[1])
        heap = self._pending
        while heap:
            item = self.items.get(heap[0])
            if item is not None and item.state is PENDING and item.not_before <= now:
                break
            heapq.heappop(heap)  # stale entry, or a retry that waits in _deferred
        fresh = self._fresh_head()
        if heap and (fresh is None or heap[0] < fresh.id):
            self._from_cursor = False
            return self.items[heap[0]]
        self._from_cursor = fresh is not None
        return fresh

    def _fresh_head(self) -> LiveItem | None:
        items = self.items
        while self._cursor < self.next_id:
            item = items.get(self._cursor)
            if item is not None and item.state is PENDING and not item.not_before:
                return item
            self._cursor += 1
        return None

    def is_due(self, item: LiveItem, now: float) -> bool:
        return item.state is PENDING and item.not_before <= now

    def pop_pending(self) -> int:
        """Take the head of the pending order out (after ``next_pending`` returned it)."""
        if self._from_cursor:
            self._cursor += 1
            return self._cursor - 1
        return heapq.heappop(self._pending)

    def restore_pending(self, ids: list[int]) -> None:
        """Put back ids taken out by ``pop_pending``."""
        for item_id in ids:
            heapq.heappush(self._pending, item_id)

    def next_due(self) -> float | None:
        """When the earliest deferred retry becomes due, or None if none waits."""
        deferred = self._deferred
        while deferred:
            item = self.items.get(deferred[0][1])
            if item is not None and item.state is PENDING:
                return deferred[0][0]
            heapq.heappop(deferred)
        return None

    def running(self) -> list[LiveItem]:
        return self.in_state(RUNNING)

    def in_state(self, state: ItemState) -> list[LiveItem]:
        ids = self.ids_in.get(state)
        if ids is None:  # pending: the one state that may hold millions
            return [i for i in self.items.values() if i.state is state]
        return [self.items[i] for i in sorted(ids)]

    # -- replay --------------------------------------------------------------

    def apply(self, rec: Record) -> None:
        """Apply one record. Unknown record types are ignored (newer writers).

        A record about an item this state has never seen (possible only in a
        journal salvaged by ``fsck --repair``) is counted in ``orphans``.
        """
        handler = _HANDLERS.get(rec.get("t", ""))
        if handler is not None:
            try:
                handler(self, rec)
            except KeyError:
                self.orphans += 1

    def _move(self, item: LiveItem, state: ItemState) -> None:
        self.counts[item.state] -= 1
        self.counts[state] += 1
        if item.state in self.ids_in:
            self.ids_in[item.state].discard(item.id)
        if state in self.ids_in:
            self.ids_in[state].add(item.id)
        item.state = state
        if state is PENDING:
            if item.not_before:
                heapq.heappush(self._deferred, (item.not_before, item.id))
            else:
                heapq.heappush(self._pending, item.id)
        elif state is DONE:
            del self.items[item.id]

    def _add(self, item_id: int, text: str, state: ItemState) -> LiveItem:
        item = LiveItem(item_id, text)
        if self.keys is not None:
            self.keys[text] = item_id
        if item_id >= self.next_id:
            self.next_id = item_id + 1
        self.counts[state] += 1
        item.state = state
        if state is DONE:
            return item
        self.items[item_id] = item
        if state in self.ids_in:
            self.ids_in[state].add(item_id)
        if state is PENDING and item_id < self._cursor:
            heapq.heappush(self._pending, item_id)  # behind the cursor: use the heap
        return item

    def _on_snap(self, rec: Record) -> None:
        self.reset()
        self.next_id = rec["next_id"]
        self.archived = rec["archived"]
        self.archive_size = rec["archive_size"]
        self.watermark = rec["watermark"]
        self.counts[DONE] = self.archived
        self._cursor = self.next_id
        self.commands = rec.get("commands", [])
        self.paused = rec.get("paused", False)

    def _on_enq(self, rec: Record) -> None:
        self._add(rec["id"], item_text(rec), PENDING)

    def _on_item(self, rec: Record) -> None:
        item = self._add(rec["id"], item_text(rec), ItemState(rec["state"]))
        item.attempts = rec.get("attempts", 0)
        item.crashes = rec.get("crashes", 0)
        item.runner = rec.get("runner", "")
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = rec.get("interrupted", False)
        item.not_before = rec.get("retry_at", 0.0)
        if item.state is PENDING and item.not_before:
            heapq.heappush(self._deferred, (item.not_before, item.id))

    def _on_start(self, rec: Record) -> None:
        item = self.items[rec["id"]]
        item.attempts = rec["attempt"]
        item.runner = rec["runner"]
        item.not_before = 0.0
        self._move(item, RUNNING)

    def _on_end(self, rec: Record) -> None:
        item = self.items[rec["id"]]
        if "at" in rec:
            self.recent_ends.append(rec["at"])
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = False
        item.not_before = rec.get("retry_at", 0.0)
        self._move(item, ItemState(rec["state"]))

    def _on_intr(self, rec: Record) -> None:
        item = self.items[rec["id"]]
        item.crashes = rec.get("crashes", item.crashes)
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = rec.get("crashed", False)
        self._move(item, ItemState(rec["state"]))

    def _on_set(self, rec: Record) -> None:
        # cancel / retry / hold issued by a user: a plain state change.
        item = self.items[rec["id"]]
        item.last_seq = rec["seq"]
        if rec["state"] == PENDING.value:
            item.crashes = 0
        self._move(item, ItemState(rec["state"]))

    def _on_run(self, rec: Record) -> None:
        self.runners[rec["runner"]] = rec
        cmd = rec.get("cmd")
        if cmd and (not self.commands or self.commands[-1] != cmd):
            self.commands.append(cmd)

    def _on_stop(self, rec: Record) -> None:
        self.runners.pop(rec["runner"], None)

    def _on_pause(self, rec: Record) -> None:
        self.paused = rec["paused"]

    def rate(self, now: float, window: float = 60.0) -> float | None:
        """Items finished per second over the last ``window`` seconds, if any."""
        ends = self.recent_ends
        recent = [t for t in ends if now - t <= window]
        if len(recent) < 2:
            return None
        span = max(now - recent[0], 1e-3)
        return len(recent) / span


_HANDLERS = {
    "snap": QueueState._on_snap,
    "enq": QueueState._on_enq,
    "item": QueueState._on_item,
    "start": QueueState._on_start,
    "end": QueueState._on_end,
    "intr": QueueState._on_intr,
    "set": QueueState._on_set,
    "run": QueueState._on_run,
    "stop": QueueState._on_stop,
    "pause": QueueState._on_pause,
}
