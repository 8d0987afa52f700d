"""What the parts of a record-based store need of the store that holds them.

``RecordStore`` hands its runner registry, its recovery and its user actions
a ``RecordBackend``: the few operations each backend (journal, memory)
provides, under public names, so that none of them reaches into the store.
"""

from __future__ import annotations

import time
from collections.abc import Container
from contextlib import AbstractContextManager
from typing import Protocol

from statequeue.core.records import Record
from statequeue.store.records.state import LiveItem, QueueState


class RecordBackend(Protocol):
    """The store's persistence and liveness, as its parts use them."""

    @property
    def name(self) -> str:
        """The queue's name (for messages)."""
        ...

    def locked(self) -> AbstractContextManager[QueueState]:
        """Hold the queue exclusively, with the state brought up to date."""
        ...

    def write(self, batch: list[Record], *, sync: bool) -> None:
        """Persist ``batch`` (fsync when ``sync``) and apply it to the state."""
        ...

    def claim_free(self, item: LiveItem) -> bool:
        """True when no live process holds ``item``'s claim."""
        ...

    def runner_alive(self, runner_id: str) -> bool:
        """True when the runner is alive (or this process is it)."""
        ...

    def forget_runner(self, runner_id: str) -> None:
        """Release whatever a dead runner left behind."""
        ...

    def known_keys(self, state: QueueState) -> Container[str]:
        """Every item text ever enqueued (the dedupe keys)."""
        ...


def record_time() -> float:
    """A record's time, for people reading `events` (never for ordering: seq does that)."""
    return round(time.time(), 3)
