"""What `fsck --repair` cannot vouch for once it drops records.

A repair keeps the valid records and drops the rest: damaged lines, records
whose sequence numbers are missing, records cut from the end. An item whose
enqueue was dropped is lost (the id sequence shows it: ids are handed out one
by one, so an id below the highest one known that no surviving record names
is lost). An item named by a dropped record keeps the state of its records
that survive, which may be older than it was: a dropped ``end`` turns a done
item back into a running one, which runs again (promise 2: reported, never
silently dropped).

A dropped line whose JSON still reads (a bad checksum over intact structure,
and the sequence number its place calls for) names its id; one that cannot be
read may have named any item that existed before it. Either way an item whose
state a surviving record after the drop sets again is vouched for by that
record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from statequeue.core import records
from statequeue.core.exported import out_of_reach
from statequeue.store.records.state import id_runs

# Records that name an item id, those that set its state, and the others.
NAMING = frozenset({"enq", "item", "start", "end", "intr", "check", "checked", "defer", "set"})
SETTING = frozenset({"enq", "item", "start", "end", "intr", "defer", "set"})
UNNAMING = frozenset({"snap", "run", "stop", "pause"})


@dataclass
class Dropped:
    """The records of a journal that a repair drops, as far as they can be read.

    Positions are 2 * line number for a line, one less for records missing
    (by their sequence numbers) just before a line."""

    count: int = 0  # dropped lines and missing records
    named: list[tuple[int, int]] = field(default_factory=list)  # (position, id) read
    enqueued: list[int] = field(default_factory=list)  # ids of dropped enq records read
    unread_at: int = 0  # position of the last dropped record that cannot be read
    top_at_unread: int = 0  # the highest id that existed then
    last_set: dict[int, int] = field(default_factory=dict)  # id -> last surviving SETTING
    top: int = 0  # the highest id the surviving records know of

    def mark_unread(self, position: int) -> None:
        self.unread_at = position
        self.top_at_unread = self.top


def dropped_records(data: bytes, bad_lines: list[int], cut_at_end: bool) -> Dropped:
    """Read what can be read of the journal's dropped records (``bad_lines``,
    the valid records' sequence gaps, and a cut end if ``cut_at_end``)."""
    found = Dropped()
    bad = set(bad_lines)
    lines = data.split(b"\n")[:-1]
    last_seq: int | None = None
    dropped_since = 0
    for number, line in enumerate(lines, start=1):
        position = 2 * number
        if number in bad:
            found.count += 1
            dropped_since += 1
            expected = None if last_seq is None else last_seq + dropped_since
            _read_dropped(found, line, position, expected)
            continue
        rec = records.decode(line)
        if rec is None:
            continue  # a torn tail: never acknowledged, nothing is lost
        if last_seq is not None:
            missing = rec["seq"] - last_seq - 1 - dropped_since
            if missing > 0:  # records gone without a line left of them
                found.count += missing
                found.mark_unread(position - 1)
        last_seq, dropped_since = rec["seq"], 0
        kind = rec.get("t")
        item_id = rec.get("id")
        if kind == "snap" and type(rec.get("next_id")) is int:
            found.top = max(found.top, rec["next_id"] - 1)
        elif kind in SETTING and type(item_id) is int:
            found.last_set[item_id] = position
            if kind in ("enq", "item"):
                found.top = max(found.top, item_id)
    if cut_at_end:
        found.count += 1
        found.mark_unread(2 * len(lines) + 1)
    return found


def _read_dropped(found: Dropped, line: bytes, position: int, expected: int | None) -> None:
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        rec = None
    if (
        type(rec) is not dict
        or type(rec.get("seq")) is not int
        or (expected is not None and rec["seq"] != expected)
        or rec.get("t") not in NAMING | UNNAMING
    ):
        found.mark_unread(position)
        return
    if rec["t"] in UNNAMING:
        return
    item_id = rec.get("id")
    if type(item_id) is not int or item_id < 1:
        found.mark_unread(position)
        return
    found.named.append((position, item_id))
    if rec["t"] == "enq":
        found.enqueued.append(item_id)


def highest_enqueued(found: Dropped, known: int, surviving: int) -> int:
    """``known``, or the highest id a dropped enqueue record names past
    ``surviving`` (the surviving records' highest, which replay takes by
    itself) if it could have been handed out: ids go one by one, so at most
    one new id per dropped record past every id known."""
    bound = max(known, surviving, found.top) + found.count
    ids = [
        i
        for i in found.enqueued
        if surviving < i <= bound and not out_of_reach(i, max(known, surviving) + 1)
    ]
    return max([known, *ids])


def state_unsure(
    found: Dropped, next_id: int, lost: list[list[int]], archived: list[int]
) -> list[list[int]]:
    """[first, last] runs of the ids below ``next_id``, neither lost nor
    archived, that a dropped record named (or, for one that cannot be read,
    any id that existed before it) and that no surviving record after it
    sets the state of: their state may have gone back."""
    marks = bytearray(max(next_id, 1))
    last_set = found.last_set
    for position, item_id in found.named:
        if item_id < next_id and last_set.get(item_id, 0) < position:
            marks[item_id] = 1
    if found.unread_at:
        for item_id in range(1, min(found.top_at_unread, next_id - 1) + 1):
            if last_set.get(item_id, 0) < found.unread_at:
                marks[item_id] = 1
    for first, last in lost:
        marks[first : last + 1] = bytes(last + 1 - first)
    for item_id in archived:
        if 0 < item_id < next_id:
            marks[item_id] = 0
    return id_runs(marks, 1)
