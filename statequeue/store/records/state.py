"""The queue's state in memory, rebuilt by applying journal records in order.

It is compact so that a million-item queue opens in little memory: one state
byte and two record locators per item id (its text's and its last result's),
and a ``LiveItem`` object only for items that have details (started, failed,
held, cancelled, retried). A fresh pending item's text stays on disk until it
is claimed: the store's loader reads it back by locator. Done items keep
nothing but their state byte and locators.

Everything that changes state is a record: ``apply`` is the one place that
knows what each record type means, so replay and live updates cannot differ.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from statequeue.core.exported import MAX_ID_GAP, out_of_reach
from statequeue.core.models import ItemState
from statequeue.core.recent_rate import (
    FIRST_BATCH,
    MIN_SPAN,
    MIN_SPAN_MANY,
    began_of,
    recent_rate,
)
from statequeue.core.records import OutOfReach, Record, item_text
from statequeue.core.views import Starts, starts_of
from statequeue.store.records.items import (
    CANCELLED,
    D_CODE,
    DONE,
    FAILED,
    HELD,
    P_CODE,
    PENDING,
    RUNNING,
    STATE_OF,
    no_text_loader,
)

# Re-exported: the stores, compaction, fsck and the PostgreSQL reads take them from here.
from statequeue.store.records.items import CODE as CODE
from statequeue.store.records.items import LiveItem as LiveItem
from statequeue.store.records.items import TextLoader as TextLoader
from statequeue.store.records.items import id_runs as id_runs
from statequeue.store.records.pending import PendingOrder
from statequeue.store.records.state_export import export_state, restore_state
from statequeue.store.transitions import last_line, starts_afresh, starts_episode

RATE_WINDOW_ITEMS = 2000
# The fields of an ``item`` record that make a pending item more than its state byte.
_DETAILS = ("attempts", "crashes", "runner", "reason", "interrupted", "retry_at", "failures")


class QueueState:
    """Counts, live items, the pending order and the dedupe keys of one queue."""

    def __init__(self, loader: TextLoader = no_text_loader) -> None:
        self.loader = loader
        self.reset()

    def reset(self) -> None:
        """Forget everything: a snapshot record or a reload starts afresh."""
        self.next_id = 1
        self.archived = 0
        self.archive_size = 0
        self.watermark = 0
        # Seq of the last record the compaction that wrote the snapshot header
        # put after it (0: no header applied, or one that does not say).
        self.snap_end = 0
        # Dedupe keys (text -> id) are built only when something is enqueued
        # (see the stores' _known_keys); status and run never pay for them.
        self.keys: dict[str, int] | None = None
        # Bulk-enqueued (first id, texts) not yet in ``keys``: merged when the
        # keys are next asked for, so a one-shot enqueue never pays for it.
        self._unmerged: list[tuple[int, list[str]]] = []
        # Per item id: its state's code, and the locator of the record that
        # holds its text (what the store's loader reads back).
        self.codes = bytearray(1)
        self.locs = array("q", [-1])
        # Per item id: the locator of the record that holds its last result
        # (an ``end``, or an ``item`` carrying ``last``), -1 if none in this
        # journal (none yet, or archived): ``result`` reads one record.
        self.ends = array("q", [-1])
        # Items with details; a fresh pending item gets one only when used.
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
        self.recent_starts: deque[float] = deque(maxlen=RATE_WINDOW_ITEMS)  # status: all runners'
        self.commands: list[list[str]] = []
        self.commanded: set[str] = set()  # live runners whose command is in ``commands``
        # Which pending item a claim takes next (see pending.py).
        self.order = PendingOrder(self)

    # -- queries -------------------------------------------------------------

    def get(self, item_id: int) -> LiveItem | None:
        """The live (not done) item ``item_id``, or None if it is done or unknown."""
        item = self.items.get(item_id)
        if item is not None:
            return item
        if 0 < item_id < len(self.codes) and self.codes[item_id] == P_CODE:
            return self.materialize(item_id)
        return None

    def result_loc(self, item_id: int) -> int:
        """The locator of the record holding the item's last result in this
        journal, or -1 (none recorded, or moved to the archive)."""
        return self.ends[item_id] if 0 < item_id < len(self.ends) else -1

    def state_of(self, item_id: int) -> ItemState | None:
        """The item's state (done for archived items), or None if unknown."""
        if 0 < item_id < len(self.codes):
            return STATE_OF[self.codes[item_id]]
        return None

    def live_count(self) -> int:
        """How many items are not done."""
        counts = self.counts  # every state is a key (fromkeys): no generator per call
        return sum(counts.values()) - counts[DONE]

    def live_ids(self) -> Iterator[int]:
        """Ids of the items that are not done, in id order."""
        mask = self.codes.translate(_LIVE_MASK)
        found = mask.find(1)
        while found >= 0:
            yield found
            found = mask.find(1, found + 1)

    def materialize(self, item_id: int, text: str | None = None) -> LiveItem:
        """The ``LiveItem`` of pending item ``item_id``, made now (it had none)."""
        item = LiveItem(item_id, self.locs[item_id], self.loader, text)
        self.items[item_id] = item
        return item

    def running(self) -> list[LiveItem]:
        return self.in_state(RUNNING)

    def in_state(self, state: ItemState) -> list[LiveItem]:
        """Items in ``state`` (not pending: the one state that may hold millions)."""
        return [self.items[i] for i in sorted(self.ids_in[state])]

    # -- replay --------------------------------------------------------------

    def apply(self, rec: Record, loc: int = -1) -> None:
        """Apply one record; ``loc`` locates it for the store's text loader.
        Unknown record types are ignored (newer writers).

        A record about an item this state has never seen (possible only in a
        journal salvaged by ``fsck --repair``) is counted in ``orphans``.
        """
        handler = _HANDLERS.get(rec.get("t", ""))
        if handler is not None:
            try:
                handler(self, rec, loc)
            except KeyError:
                self.orphans += 1

    def _item(self, item_id: int) -> LiveItem:
        """The live item a record is about (KeyError if none)."""
        item = self.get(item_id)
        if item is None:
            raise KeyError(item_id)
        return item

    def _move(self, item: LiveItem, state: ItemState) -> None:
        self.counts[item.state] -= 1
        self.counts[state] += 1
        if item.state in self.ids_in:
            self.ids_in[item.state].discard(item.id)
        if state in self.ids_in:
            self.ids_in[state].add(item.id)
        item.state = state
        self.codes[item.id] = CODE[state]
        if state is PENDING:
            self.order.push(item.id, item.not_before)
        elif state is DONE:
            del self.items[item.id]

    def _add(self, item_id: int, loc: int, state: ItemState) -> None:
        codes = self.codes
        if item_id == len(codes):  # the usual case: the next new id
            codes.append(CODE[state])
            self.locs.append(loc)
            self.ends.append(-1)
        else:
            if out_of_reach(item_id, len(codes)):
                # Refused before anything grows: the journal reports the line as damage.
                raise OutOfReach(
                    f"item id {item_id!r} is not one replay can hold "
                    f"(more than {MAX_ID_GAP} past the ids before it)"
                )
            if item_id > len(codes):
                grow = item_id + 1 - len(codes)
                codes.extend(bytes(grow))
                self.locs.extend(array("q", [-1]) * grow)
                self.ends.extend(array("q", [-1]) * grow)
            elif codes[item_id]:
                # Known already: one of the ids a snapshot counts done until its
                # ``item`` record comes, or a repeat in a salvaged journal.
                self.counts[STATE_OF[codes[item_id]]] -= 1  # type: ignore[index]
                self.items.pop(item_id, None)
                for ids in self.ids_in.values():
                    ids.discard(item_id)
            codes[item_id] = CODE[state]
            self.locs[item_id] = loc
            self.ends[item_id] = -1
        if item_id >= self.next_id:
            self.next_id = item_id + 1
        self.counts[state] += 1
        if state is PENDING:
            self.order.push_behind(item_id)

    def _on_snap(self, rec: Record, loc: int) -> None:
        self.reset()
        self.next_id = rec["next_id"]
        self.archived = rec["archived"]
        self.archive_size = rec["archive_size"]
        self.watermark = rec["watermark"]
        # Every id below next_id is done unless an ``item`` record follows.
        self.codes = bytearray([D_CODE]) * self.next_id
        self.codes[0] = 0
        self.locs = array("q", [-1]) * self.next_id
        self.ends = array("q", [-1]) * self.next_id
        self.counts[DONE] = self.next_id - 1
        for first, last in rec.get("absent", ()):
            self._forget_ids(first, last)
        # A journal that ends before the records written after this header
        # was cut, not torn: the store refuses it (promise 5).
        self.snap_end = rec["seq"] + rec.get("follow", 0)
        # The cursor, not the heap, finds the snapshot's pending items (the
        # cursor skips done codes in C): the heap would cost ~36 bytes each.
        self.order.cursor = min(self.watermark + 1, self.next_id)
        self.commands = rec.get("commands", [])
        self.paused = rec.get("paused", False)
        # The recent finishes and starts the snapshot folded (compaction.py).
        self.recent_ends.extend(rec.get("recent_ends", ()))
        self.recent_starts.extend(rec.get("recent_starts", ()))

    def _forget_ids(self, first: int, last: int) -> None:
        """Ids ``first``..``last`` that no surviving record names (a salvaged
        queue lost them): neither done nor listed, and never handed out again."""
        first, last = max(first, 1), min(last, self.next_id - 1)
        if first > last:
            return
        gone = self.codes[first : last + 1].count(D_CODE)
        self.codes[first : last + 1] = bytes(last + 1 - first)
        self.counts[DONE] -= gone

    def absent_ids(self) -> list[list[int]]:
        """Ranges [first, last] of the ids below ``next_id`` that name no item."""
        return id_runs(self.codes[: self.next_id].translate(_ABSENT_MASK), 1)

    def _on_enq(self, rec: Record, loc: int) -> None:
        self._add(rec["id"], loc, PENDING)
        if self.keys is not None:
            self.keys[item_text(rec)] = rec["id"]

    def apply_enqueued(self, first_id: int, locs: list[int], texts: list[str]) -> None:
        """Apply ``enq`` records for new ids ``first_id``, ``first_id + 1``, ...
        (at ``locs``) in one step: what ``_on_enq`` does for each, in bulk."""
        n = len(texts)
        if first_id != len(self.codes) or first_id < self.order.cursor:
            for i, (loc, text) in enumerate(zip(locs, texts, strict=True)):
                self._on_enq({"id": first_id + i, "item": text}, loc)
            return
        self.codes.extend(bytes([P_CODE]) * n)
        self.locs.extend(array("q", locs))
        self.ends.extend(array("q", [-1]) * n)
        self.counts[PENDING] += n
        self.next_id = max(self.next_id, first_id + n)
        if self.keys is not None:
            self._unmerged.append((first_id, texts))

    def enqueued_texts(self) -> list[str] | None:
        """Every item's text in id order, when the keys are empty and the bulk
        enqueues not yet merged hold every id from 1 (a new queue filled by
        this process); else None."""
        if self.keys is None or self.keys:
            return None
        texts: list[str] = []
        for first_id, chunk in self._unmerged:
            if first_id != len(texts) + 1:
                return None
            texts += chunk
        return texts if len(texts) == self.next_id - 1 else None

    def merged_keys(self) -> dict[str, int] | None:
        """The dedupe keys (None until built), with every bulk enqueue merged in."""
        if self.keys is not None:
            for first_id, texts in self._unmerged:
                self.keys.update(zip(texts, range(first_id, first_id + len(texts)), strict=True))
        self._unmerged.clear()
        return self.keys

    def _on_item(self, rec: Record, loc: int) -> None:
        item_id = rec["id"]
        state = ItemState(rec["state"])
        self._add(item_id, loc, state)
        if "last" in rec:
            self.ends[item_id] = loc  # carried over by compaction, or imported
        if self.keys is not None:
            self.keys[item_text(rec)] = item_id
        if state is DONE:
            return  # an imported finished item: done items keep only their state byte
        if state is PENDING and not any(rec.get(k) for k in (*_DETAILS, "deferrals")):
            return  # a fresh pending item: nothing beyond its state byte
        item = self.materialize(item_id, item_text(rec))
        item.state = state
        item.attempts = rec.get("attempts", 0)
        item.crashes = rec.get("crashes", 0)
        item.failures = rec.get("failures", 0)  # absent before episodes: a fresh start
        item.deferrals = rec.get("deferrals", 0)
        item.runner = rec.get("runner", "")
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = rec.get("interrupted", False)
        item.checking = rec.get("checking", False)
        item.not_before = rec.get("retry_at", 0.0)
        item.last_err = last_line(rec.get("last", {}).get("err", ""))
        if state in self.ids_in:
            self.ids_in[state].add(item_id)
        if state is PENDING and item.not_before:
            self.order.push(item.id, item.not_before)

    def _on_start(self, rec: Record, loc: int) -> None:
        item = self._item(rec["id"])
        item.attempts = rec["attempt"]
        item.runner = rec["runner"]
        item.started = rec.get("at", 0.0)
        item.not_before = 0.0
        item.checking = False
        self._move(item, RUNNING)
        self.recent_starts.append(rec.get("at", 0.0))
        if rec["runner"] not in self.commanded:
            self._note_command(rec["runner"])

    def _on_end(self, rec: Record, loc: int) -> None:
        item = self._item(rec["id"])
        self.ends[item.id] = loc
        if "at" in rec:
            self.recent_ends.append(rec["at"])
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = False
        # Status shows it for recent failures (none when this attempt wrote none).
        item.last_err = last_line(rec["err"]) if "err" in rec else ""
        item.not_before = rec.get("retry_at", 0.0)
        if not rec.get("ok"):
            item.failures += 1
        self._move(item, ItemState(rec["state"]))

    def _on_check(self, rec: Record, loc: int) -> None:
        # A --verify check of the running attempt begins (or is over: ``checked``).
        item = self._item(rec["id"])
        if item.state is RUNNING and item.attempts == rec.get("attempt"):
            item.checking = rec["t"] == "check"

    def _on_defer(self, rec: Record, loc: int) -> None:
        # Asked to be tried later: pending again once its delay is over; not
        # a failure (the episode's count stays), not a crash.
        item = self._item(rec["id"])
        item.deferrals = rec.get("deferrals", item.deferrals + 1)
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = False
        item.not_before = rec.get("retry_at", 0.0)
        self._move(item, ItemState(rec["state"]))

    def _on_intr(self, rec: Record, loc: int) -> None:
        item = self._item(rec["id"])
        item.crashes = rec.get("crashes", item.crashes)
        item.attempts = rec.get("attempts", item.attempts)  # an attempt that never began
        item.reason = rec.get("reason", "")
        item.last_seq = rec["seq"]
        item.interrupted = rec.get("crashed", False)
        if starts_episode(rec):
            item.failures = item.deferrals = 0
        self._move(item, ItemState(rec["state"]))

    def _on_set(self, rec: Record, loc: int) -> None:
        # cancel / retry / hold issued by a user: a plain state change, and
        # the item's reason from now on (the last thing that happened to it,
        # as PostgreSQL's row says).
        item = self._item(rec["id"])
        item.last_seq = rec["seq"]
        item.reason = rec.get("reason", "")
        if starts_afresh(rec):
            item.crashes = 0
            item.interrupted = False
            item.not_before = 0.0
        if starts_episode(rec):
            item.failures = item.deferrals = 0
        self._move(item, ItemState(rec["state"]))

    def _on_run(self, rec: Record, loc: int) -> None:
        self.runners[rec["runner"]] = rec

    def _note_command(self, runner: str) -> None:
        # A runner's command counts as run once it starts an attempt: a run
        # that found nothing to do does not become "the last command" (the
        # warning of run/checks.py: ``command_drift``).
        self.commanded.add(runner)
        cmd = self.runners.get(runner, {}).get("cmd")
        if cmd and (not self.commands or self.commands[-1] != cmd):
            self.commands.append(cmd)

    def _on_stop(self, rec: Record, loc: int) -> None:
        self.runners.pop(rec["runner"], None)
        self.commanded.discard(rec["runner"])

    def _on_pause(self, rec: Record, loc: int) -> None:
        self.paused = rec["paused"]

    # -- checkpoints ---------------------------------------------------------

    def export(self) -> tuple[dict[str, Any], bytes, bytes]:
        """Everything needed to rebuild this state without replay (state_export.py)."""
        return export_state(self)

    def restore(
        self, meta: dict[str, Any], codes: bytes | memoryview, locs: bytes | memoryview
    ) -> None:
        """Become the state ``export`` returned (raises on malformed input)."""
        restore_state(self, meta, codes, locs)

    def rate(self, now: float, window: float = 60.0) -> float | None:
        """Items finished per second over the last ``window`` seconds, since
        the work they count began (``core.recent_rate``); None for no finish
        in the window. Only the times both deques still hold count: past
        ``RATE_WINDOW_ITEMS`` in the window, the window starts at the oldest kept."""
        since = now - window
        truncated = False
        for times in (self.recent_ends, self.recent_starts):
            if len(times) == times.maxlen and min(times) > since:
                since, truncated = min(times), True
        ends = [t for t in self.recent_ends if t >= since]
        if not ends:
            return None
        began = began_of(self.recent_starts, min(ends), since)
        # Thousands of finishes kept, all in the window: no batch that
        # finished together, so the span may be well under a second.
        many = truncated and len(ends) >= RATE_WINDOW_ITEMS // 2
        return recent_rate(len(ends), began, now, window, MIN_SPAN_MANY if many else MIN_SPAN)

    def starts(self, now: float, window: float) -> Starts | None:
        """The starts of the last ``window`` seconds (``Status.starts``)."""
        recent = [t for t in self.recent_starts if now - t <= window]
        if not recent:
            return None
        first = min(recent)
        # Only the last RATE_WINDOW_ITEMS are kept: all of them in the window
        # are thousands of starts over a span that may be short, and the
        # first kept is no run's first batch (it only marks a time).
        if len(recent) == self.recent_starts.maxlen:
            return starts_of(len(recent), first, max(recent), now, 1, MIN_SPAN_MANY)
        at_first = sum(1 for t in recent if t <= first + FIRST_BATCH)
        return starts_of(len(recent), first, max(recent), now, at_first)


# Maps a state code to 1 for a live (not done) item, else 0.
_LIVE_MASK = bytes(0 if code in (0, D_CODE) else 1 for code in range(256))
# Maps the code of "no such item" to 1, every other code to 0.
_ABSENT_MASK = bytes(1 if code == 0 else 0 for code in range(256))


_HANDLERS: dict[str, Callable[[QueueState, Record, int], None]] = {
    "snap": QueueState._on_snap,
    "enq": QueueState._on_enq,
    "item": QueueState._on_item,
    "start": QueueState._on_start,
    "end": QueueState._on_end,
    "intr": QueueState._on_intr,
    "check": QueueState._on_check,
    "checked": QueueState._on_check,
    "defer": QueueState._on_defer,
    "set": QueueState._on_set,
    "run": QueueState._on_run,
    "stop": QueueState._on_stop,
    "pause": QueueState._on_pause,
}
