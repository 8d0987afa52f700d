"""``Queue.retry`` and ``Queue.cancel``, and the items a dead runner left.

After a runner died (kill -9, a crash), ``status`` lists its items as
interrupted: still marked running, their claim free, waiting for the next
run's recovery. ``cancel`` and ``retry`` refused them ("it is running")
while ``status`` said no runner was active. Now an item of theirs that is
still marked running is recovered first -- as the next run would, by the
default policy (pending, its crash counted; held as poison after three) --
and then cancelled, or (retry) counted as back to pending. An item whose
runner lives, or whose lease (PostgreSQL) has not ended, is still refused.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from statequeue.core.models import ItemState
from statequeue.store.base import Store

__all__ = ["cancel_items", "retry_items"]


def _recover_interrupted(store: Store, ids: Sequence[int]) -> set[int]:
    """Recover the items of ``ids`` still marked running whose runner is
    gone; returns those now pending."""
    running = {i for i, state in store.states(ids).items() if state is ItemState.RUNNING}
    if not running:
        return set()
    return set(store.recover().retried) & running


def retry_items(
    store: Store, ids: Sequence[int] | None, states: Collection[ItemState]
) -> list[int]:
    """``store.retry``, after recovering what a dead runner left of ``ids``."""
    if not ids:
        return store.retry(ids, states=states)
    back = _recover_interrupted(store, ids)
    rest = [i for i in ids if i not in back]
    changed = set(store.retry(rest, states=states)) if rest else set()
    return [i for i in dict.fromkeys(ids) if i in back or i in changed]


def cancel_items(store: Store, ids: Sequence[int]) -> list[int]:
    """``store.cancel``, after recovering what a dead runner left of ``ids``."""
    if ids:
        _recover_interrupted(store, ids)
    return store.cancel(ids)
