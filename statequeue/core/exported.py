"""One item as `statequeue export` writes it and `statequeue import` reads it.

Below the stores (as ``items`` is): every store turns its own rows or records
into ``ExportedItem`` and back, so a queue moves between any two of them.

An item's ``history`` is its outcome records, oldest first, in the journal's
record format (``records``): ``end`` (one per finished attempt: ``ok``,
``exit``, ``sig``, ``dur``, ``reason``, ``result``, ``err``, ``at``, and
``logcut`` when its output log was cut),
``intr`` (its runner died, or it was handed back), ``defer`` (an attempt
asked to be tried later: ``delay``, ``deferrals``, ``retry_at``) and ``set``
(a user's retry or cancel). Claims (``start``) are not kept: an export holds no
running item (a running item is exported as pending, interrupted).
"""

from __future__ import annotations

import base64
import math
import os
from dataclasses import dataclass
from typing import Any

from statequeue.core.errors import InvalidExport, InvalidItem
from statequeue.core.items import check_item
from statequeue.core.models import ItemState
from statequeue.core.records import Record, json_problem
from statequeue.core.textsafe import item_json

FORMAT_VERSION = 1
HISTORY_KINDS = ("end", "intr", "defer", "set")
RESULT_KEYS = ("attempt", "dur", "exit", "sig", "result", "err", "reason", "at")
"""The fields of an ``end`` record that make up a result."""
ARCHIVED_KEYS = (*RESULT_KEYS, "timeout", "logcut", "runner", "host")
"""The fields of an item's last ``end`` that compaction keeps in its ``arch``
record: its result, and what `stats` and `report` group and show it by
(runner, host, timeout) and why its log is cut."""
_HISTORY_DROP = ("seq", "id", "crc", "token", "episode", "tries", "last")

# The limits of an import, checked here once for every store. Ids: exact in
# every JSON reader and in a bigint, and at most MAX_ID_GAP of the ids below
# the highest unused, because the journal store keeps 9 bytes per id up to the
# highest (an id of 2^40 cost 9 TB): an import then costs at most 150 MB more
# than its items do. Replay holds each record to the same gap (``state``).
MAX_ITEM_ID = 2**53 - 1
MAX_ID_GAP = 2**24
# Times and durations: finite seconds in [0, MAX_SECONDS), before the year
# 10000 that dates can show (1e20 broke every view, 1e300 made `run` wait forever).
MAX_SECONDS = 253402300800.0
# Counters, exit codes and signals: what a PostgreSQL integer column holds.
MAX_COUNT = 2**31 - 1


@dataclass(frozen=True)
class ExportedItem:
    """An item with everything recorded about it, as it moves between stores."""

    item_id: int
    item: str
    state: ItemState
    """Never RUNNING: an item running at export time is exported as pending."""
    attempts: int = 0
    crashes: int = 0
    failures: int = 0
    deferrals: int = 0
    """Times it asked to be tried later in its current episode (``--max-deferrals``)."""
    reason: str = ""
    retry_at: float | None = None
    interrupted: bool = False
    archived: bool = False
    """Informational: where the source kept it (an import never archives)."""
    history: tuple[Record, ...] = ()

    @property
    def results(self) -> list[Record]:
        """The ``end`` records: one per finished attempt, oldest first."""
        return [r for r in self.history if r.get("t") == "end"]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.item_id, **item_json(self.item)}
        out.update(state=self.state.value, attempts=self.attempts, crashes=self.crashes)
        out.update(failures=self.failures, deferrals=self.deferrals)
        out.update(reason=self.reason, retry_at=self.retry_at)
        out.update(interrupted=self.interrupted, archived=self.archived)
        out["history"] = list(self.history)
        return out


def history_record(record: Record) -> Record:
    """``record`` (an end, intr or set) as a history entry: without the fields
    that only mean something in the store it came from (seq, token, checksum)."""
    return {k: v for k, v in record.items() if k not in _HISTORY_DROP}


def parse_item(obj: object, line: int) -> ExportedItem:
    """The item on export line ``line``; InvalidExport naming what is wrong."""
    if not isinstance(obj, dict):
        raise InvalidExport(f"line {line}: not a JSON object")
    try:
        return _parse_item(obj, line)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidExport(f"line {line}: bad item entry ({_what(exc)})") from None


def _parse_item(obj: dict[str, Any], line: int) -> ExportedItem:
    item_id = _int(obj["id"], "id", least=1, most=MAX_ITEM_ID)
    state = ItemState(obj["state"])
    if state is ItemState.RUNNING:
        raise ValueError("state running (an export holds none)")
    history = obj.get("history", [])
    if not isinstance(history, list):
        raise ValueError("history must be a list")
    for record in history:
        _check_history(record)
    retry_at = obj.get("retry_at")
    if retry_at is not None:
        _seconds(retry_at, "retry_at")
    return ExportedItem(
        item_id=item_id,
        item=_item_text(obj),
        state=state,
        attempts=_int(obj.get("attempts", 0), "attempts"),
        crashes=_int(obj.get("crashes", 0), "crashes"),
        failures=_int(obj.get("failures", 0), "failures"),
        deferrals=_int(obj.get("deferrals", 0), "deferrals"),  # older exports: none
        reason=_str(obj.get("reason", ""), "reason"),
        retry_at=float(retry_at) if retry_at is not None else None,
        interrupted=_bool(obj.get("interrupted", False), "interrupted"),
        archived=_bool(obj.get("archived", False), "archived"),
        history=tuple(history_record(r) for r in history),
    )


