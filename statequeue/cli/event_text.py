"""One line per journal record, for `events` and `show`.

Each line starts with the record's sequence number (labelled ``seq``, never
to be confused with an item id, which is written ``#N``) and a time.
An enqueue batch records its time once, on its first line: the batch's other
lines show it too. Records that carry no time (enqueues of journals older than
that) show the time of the nearest record that has one, marked ``~``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from statequeue.cli.clock import local_time
from statequeue.core.durations import format_duration
from statequeue.core.records import enqueue_times
from statequeue.core.textsafe import shown

Record = dict[str, Any]
NO_TIME = "-"


def _runner(r: Record) -> str:
    return shown(str(r.get("runner", ""))[:8])


def _item(r: Record) -> str:
    return f"#{r.get('id')}"


def _enqueued(r: Record) -> str:
    n = r.get("n")  # a PostgreSQL store writes one event per batch
    if isinstance(n, int) and n > 1 and isinstance(r.get("id"), int):
        return f"enqueued {n} items #{r['id']}..#{r['id'] + n - 1}"
    return f"enqueued {_item(r)}"


def _stopped(r: Record) -> str:
    if r.get("reason") != "died":
        return f"runner {_runner(r)} stopped"
    # Written by the process that found the runner's lock free while its
    # start record stood: the runner was killed (-9) or crashed.
    finder = f", noticed by pid {r['by']}" if "by" in r else ""
    how = _LOST_HOW.get(str(r.get("how", "")), _LOST_HOW[""])
    return f"runner {_runner(r)} lost ({how} without a stop record{finder})"


_LOST_HOW = {
    "": "its lock was released",
    "lease": "its lease ended unrenewed",
    "pid": "its process is gone",
}


def _discarded(r: Record) -> str:
    return (
        f"result of {_item(r)} attempt {r.get('attempt')} discarded: runner {_runner(r)} "
        f"had lost its lease and the item was taken over ({shown(str(r.get('reason', '')))})"
    )


def _ended(r: Record) -> str:
    # An attempt of the library (work(), map()) has no exit code: nothing is said of one.
    why = r.get("reason") or _exited(r)
    state = str(r.get("state"))
    if state == "pending" and "retry_at" in r:
        # The attempt failed; the item waits for its retry ("pending" read as
        # if nothing had gone wrong).
        state = f"failed, retry due at {local_time(float(r['retry_at']))}"
    said = f" ({shown(str(why))})" if why else ""
    cut = f"; output log cut: {shown(str(r['logcut']))}" if r.get("logcut") else ""
    return f"end {_item(r)} attempt {r.get('attempt')}: {state}{said}{cut}"


def _exited(r: Record) -> str:
    if r.get("exit") is not None:
        return f"exit {r['exit']}"
    return "" if r.get("sig") is None else f"signal {r['sig']}"


_EVENT_TEXT: dict[str, Callable[[Record], str]] = {
    "enq": lambda r: _enqueued(r),
    "start": lambda r: f"start {_item(r)} attempt {r.get('attempt')} (runner {_runner(r)})",
    "end": _ended,
    "intr": lambda r: (
        f"recovered {_item(r)} -> {r.get('state')}: {shown(str(r.get('reason', '')))}"
    ),
    "check": lambda r: f"--verify checks {_item(r)} before attempt {r.get('attempt')}",
    "checked": lambda r: f"--verify: {_item(r)} not done; attempt {r.get('attempt')} runs",
    "defer": lambda r: (
        f"deferred {_item(r)} attempt {r.get('attempt')}: asked to be tried later; "
        f"due again in {r.get('delay')}s (deferral {r.get('deferrals')})"
    ),
    "set": lambda r: f"{_item(r)} -> {r.get('state')} ({shown(str(r.get('reason', '')))})",
    "run": lambda r: (
        f"runner {_runner(r)} started (pid {r.get('pid')} on {shown(str(r.get('host')))})"
    ),
    "stop": _stopped,
    "pause": lambda r: "queue paused" if r.get("paused") else "queue resumed",
    "snap": lambda r: f"snapshot: {r.get('archived')} archived, next id {r.get('next_id')}",
    "item": lambda r: _carried(r),
    "arch": lambda r: _archived(r),
    "discard": _discarded,
}


def _carried(r: Record) -> str:
    if "imported" in r:  # written by `import` (records/transfer.py), not by a compaction
        return f"{_item(r)} imported: {r.get('state')}"
    text = f"{_item(r)} carried over by compaction: {r.get('state')}"
    at = r.get("enq_at")  # the enqueue record it replaces had the batch's time
    return text + (f" (enqueued {local_time(float(at))})" if isinstance(at, int | float) else "")


def _archived(r: Record) -> str:
    """An archived item's record keeps its last attempt: say how it ended, as
    the ``end`` record said before compaction moved it."""
    text = f"{_item(r)} archived"
    if "attempt" not in r:
        return text
    how = [f"exit {r['exit']}" if "exit" in r else "", shown(str(r.get("reason") or ""))]
    if isinstance(r.get("dur"), int | float):
        how.append(f"took {format_duration(float(r['dur']))}")
    said = ", ".join(part for part in how if part)
    return f"{text}: attempt {r['attempt']} done" + (f" ({said})" if said else "")


def record_time(rec: Record) -> float | None:
    """When the record was written, if it says."""
    kind = rec.get("t")
    at = rec.get("at", rec.get("since") if kind == "run" else None)
    if kind == "item":  # an imported item's record says when
        at = rec.get("imported")
    return float(at) if isinstance(at, int | float) else None


def describe_events(
    records: Sequence[Record], last_time: float | None = None
) -> tuple[list[str], float | None]:
    """A line per record, and the last known time (pass it to the next call
    when following). A record without a time gets the nearest earlier known
    one, else the next later one in ``records``."""
    records = list(enqueue_times(records))  # an enqueue batch's lines share its time
    times = [record_time(r) for r in records]
    later: float | None = None
    nearest: list[float | None] = [None] * len(records)
    for i in range(len(records) - 1, -1, -1):
        later = times[i] if times[i] is not None else later
        nearest[i] = later
    lines = []
    for rec, at, after in zip(records, times, nearest, strict=True):
        if at is not None:
            last_time = at
            lines.append(describe_event(rec, at))
        else:
            lines.append(describe_event(rec, last_time or after, approximate=True))
    return lines, last_time


def describe_event(rec: Record, at: float | None = None, *, approximate: bool = False) -> str:
    """One human-readable line for a journal record."""
    when = NO_TIME
    if at is not None:
        when = ("~" if approximate else "") + local_time(at)
    fmt = _EVENT_TEXT.get(str(rec.get("t")))
    text = fmt(rec) if fmt is not None else f"{shown(str(rec.get('t')))} record"
    return f"seq {rec.get('seq', '?')}  {when}  {text}"
