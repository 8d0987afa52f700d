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

An item whose runner died during its ``--verify`` check is no crash: recovery
makes it pending again, whatever the policy. ``retry`` of one then refused it
("it is pending") on both stores, though it had just done what the user
asked: it is reported as recovered instead. It then starts afresh, as any
retried item does (transitions.starts_afresh, its crash count and its mark of
an earlier interruption cleared): it kept both, and `status` still listed it
as interrupted, the next run checking it first.

Every id named is checked before anything changes: `retry 1 999999`
recovered item 1 and only then refused the unknown id. The store's own
``retry`` and ``cancel`` check all their ids at once; the recovery before
them now does too, with the store's rules and words (transitions.py). When
several ids were named, the refusal says that none of them was changed
(`cannot cancel item 1: it is done; nothing was changed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence

from statequeue.core.errors import ItemNotFound, UsageError
from statequeue.core.models import ItemState, OnInterrupted
from statequeue.core.views import RetryReport
from statequeue.store import transitions
from statequeue.store.base import Store

__all__ = ["cancel_items", "retry_items"]


def _to_recover(
    store: Store, ids: Sequence[int], allowed: tuple[ItemState, ...], verb: str
) -> list[int]:
    """The items of ``ids`` still marked running, to recover before the
    user's ``verb``; when there are any, every id is checked first as the
    store checks it (ItemNotFound, UsageError), a running one passing only if
    its runner is gone (``Store.interrupted``): a refusal changes nothing."""
    states = store.states(ids)
    running = [i for i, state in states.items() if state is ItemState.RUNNING]
    if not running:
        return []  # nothing to recover: the store checks and acts at once
    gone = set(store.interrupted())
    for item_id in dict.fromkeys(ids):
        state = states.get(item_id)
        if state is None:
            raise transitions.unknown_item(item_id, store.name)
        if item_id not in gone:
            transitions.check_allowed(verb, item_id, state.value, allowed)
    return running


@contextlib.contextmanager
def _all_or_nothing(ids: Sequence[int]) -> Iterator[None]:
    """A refusal of one of several ids says that the others were not changed
    either: every id is checked before anything changes."""
    try:
        yield
    except (ItemNotFound, UsageError) as exc:
        if len(set(ids)) < 2:
            raise
        raise type(exc)(f"{exc}; nothing was changed") from exc


def _recover(store: Store, running: Sequence[int]) -> list[int]:
    """Recover, as held, the items of ``running`` whose runner is gone;
    those recovered as pending instead (their runner died during the
    ``--verify`` check: no crash, whatever the policy)."""
    if not running:
        return []
    report = store.recover(on_interrupted=OnInterrupted.HOLD, only=frozenset(running))
    return report.retried


def retry_items(
    store: Store, ids: Sequence[int] | None, states: Collection[ItemState]
) -> RetryReport:
    """``store.retry``, after recovering what a dead runner left of ``ids``."""
    if ids is None:
        return RetryReport(put_back=tuple(store.retry(None, states=states)))
    with _all_or_nothing(ids):
        # The states a retry by id takes (cancelled too), as the store checks them.
        allowed = transitions.retry_allowed(ids, ())
        running = _to_recover(store, ids, allowed, "retry") if ids else []
        pending = set(_recover(store, running))
        rest = [i for i in ids if i not in pending]
        put_back = store.retry(rest) if rest else []
    recovered = tuple(i for i in dict.fromkeys(ids) if i in pending)
    for item_id in recovered:
        # Pending again: the user's retry of it starts it afresh, as any.
        # A run that took it meanwhile (it was pending) refuses it: its claim decides.
        with contextlib.suppress(UsageError):
            store.retry([item_id], states=(ItemState.PENDING,))
    return RetryReport(put_back=tuple(put_back), recovered=recovered)


def cancel_items(store: Store, ids: Sequence[int]) -> list[int]:
    """``store.cancel``, after recovering what a dead runner left of ``ids``."""
    with _all_or_nothing(ids):
        if ids:
            _recover(store, _to_recover(store, ids, transitions.CANCELLABLE, "cancel"))
        return store.cancel(ids)
