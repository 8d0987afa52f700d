"""What `stats` names things by: items by their text, runners by host, start
time and command, instead of bare ids and hex.

The figures (stats/figures.py) keep ids, as the stats cache does; the names
are looked up here for the few the text shows: each item's text, whatever
its state, by a few lookups, each runner's from its ``run`` record.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequeue.core.errors import ItemNotFound
from statequeue.core.models import ItemState

if TYPE_CHECKING:
    from statequeue.stats.figures import Stats

__all__ = ["RunnerName", "StatsNames", "stats_names"]

SHOWN = 20  # as stats_view.SHOWN_GROUPS


@dataclass(frozen=True)
class RunnerName:
    host: str
    started_at: float | None
    command: tuple[str, ...]


@dataclass
class StatsNames:
    items: dict[int, str] = field(default_factory=dict)
    runners: dict[str, RunnerName] = field(default_factory=dict)


def stats_names(queue: Any, s: Stats) -> StatsNames:
    """The text of the items ``s`` shows, and what is known of its runners."""
    names = StatsNames()
    ids = {x.item_id for x in s.slowest} | {g.example_id for g in s.reasons[:SHOWN]}
    names.items = _item_texts(queue, ids)
    wanted = {g.name for g in s.runners[:SHOWN] if g.name}
    if wanted:
        names.runners = _runner_names(queue, wanted)
    return names


def _item_texts(queue: Any, ids: set[int]) -> dict[int, str]:
    """The text of each of ``ids``, whatever its state, by a few lookups each
    (never a pass over the queue): an item not done by ``live_texts``, a done
    one by its result, and one the first two miss (PostgreSQL keeps a
    cancelled item's text apart from both) by its history."""
    texts: dict[int, str] = queue.live_texts(ids) if ids else {}
    for item_id in sorted(ids - texts.keys()):
        with contextlib.suppress(ItemNotFound):
            found = queue.result(item_id)
            if found is not None:
                texts[item_id] = found.item
    left = ids - texts.keys()
    for item_id, state in (queue.states(left) if left else {}).items():
        if state is ItemState.CANCELLED:  # an index lookup on PostgreSQL
            texts[item_id] = queue.history(item_id).item
    return texts


def _runner_names(queue: Any, wanted: set[str]) -> dict[str, RunnerName]:
    """From the ``run`` records, read until each wanted runner's is found (a
    runner whose record compaction dropped stays unnamed)."""
    found: dict[str, RunnerName] = {}
    for batch in queue.event_batches():
        for rec in batch:
            runner = rec.get("runner")
            if rec.get("t") == "run" and runner in wanted and runner not in found:
                since = rec.get("since")
                found[runner] = RunnerName(
                    host=str(rec.get("host") or ""),
                    started_at=float(since) if isinstance(since, int | float) else None,
                    command=tuple(str(a) for a in rec.get("cmd") or ()),
                )
        if len(found) == len(wanted):
            break
    return found
