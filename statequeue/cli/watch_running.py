"""What `status --watch` shows of the work in progress: each running item by
its text, with its attempt, where it runs and for how long (longest first),
the run's elapsed time, and on a terminal a progress bar.

pueue's status shows what is running; a list of ids ("running items: 2") did
not. The details come from the ``start`` records, followed through the
store's event stream (``read_events``): read once from the start, then only
what was written since each refresh, never an item's whole history per
refresh (on the journal store that is a scan of the journal).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from statequeue.core.durations import format_duration
from statequeue.core.textsafe import shown
from statequeue.core.views import Status

__all__ = ["RunningItem", "RunningTracker", "progress_bar", "running_lines"]

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


class RunningTracker:
    """The attempt and start time of each item started and not ended yet,
    kept up to date from the store's event stream."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.cursor: object | None = None
        self.starts: dict[int, tuple[int, float | None]] = {}

    def update(self) -> None:
        """Fold in the records written since the last update."""
        while True:
            records, self.cursor = self.queue.store.read_events(self.cursor)
            for rec in records:
                self._fold(rec)
            if not records:
                return

    def _fold(self, rec: dict[str, Any]) -> None:
        item_id = rec.get("id")
        if not isinstance(item_id, int):
            return
        if rec.get("t") == "start":
            at = rec.get("at")
            started = float(at) if isinstance(at, int | float) else None
            self.starts[item_id] = (int(rec.get("attempt", 0)), started)
        elif rec.get("t") in ("end", "intr", "set", "arch", "discard"):
            self.starts.pop(item_id, None)  # only running items are kept

    def running_items(self, status: Status) -> list[RunningItem]:
        """The running items of ``status``'s runners, longest running first."""
        self.update()
        ids = [i for r in status.runners for i in r.running[:SHOWN]]
        texts = self.queue.live_texts(ids) if ids else {}
        found: list[RunningItem] = []
        for runner in status.runners:
            where = f"{runner.host} pid {runner.pid}"
            for item_id in runner.running[:SHOWN]:
                attempt, started = self.starts.get(item_id, (0, None))
                text = texts.get(item_id, "")
                found.append(RunningItem(item_id, text, attempt, where, started))
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
        attempt = f"attempt {r.attempt}" if r.attempt else "attempt ?"
        lines.append(f"  {what}  {attempt}  on {shown(r.where)}  for {took}")
    return lines


def progress_bar(status: Status) -> str:
    """``[#########.....] 12 of 40 finished``: done, failed and cancelled count."""
    c, total = status.counts, status.total
    if not total:
        return ""
    finished = c.get("done", 0) + c.get("failed", 0) + c.get("cancelled", 0)
    filled = BAR_WIDTH * finished // total
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {finished} of {total} finished"
