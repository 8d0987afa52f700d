"""What `status --watch` shows of the work in progress: each running item by
its text, with its attempt, where it runs and for how long (longest first),
the run's elapsed time, and on a terminal a progress bar.

pueue's status shows what is running; a list of ids ("running items: 2") did
not. The details come from each running item's history (its last ``start``
record), read once per refresh for at most ``SHOWN`` items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from statequeue.core.durations import format_duration
from statequeue.core.textsafe import shown
from statequeue.core.views import Status

__all__ = ["RunningItem", "progress_bar", "running_items", "running_lines"]

SHOWN = 20
BAR_WIDTH = 30


@dataclass(frozen=True)
class RunningItem:
    item_id: int
    text: str
    attempt: int
    where: str
    """The runner's host and pid."""
    started_at: float | None
    """When its attempt started (None: not recorded)."""


def running_items(queue: Any, status: Status) -> list[RunningItem]:
    """The running items of ``status``'s runners, longest running first."""
    found: list[RunningItem] = []
    for runner in status.runners:
        where = f"{runner.host} pid {runner.pid}"
        for item_id in runner.running[:SHOWN]:
            history = queue.history(item_id)
            events: list[dict[str, Any]] = list(history.events)
            start: dict[str, Any] = next((e for e in reversed(events) if e.get("t") == "start"), {})
            at = start.get("at")
            started = float(at) if isinstance(at, int | float) else None
            attempt = int(start.get("attempt", 0))
            found.append(RunningItem(item_id, history.item, attempt, where, started))
    found.sort(key=lambda r: (r.started_at is None, r.started_at or 0.0, r.item_id))
    return found[:SHOWN]


def running_lines(items: list[RunningItem], status: Status, now: float | None = None) -> list[str]:
    """The elapsed time of the run, then a line per running item."""
    now = time.time() if now is None else now
    lines: list[str] = []
    if status.runners:
        began = min(r.started_at for r in status.runners)
        lines.append(
            f"elapsed: {format_duration(max(now - began, 0.0))} (since the oldest runner started)"
        )
    if not items:
        return lines
    lines.append("running (longest first):")
    width = max(len(shown(r.text, 50)) for r in items)
    for r in items:
        took = "?" if r.started_at is None else format_duration(max(now - r.started_at, 0.0))
        what = f"#{r.item_id} {shown(r.text, 50):<{width}}"
        lines.append(f"  {what}  attempt {r.attempt}  on {shown(r.where)}  for {took}")
    return lines


def progress_bar(status: Status) -> str:
    """``[#########.....] 12 of 40 finished``: done, failed and cancelled count."""
    c, total = status.counts, status.total
    if not total:
        return ""
    finished = c.get("done", 0) + c.get("failed", 0) + c.get("cancelled", 0)
    filled = BAR_WIDTH * finished // total
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {finished} of {total} finished"
