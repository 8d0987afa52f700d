"""``Queue.retry`` and ``Queue.cancel``, and the items a dead runner left.

After a runner died (kill -9, a crash), ``status`` lists its items as
interrupted: still marked running, their claim free, waiting for the next
run's recovery. ``cancel`` and ``retry`` refused them ("it is running")
while ``status`` said no runner was active. Now the items named are
recovered first -- these alone (the others wait for the next run and its
``--on-interrupted``), as held: the crash is counted and nothing runs --
and then the user's action applies as to any held item: ``cancel``, or
``retry`` (back to pending, a new episode: the crash mark is cleared, so no
``--verify`` or ``--on-interrupted`` decides it again). An item whose runner
lives, or whose lease (PostgreSQL) has not ended, is still refused.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from statequeue.core.models import ItemState, OnInterrupted
from statequeue.store.base import Store

__all__ = ["cancel_items", "retry_items"]


def _recover_named(store: Store, ids: Sequence[int]) -> None:
    """Recover, as held, the items of ``ids`` still marked running whose runner is gone."""
    running = [i for i, state in store.states(ids).items() if state is ItemState.RUNNING]
    if running:
        store.recover(on_interrupted=OnInterrupted.HOLD, only=frozenset(running))


def retry_items(
    store: Store, ids: Sequence[int] | None, states: Collection[ItemState]
) -> list[int]:
    """``store.retry``, after recovering what a dead runner left of ``ids``."""
    if ids:
        _recover_named(store, ids)
    return store.retry(ids, states=states)


def cancel_items(store: Store, ids: Sequence[int]) -> list[int]:
    """``store.cancel``, after recovering what a dead runner left of ``ids``."""
    if ids:
        _recover_named(store, ids)
    return store.cancel(ids)
