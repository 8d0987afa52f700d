"""Export and import for the record-based stores (journal and memory).

Export reads the archive and the live journal once and folds each item's
records into an ``ExportedItem``; its current state comes from the replayed
``QueueState``. Import writes one ``item`` record per item (the record a
compaction's snapshot uses for an unfinished item, here for any state,
marked ``imported`` with the time of the import, so that `show` says where
it came from), so that an item arrives whole in one record or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from statequeue.core.exported import (
    ARCHIVED_KEYS,
    RESULT_KEYS,
    ExportedItem,
    history_record,
    out_of_reach,
)
from statequeue.core.models import EnqueueResult, ItemState
from statequeue.core.records import Record, item_fields, item_text
from statequeue.store.records.backend import RecordBackend, record_time
from statequeue.store.records.state import QueueState

IMPORT_BATCH = 1_000
INTERRUPTED_REASON = "interrupted: it was running when the queue was exported"


@dataclass
class _Found:
    """What the records say about one item, gathered in one pass."""

    text: str
    archived: bool = False
    attempts: int = 0
    history: list[Record] = field(default_factory=list)


def export_items(
    state: QueueState, journal: Iterable[Record], archive: Iterable[Record]
) -> Iterator[ExportedItem]:
    """Every item of the queue, in id order, archived ones included."""
    found: dict[int, _Found] = {}
    for r in archive:
        if r.get("t") == "arch":
            found[r["id"]] = _archived(r)
    for r in journal:
        _gather(found, r)
    for item_id in sorted(found):
        yield _exported(state, item_id, found[item_id])


def _archived(r: Record) -> _Found:
    """An archived item: its attempts' summaries and its last result in full,
    with its runner and host (`stats` and `report` name them after an import)."""
    last = {k: r[k] for k in ARCHIVED_KEYS if k in r}
    history = [history_record(t) for t in r.get("tries", ())]
    final = {"t": "end", **last, "state": ItemState.DONE.value, "ok": True}
    _with_last(history, final)
    return _Found(item_text(r), archived=True, attempts=r.get("attempt", 0), history=history)


def _gather(found: dict[int, _Found], r: Record) -> None:
    kind = r.get("t")
    if kind == "enq":
        found[r["id"]] = _Found(item_text(r))
    elif kind == "item":
        entry = found[r["id"]] = _Found(item_text(r), attempts=r.get("attempts", 0))
        entry.history = [history_record(t) for t in r.get("tries", ())]
        if "last" in r:
            _with_last(entry.history, {"t": "end", **r["last"]})
    elif kind in ("start", "end", "intr", "defer", "set") and r.get("id") in found:
        entry = found[r["id"]]
        if kind == "start":
            entry.attempts = r["attempt"]
        else:
            entry.history.append(history_record(r))


def _with_last(history: list[Record], last: Record) -> None:
    """Put a result kept in full (``last``) over the summary of the same
    attempt (compaction keeps only the newest result whole), or add it."""
    for i in range(len(history) - 1, -1, -1):
        if history[i].get("t") == "end":
            if history[i].get("attempt") == last.get("attempt"):
                history[i] = {**history[i], **last}
                return
            break
    history.append(last)


def _exported(state: QueueState, item_id: int, f: _Found) -> ExportedItem:
    for r in f.history:
        if r.get("t") == "end" and "ok" not in r:
            r["ok"] = r.get("state") == ItemState.DONE.value  # a summary: done means ok
    current = state.state_of(item_id) or ItemState.DONE
    live = state.get(item_id)
    if live is None or current is ItemState.DONE:
        return ExportedItem(
            item_id,
            f.text,
            ItemState.DONE,
            f.attempts,
            archived=f.archived,
            history=tuple(f.history),
        )
    running = current is ItemState.RUNNING
    return ExportedItem(
        item_id=item_id,
        item=f.text,
        state=ItemState.PENDING if running else current,
        attempts=live.attempts,
        crashes=live.crashes,
        failures=live.failures,
        deferrals=live.deferrals,
        reason=INTERRUPTED_REASON if running else live.reason,
        retry_at=live.not_before or None,
        interrupted=running or live.interrupted,
        history=tuple(f.history),
    )


def item_record(entry: ExportedItem, item_id: int, at: float) -> Record:
    """The one record that imports ``entry`` as item ``item_id`` at time
    ``at``: an ``item`` record with its state, counters, last result and
    outcome history."""
    rec: Record = {"t": "item", "id": item_id, **item_fields(entry.item)}
    rec.update(state=entry.state.value, attempts=entry.attempts, crashes=entry.crashes)
    rec["imported"] = at  # `show`: not carried over by a compaction
    details = {
        "failures": entry.failures,
        "deferrals": entry.deferrals,
        "reason": entry.reason,
        "retry_at": entry.retry_at,
        "interrupted": entry.interrupted,
    }
    rec.update((k, v) for k, v in details.items() if v)
    results = entry.results
    if results:
        rec["last"] = {k: results[-1][k] for k in RESULT_KEYS if k in results[-1]}
    if entry.history:
        # ``show`` lists these where the item's own records would stand, and
        # compaction carries them on into the archive.
        rec["tries"] = list(entry.history)
    return rec


def import_items(backend: RecordBackend, entries: Sequence[ExportedItem]) -> EnqueueResult:
    """Add the entries whose text the queue does not have yet, in batches of
    ``IMPORT_BATCH`` items, each one durable append under the lock."""
    added = 0
    seen: set[str] = set()
    for start in range(0, len(entries), IMPORT_BATCH):
        with backend.locked() as state:
            keys = backend.known_keys(state)
            next_id = state.next_id
            batch: list[Record] = []
            at = record_time()
            for entry in entries[start : start + IMPORT_BATCH]:
                if entry.item in keys or entry.item in seen:
                    continue
                seen.add(entry.item)
                # Its own id when free (always, into an empty queue), unless
                # items skipped as already here leave it out of replay's reach.
                if not out_of_reach(entry.item_id, next_id):
                    next_id = max(entry.item_id, next_id)
                batch.append(item_record(entry, next_id, at))
                next_id += 1
            # One durable append per batch; a crash keeps whole records only.
            backend.write(batch, sync=True)
            added += len(batch)
    return EnqueueResult(added=added, skipped=len(entries) - added)
