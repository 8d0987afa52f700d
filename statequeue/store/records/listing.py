"""The views a record-based store lists from its replayed state: every item
of the live journal (``list``) and the queue's status."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from statequeue.core.models import ItemState
from statequeue.core.records import Record, item_text
from statequeue.core.views import STARTS_WINDOW, ActiveRunner, Failure, ItemView, Status
from statequeue.store.records.items import PENDING
from statequeue.store.records.state import QueueState

RECENT_FAILURES = 5


def item_views(
    state: QueueState, journal: Iterable[Record], wanted: ItemState | None
) -> list[ItemView]:
    """The items of the live journal (in ``wanted`` state, if given), by id."""
    merged: list[ItemView] = []
    started: dict[int, int] = {}  # a done item's attempts: from its last start
    unkept: set[int] = set()  # ids the state keeps no item of (done): their attempts from `started`
    for r in journal:
        kind = r.get("t")
        if kind == "start":
            started[r["id"]] = r["attempt"]
        if kind not in ("enq", "item"):
            continue
        item_id = r["id"]
        current = state.state_of(item_id) or ItemState.DONE
        if wanted is not None and current is not wanted:
            continue
        live = state.items.get(item_id)
        attempts, reason = (live.attempts, live.reason) if live else (0, "")
        if live is None:
            unkept.add(item_id)
        merged.append(ItemView(item_id, item_text(r), current, attempts, reason))
        if kind == "item":
            started[item_id] = r.get("attempts", 0)
    # An item the state keeps says its own count, 0 included (an attempt given
    # back uncounted restores it: its start record no longer counts).
    merged = [
        replace(v, attempts=started.get(v.item_id, 0)) if v.item_id in unkept else v for v in merged
    ]
    merged.sort(key=lambda v: v.item_id)
    return merged


def status_view(
    name: str, state: QueueState, runners: list[ActiveRunner], interrupted: Iterable[int]
) -> Status:
    """The queue's status: ``runners`` alive, ``interrupted`` the running
    items whose claim no live process holds."""
    failed = sorted(state.in_state(ItemState.FAILED), key=lambda i: -i.last_seq)
    now = time.time()
    waiting, next_due = state.order.waiting(now)
    return Status(
        queue=name,
        counts={s.value: n for s, n in state.counts.items()},
        runners=tuple(runners),
        recent_failures=tuple(
            Failure(i.id, i.text, i.attempts, i.reason, i.last_err)
            for i in failed[:RECENT_FAILURES]
        ),
        held=tuple(sorted(i.id for i in state.in_state(ItemState.HELD))),
        interrupted=tuple(sorted(interrupted)),
        interrupted_pending=tuple(
            sorted(i.id for i in state.items.values() if i.interrupted and i.state is PENDING)
        ),
        paused=state.paused,
        rate=state.rate(now),
        starts=state.starts(now, STARTS_WINDOW),
        deferred=sum(1 for i in state.items.values() if i.deferrals and i.state is PENDING),
        waiting=waiting,
        next_due=next_due,
    )
