"""A ``QueueState`` as plain data and back, without replaying the journal:
what the journal's checkpoint file (journal/checkpoint.py) and online
compaction's snapshot hold. ``QueueState.export`` and ``restore`` call these."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

from statequeue.core.models import ItemState
from statequeue.store.records.items import CODE, STATE_OF, LiveItem

if TYPE_CHECKING:
    from statequeue.store.records.state import QueueState


def export_state(state: QueueState) -> tuple[dict[str, Any], bytes, bytes]:
    """Everything needed to rebuild ``state`` without replay (not the
    dedupe keys): a JSON-able dict, the state codes and the locators (the
    texts', then the results': an older checkpoint, without the latter,
    fails ``restore_state``'s length check and the journal is replayed)."""
    items = [
        [
            i.id,
            i.loc,
            CODE[i.state],
            i.attempts,
            i.crashes,
            i.runner,
            i.reason,
            i.last_seq,
            i.interrupted,
            i.not_before,
            i.failures,
            i.last_err,
            i.deferrals,
            i.checking,
        ]
        for i in state.items.values()
    ]
    meta = {
        "next_id": state.next_id,
        "archived": state.archived,
        "archive_size": state.archive_size,
        "watermark": state.watermark,
        "snap_end": state.snap_end,
        "paused": state.paused,
        "orphans": state.orphans,
        "commands": state.commands,
        "commanded": sorted(state.commanded),
        "runners": list(state.runners.values()),
        "recent_ends": list(state.recent_ends),
        "recent_starts": list(state.recent_starts),
        "counts": {s.value: n for s, n in state.counts.items()},
        **state.order.export(),
        "items": items,
    }
    return meta, bytes(state.codes), state.locs.tobytes() + state.ends.tobytes()


def restore_state(
    state: QueueState, meta: dict[str, Any], codes: bytes | memoryview, locs: bytes | memoryview
) -> None:
    """Make ``state`` the one ``export_state`` returned (raises on malformed input)."""
    state.reset()
    state.next_id = int(meta["next_id"])
    state.archived = meta["archived"]
    state.archive_size = meta["archive_size"]
    state.watermark = meta["watermark"]
    state.snap_end = int(meta.get("snap_end", 0))
    state.paused = bool(meta["paused"])
    state.orphans = meta["orphans"]
    state.commands = meta["commands"]
    state.commanded = set(meta.get("commanded", ()))  # older checkpoints lack it
    state.runners = {r["runner"]: r for r in meta["runners"]}
    state.recent_ends.extend(meta["recent_ends"])
    state.recent_starts.extend(meta.get("recent_starts", ()))  # older checkpoints lack it
    state.counts = {s: int(meta["counts"][s.value]) for s in ItemState}
    state.order.restore_export(meta)
    state.codes = bytearray(codes)
    half = len(codes) * state.locs.itemsize
    if len(locs) != 2 * half or len(state.codes) < state.next_id:
        raise ValueError("checkpoint arrays do not match")
    state.locs = array("q")
    state.locs.frombytes(locs[:half])
    state.ends = array("q")
    state.ends.frombytes(locs[half:])
    for row in meta["items"]:
        # A row without ``failures`` (an older checkpoint) raises here, and
        # the caller replays the journal instead.
        item_id, loc, code, attempts, crashes, runner, reason, seq, intr, nb, fails = row[:11]
        item = LiveItem(item_id, loc, state.loader)
        item.last_err = row[11] if len(row) > 11 else ""  # older checkpoints lack it
        item.deferrals = row[12] if len(row) > 12 else 0  # as do those before deferrals
        item.checking = bool(row[13]) if len(row) > 13 else False  # and before checks
        item.state = STATE_OF[code]
        item.attempts, item.crashes = attempts, crashes
        item.runner, item.reason = runner, reason
        item.last_seq, item.interrupted, item.not_before = seq, intr, nb
        item.failures = fails
        state.items[item_id] = item
        if item.state in state.ids_in:
            state.ids_in[item.state].add(item_id)
