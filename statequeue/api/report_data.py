"""``Queue.report``: the HTML report's data, gathered from any store.

The attempt-derived figures come from one streaming pass over the store's
attempt batches (``stats/report_fold``); this adds what only the store knows:
the counts now, the commands run, the live runners, and the texts of the few
items the report names (failure examples, slowest, most retried,
interrupted), looked up by id through the store's indexed ``result`` where the
item has one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Sequence
from dataclasses import replace

from statequeue.api.shared_store import SharedStore
from statequeue.core.command_text import command_text
from statequeue.core.errors import ItemNotFound
from statequeue.core.models import ItemState
from statequeue.stats.report_fold import ReportFold
from statequeue.stats.report_model import AttemptFigures, ItemRow, Report
from statequeue.store.base import Store

HISTORY_LOOKUPS = 5
"""Items without a result (pending, held...) whose text is read from their
history, at most: on a journal a history is a scan of the queue."""
TEXT_WIDTH = 300
"""The report shows at most this many characters of an item's text, the
last of them "…" when it is cut."""
IN_FLIGHT_LOOKUPS = 20
"""Items in flight when their runner died whose attempt (start, runner) is
read from their history, at most (the rest are counted)."""


def gather_report(shared: SharedStore, since: float | None, now: float | None = None) -> Report:
    """The report of the queue ``shared`` holds, over attempts that ended in
    the last ``since`` seconds (all of them when None)."""
    now = time.time() if now is None else now
    cutoff = None if since is None else now - since
    fold = ReportFold(cutoff=cutoff, now=now)
    with shared.using() as store:
        status = store.status()
        commands = tuple(command_text(c) for c in store.commands())
        deferred = store.deferrals(cutoff)
        _add_in_flight(store, fold, status.interrupted, status.held_by_dead_runner)
        fold.add_all(store.iter_attempt_batches(cutoff))
    figures = fold.build()
    with shared.using() as store:
        figures = _with_texts(store, figures)
    hosts = sorted({h for _, h, _ in figures.runners if h} | {r.host for r in status.runners})
    return Report(
        queue=status.queue,
        store=store_kind(store),
        now=now,
        since=since,
        counts=dict(status.counts),
        commands=commands,
        active_runners=len(status.runners),
        figures=figures,
        hosts=tuple(hosts),
        deferred=deferred,
    )


def store_kind(store: Store) -> str:
    """ "postgres", "journal" or "memory": what the report's header names."""
    if store.url is not None:
        return "postgres"
    return "journal" if store.journal_folder() is not None else "memory"


def _add_in_flight(
    store: Store, fold: ReportFold, interrupted: Sequence[int], held: Sequence[int]
) -> None:
    """The attempts in flight when their runner died, not recovered yet (the
    items `status` lists as interrupted, and those it lists as still run by
    processes of a dead runner, ``held``): each one's start and runner from
    its history, and the runner's host from its registration."""
    ids = sorted({*interrupted, *held})
    found = [
        _started(store, item_id) if n < IN_FLIGHT_LOOKUPS else None for n, item_id in enumerate(ids)
    ]
    hosts = store.runner_hosts({s[1] for s in found if s is not None and s[1]})
    for item_id, start in zip(ids, found, strict=True):
        attempt, runner, started = start or (0, "", None)
        host = hosts.get(runner, "")
        fold.add_in_flight(item_id, attempt, runner, started, host, held=item_id in held)


def _started(store: Store, item_id: int) -> tuple[int, str, float | None] | None:
    """The latest attempt, runner and start time of ``item_id`` (its last
    ``start`` record); None when it has none, or was dropped meanwhile."""
    found = None
    with contextlib.suppress(ItemNotFound):
        for e in store.history(item_id).events:
            if e.get("t") == "start":
                at = e.get("at")
                started = float(at) if isinstance(at, int | float) else None
                found = int(e.get("attempt", 0)), str(e.get("runner") or ""), started
    return found


def _with_texts(store: Store, figures: AttemptFigures) -> AttemptFigures:
    f = figures
    wanted = {i for g in f.failures for i in g.example_ids}
    rows_with_items = (f.slowest, f.most_retried, f.interrupted, f.in_flight)
    wanted |= {r.item_id for rows in rows_with_items for r in rows}
    texts, states = _texts(store, wanted)

    def filled(rows: tuple[ItemRow, ...], with_state: bool) -> tuple[ItemRow, ...]:
        return tuple(
            replace(
                r,
                text=texts.get(r.item_id, ""),
                state=states.get(r.item_id, "") if with_state else r.state,
            )
            for r in rows
        )

    failures = tuple(
        replace(g, examples=tuple(texts.get(i, f"#{i}") for i in g.example_ids)) for g in f.failures
    )
    return replace(
        f,
        failures=failures,
        slowest=filled(f.slowest, False),
        most_retried=filled(f.most_retried, True),
        interrupted=filled(f.interrupted, True),
        # Still running; "orphaned" (as `list` says) stays: the state now would hide it.
        in_flight=tuple(
            r if r.state == "orphaned" else replace(r, state=states.get(r.item_id, ""))
            for r in filled(f.in_flight, False)
        ),
    )


def _texts(store: Store, ids: Collection[int]) -> tuple[dict[int, str], dict[int, str]]:
    """The text and state now of each of ``ids`` (missing when unknown)."""
    states = store.states(ids) if ids else {}
    # Items not done (pending again after `retry --failed`, held, cancelled)
    # in one look: only the first five of them had their text, the rest were
    # shown as `#15`, which reads as another item when texts are numbers.
    live = [i for i, state in states.items() if state is not ItemState.DONE]
    texts: dict[int, str] = {
        i: cut(text) for i, text in (store.live_texts(live) if live else {}).items()
    }
    lookups = HISTORY_LOOKUPS
    for item_id in sorted(ids):
        state = states.get(item_id)
        if item_id in texts:
            continue
        try:
            if state in (ItemState.DONE, ItemState.FAILED):
                found = store.result(item_id)
                if found is not None:
                    texts[item_id] = cut(found.item)
                    continue
            if lookups > 0 and state is not None:
                lookups -= 1
                texts[item_id] = cut(store.history(item_id).item)
        except ItemNotFound:  # dropped meanwhile (a running queue): shown by id
            continue
    return texts, {i: s.value for i, s in states.items()}


def cut(text: str) -> str:
    """``text`` as the report shows it: at most ``TEXT_WIDTH`` characters,
    the last one "…" when some were left out (a cut text looked whole)."""
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 1] + "…"
