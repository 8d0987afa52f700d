"""What a run says while a leftover of an earlier attempt keeps an item from it.

A detached process an earlier run's attempt left behind (a new session, its
environment wiped) keeps that item's claim held by its run's keeper until it
ends: nothing of the item may run twice (promise 4). A later run then waits
for the claim, polling; silent, it looks hung. So it says so, once per item,
with the pids the keeper noted (Store.held_by_leftovers) and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from statequeue.run.events import Notice, RunEvent
from statequeue.store.base import Store

__all__ = ["HeldWait", "waiting_text"]

LOOK_EVERY = 1.0
"""Seconds between looks at the keepers' notes while an item waits."""


def waiting_text(item_id: int, pids: Sequence[int]) -> str:
    """The line a run says once while it waits for ``item_id``'s claim."""
    listed = ", ".join(str(p) for p in pids)
    if len(pids) == 1:
        said = f"pid {listed} of its earlier attempt still runs (kill it, or wait)"
    else:
        said = f"pids {listed} of its earlier attempt still run (kill them, or wait)"
    return f"waiting for item {item_id}: {said}"


class HeldWait:
    """The run's look at items due but not claimable, whose claim is held."""

    def __init__(self, store: Store, on_event: Callable[[RunEvent], None]) -> None:
        self._store = store
        self._on_event = on_event
        self._said: set[int] = set()
        self._look_at = 0.0

    def next_due(self, scope: Collection[int] | None) -> float | None:
        """``Store.next_due``. One already past names an item that was due
        but not claimable just now: its claim is held, perhaps by a leftover
        of an earlier run, which is then said (looked for at most once per
        LOOK_EVERY)."""
        due = self._store.next_due(scope)
        if due is not None and due <= time.time():
            now = time.monotonic()
            if now >= self._look_at:
                self._look_at = now + LOOK_EVERY
                self._say(self._store.held_by_leftovers(scope))
        return due

    def _say(self, held: dict[int, tuple[int, ...]]) -> None:
        for item_id, pids in sorted(held.items()):
            if pids and item_id not in self._said:  # no pid noted yet: the next look
                self._said.add(item_id)
                self._on_event(Notice(waiting_text(item_id, pids)))
