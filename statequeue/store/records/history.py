"""Reading back what was recorded: one item's history, and every result.

These work on plain record streams (the live journal's records and the
archive's), so every record-based store shares them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from statequeue.core.models import ItemState
from statequeue.core.records import Record, enqueue_times, item_text
from statequeue.core.views import ItemHistory, ItemResult
from statequeue.store.records.state import QueueState
from statequeue.store.transitions import starts_episode

_ITEM_RECORDS = frozenset({"enq", "item", "start", "end", "intr", "defer", "set", "arch"})


def item_history(
    item_id: int,
    state: QueueState,
    journal: Iterable[Record],
    archive: Iterable[Record],
    log_paths: tuple[str, ...] = (),
) -> ItemHistory | None:
    """Everything recorded about ``item_id``, or None if it was never enqueued."""
    found = [r for r in archive if r.get("id") == item_id and r.get("t") == "arch"]
    found += [
        r
        for r in enqueue_times(journal, only=item_id)
        if r.get("id") == item_id and r.get("t") in _ITEM_RECORDS
    ]
    # Compaction folds the attempts of an item into its ``item`` or ``arch``
    # record (``tries``): list them again where their own records stood.
    events = [e for r in found for e in (*({**t, "id": item_id} for t in r.get("tries", ())), r)]
    text = next((item_text(r) for r in events if r.get("t") in ("enq", "item", "arch")), None)
    if text is None:
        return None
    current = state.state_of(item_id) or ItemState.DONE
    last = next((_lastresult_from(r) for r in reversed(events) if _lastresult_from(r)), {})
    return ItemHistory(
        item_id=item_id,
        item=text,
        state=current,
        events=tuple(_with_episodes(events)),
        result=last.get("result"),
        stderr_tail=last.get("err", ""),
        log_paths=log_paths,
    )


def iter_results(
    state: QueueState,
    journal: Iterable[Record],
    archive: Iterable[Record],
    wanted: ItemState | None,
) -> Iterator[ItemResult]:
    """The last recorded result of every finished (done or failed) item, in id order
    within the archive and then within the live journal."""
    if wanted in (None, ItemState.DONE):
        for r in archive:
            if r.get("t") == "arch":
                yield result_from(r, item_text(r), ItemState.DONE, archived=True)
    texts: dict[int, str] = {}
    ends: dict[int, Record] = {}
    for r in journal:
        kind = r.get("t")
        if kind in ("enq", "item"):
            texts[r["id"]] = item_text(r)
            if "last" in r:
                ends[r["id"]] = {"id": r["id"], **r["last"]}
        elif kind == "end":
            ends[r["id"]] = r
    for item_id in sorted(ends):
        current = state.state_of(item_id) or ItemState.DONE
        if current not in (ItemState.DONE, ItemState.FAILED):
            continue
        if wanted is None or current is wanted:
            yield result_from(ends[item_id], texts.get(item_id, ""), current, archived=False)


def located_result(rec: Record, state: ItemState, text: Callable[[], str]) -> ItemResult:
    """The ItemResult of the live journal's result record ``rec`` (an ``end``,
    whose item's text ``text`` reads back, or an ``item`` carrying ``last``:
    a result carried over by compaction, or imported)."""
    if rec["t"] == "item":
        return result_from({"id": rec["id"], **rec["last"]}, item_text(rec), state, archived=False)
    return result_from(rec, text(), state, archived=False)


def result_from(r: Record, text: str, state: ItemState, *, archived: bool) -> ItemResult:
    """The ItemResult of result record ``r`` (an ``end``, an ``arch``, or an
    item's ``last`` with its ``id``) of the item whose text is ``text``."""
    return ItemResult(
        item_id=r["id"],
        item=text,
        state=state,
        attempt=r.get("attempt", 0),
        exit_code=r.get("exit"),
        duration=r.get("dur"),
        reason=r.get("reason", ""),
        result=r.get("result"),
        archived=archived,
    )


def _lastresult_from(r: Record) -> Record:
    """The result fields a record carries: an end or archive record, or the
    ``last`` of an item carried over by compaction; else empty."""
    if r.get("t") in ("end", "arch"):
        return r
    last: Record = r.get("last", {}) if r.get("t") == "item" else {}
    return last


def _with_episodes(events: list[Record]) -> Iterator[dict[str, Any]]:
    """The public form of each event, numbered with the episode it belongs to."""
    episode = 1
    for r in events:
        if starts_episode(r):
            episode += 1
        yield {**_public(r), "episode": episode}


def _public(r: Record) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in ("crc", "tries")}
