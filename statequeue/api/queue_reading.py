"""The read side of ``Queue`` that is more than one store call: streams read
a batch at a time, lookups by exact item text, followed events, and `stats`.
Each helper takes the queue's ``SharedStore``; ``Queue`` calls them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

from statequeue.api.shared_store import SharedStore
from statequeue.core.errors import ItemNotFound, UsageError
from statequeue.core.items import check_item
from statequeue.core.models import ItemState, item_state
from statequeue.core.records import Record
from statequeue.core.textsafe import shown
from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.core.views import ItemHistory, ItemView
    from statequeue.stats.figures import Stats

_T = TypeVar("_T")
STREAM_BATCH = 1000


def stream(shared: SharedStore, start: Callable[[Store], Iterator[_T]]) -> Iterator[_T]:
    """The values of a store's stream, read under the Queue's lock a batch
    at a time, so that other threads may use the Queue in between (and a
    million items do not pay for a million lock turns)."""
    with shared.using() as store:
        found = start(store)
    while True:
        with shared.using():
            batch = list(islice(found, STREAM_BATCH))
        if not batch:
            return
        yield from batch


def items_marked(store: Store, wanted: ItemState | None) -> Iterator[ItemView]:
    """``store.items(wanted)``, each running item that ``status`` lists as
    interrupted (its runner died) or as held by a dead runner's processes
    marked so (``ItemView.interrupted``, ``ItemView.held_by_dead_runner``)."""
    running = ItemState.RUNNING
    found = store.items(wanted)
    if wanted not in (None, running):
        return found
    dead, held = set(store.interrupted()), set(store.held_by_dead_runner())
    if not dead and not held:
        return found
    return (
        replace(v, interrupted=v.item_id in dead, held_by_dead_runner=v.item_id in held)
        if v.state is running
        else v
        for v in found
    )


def history_marked(store: Store, item_id: int) -> ItemHistory:
    """``store.history(item_id)``, marked ``interrupted`` or
    ``held_by_dead_runner`` when the item is running and ``status`` lists it so."""
    found = store.history(item_id)
    if found.state is not ItemState.RUNNING:
        return found
    if item_id in store.interrupted():
        return replace(found, interrupted=True)
    if item_id in store.held_by_dead_runner():
        return replace(found, held_by_dead_runner=True)
    return found


def wanted_state(state: ItemState | str | None) -> ItemState | None:
    """``state`` (a member or its name) as an ItemState; UnknownState for another."""
    return None if state is None else item_state(state)


def wanted_result_state(state: ItemState | str | None) -> ItemState | None:
    """``wanted_state``, for results: done, failed or None (a UsageError otherwise)."""
    wanted = wanted_state(state)
    if wanted not in (None, ItemState.DONE, ItemState.FAILED):
        raise UsageError("results exist only for done or failed items")
    return wanted


def find(shared: SharedStore, item: str) -> int:
    """The id of the item whose text is exactly ``item``; ItemNotFound if none."""
    check_item(item)
    with shared.using() as store:
        found = store.find_ids([item]).get(item)
    if found is None:
        raise ItemNotFound(f"no item {shown(item, 200)!r} in queue {shared.name!r}")
    return found


def item_id(shared: SharedStore, item: str | int) -> int:
    """The id of ``item``, given by its id or its exact text."""
    if isinstance(item, bool):  # an int to Python: result(True) read item 1
        raise UsageError(f"an item is its text (str) or its id (int), not bool ({item!r})")
    return item if isinstance(item, int) else find(shared, item)


def item_ids(ids: Iterable[object]) -> list[int]:
    """``ids`` (of ``retry``, ``cancel``), each an id (int); UsageError naming
    the first that is not: a bool or a float is not taken as an id, and a
    text gets a hint rather than a TypeError from deep in the store."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise UsageError(f"ids must be a list of item ids (int), not {type(ids).__name__}")
    checked: list[int] = []
    for n, one in enumerate(ids):
        if isinstance(one, str):
            raise UsageError(f"ids[{n}] is a text ({shown(one, 60)!r}): pass queue.find(text)")
        if not isinstance(one, int) or isinstance(one, bool):
            raise UsageError(f"ids[{n}] must be an item id (int), not {type(one).__name__}")
        checked.append(one)
    return checked


def event_batches(shared: SharedStore, *, follow: bool, poll: float) -> Iterator[list[Record]]:
    """The journal's records in the batches read at once (an empty batch
    while following and idle); ``follow`` keeps polling every ``poll`` seconds."""
    cursor: object | None = None
    while True:
        with shared.using() as store:
            found, cursor = store.read_events(cursor)
        yield found
        if not follow:
            return
        time.sleep(poll)


def queue_stats(shared: SharedStore, since: float | None, now: float | None) -> Stats:
    """``Queue.stats``: from the store's summary where it keeps one (and no
    ``since`` is asked), else folded from every finished attempt; with the
    deferrals the store records."""
    # lazy: start-up time (the figures' modules; only `stats` needs them)
    from statequeue.stats.figures import StatsBuilder

    now = time.time() if now is None else now
    cutoff = None if since is None else now - since
    with shared.using() as store:
        deferred = store.deferrals(cutoff)
        builder = store.stats_summary() if since is None else None
        if builder is not None:  # cached up to a position
            builder.now = now
        else:
            builder = StatsBuilder(now=now, since=since)
            builder.add_all(store.iter_attempt_batches(cutoff))
        # The counts after the attempts, never before: an item a runner
        # finishes in between is then among the counts too, so the done
        # items' durations never outnumber the done items (one output, one story).
        status = store.status()
        found = builder.build(queue=status.queue, counts=status.counts, held=status.held)
    active = bool(status.runners)
    return replace(found, deferred=deferred, runner_active=active, paused=status.paused)