_NUMBER = (int, float)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "attempt": (int,),
    "at": _NUMBER,
    "dur": _NUMBER,
    "started": _NUMBER,
    "retry_at": _NUMBER,
    "exit": (int,),
    "sig": (int,),
    "crashes": (int,),
    "attempts": (int,),
    "delay": _NUMBER,
    "deferrals": (int,),
    "ok": (bool,),
    "crashed": (bool,),
    "timeout": (bool,),
    "reason": (str,),
    "err": (str,),
    "logcut": (str,),  # why the attempt's log is cut (`show`, `logs`)
    "runner": (str,),  # who ran it and where: `stats` and `report` group by them
    "host": (str,),
}


# The least value of a history field that counts (as the stores write them):
# an attempt is numbered from 1; crashes, deferrals and attempts made are
# counts. Exit codes and signals keep the wider range of an integer column.
_LEAST = {"attempt": 1, "attempts": 0, "crashes": 0, "deferrals": 0}


def _check_history(record: object) -> None:
    """ValueError unless ``record`` is an end, intr, defer or set record whose
    fields have the types the stores write."""
    if not isinstance(record, dict) or record.get("t") not in HISTORY_KINDS:
        raise ValueError("history must hold only end, intr, defer and set records")
    ItemState(record.get("state", ItemState.DONE.value))
    for name, types in _FIELD_TYPES.items():
        value = record.get(name)
        if value is not None and (not isinstance(value, types) or _bad_bool(value, types)):
            raise ValueError(f"history field {name!r} has the wrong type")
        if value is not None and types is _NUMBER:
            _seconds(value, f"history field {name!r}")
        elif type(value) is int:
            _int(value, f"history field {name!r}", least=_LEAST.get(name, -MAX_COUNT - 1))
    problem = json_problem(record.get("result"), parsed=True)  # a hand edit may nest deeper
    if problem is not None:
        raise ValueError(f"history result cannot be stored: {problem}")


def _bad_bool(value: object, types: tuple[type, ...]) -> bool:
    # bool is an int subclass: a number field must not hold true/false.
    return isinstance(value, bool) and bool not in types


def _item_text(obj: dict[str, Any]) -> str:
    """The item's exact text: ``item_b64`` (the bytes) when present, else
    ``item``. With both, ``item`` must be what every view shows for those
    bytes (U+FFFD for each byte that is not UTF-8, ``textsafe.item_json``):
    two that disagree are an edited or mixed-up entry, not one item."""
    if "item_b64" in obj:
        raw = base64.b64decode(_str(obj["item_b64"], "item_b64"), validate=True)
        text = os.fsdecode(raw)
        if "item" in obj and _str(obj["item"], "item") != raw.decode("utf-8", "replace"):
            raise ValueError("item and item_b64 differ: they must name the same bytes")
    else:
        text = _str(obj["item"], "item")
    try:
        return check_item(text)
    except InvalidItem as exc:
        raise ValueError(exc.message) from None


def _int(value: object, name: str, least: int = 0, most: int = MAX_COUNT) -> int:
    if type(value) is not int or not least <= value <= most:
        raise ValueError(f"{name} must be an integer from {least} to {most}")
    return value


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a JSON boolean, true or false")
    return value


def _seconds(value: object, name: str) -> float:
    """``value`` as a time or duration in seconds, within the import's limits."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number")
    if not (math.isfinite(value) and 0 <= value < MAX_SECONDS):
        raise ValueError(f"{name} must be seconds from 0 to before {MAX_SECONDS:.0f} (year 10000)")
    return float(value)


def check_id_gaps(ids: dict[int, int]) -> None:
    """InvalidExport naming the line of the first item id (``ids``: id ->
    export line) with more than MAX_ID_GAP unused ids below it."""
    for count, item_id in enumerate(sorted(ids), start=1):
        if item_id - count > MAX_ID_GAP:
            raise InvalidExport(
                f"line {ids[item_id]}: item id {item_id} leaves {item_id - count} ids below it "
                f"unused; an export may leave at most {MAX_ID_GAP}"
            )


def out_of_reach(item_id: object, held: int) -> bool:
    """Whether an ``enq`` or ``item`` record naming ``item_id`` is beyond what a
    state holding ids below ``held`` takes: not an id, or so far past them that
    one byte and one locator per id would leave more than MAX_ID_GAP of them
    unused in between. An import stays within that (``check_id_gaps``); an older
    one appended an id of 2^40, and every replay died with MemoryError."""
    return type(item_id) is not int or item_id < 1 or item_id - held > MAX_ID_GAP


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


def _what(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return str(exc) or type(exc).__name__
