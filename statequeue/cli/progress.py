"""What `statequeue run` shows while it works: a rich progress bar on a
terminal, one plain line per item otherwise (both on stderr)."""

from __future__ import annotations

import sys
from typing import Any

from statequeue.cli.render import err, shown
from statequeue.durations import format_duration
from statequeue.models import ItemState
from statequeue.runner import ItemFinished, ItemStarted, Notice, RunEvent


def _line(event: ItemFinished) -> str:
    claim, outcome = event.claim, event.outcome
    what = f"#{claim.item_id} {shown(claim.item, 60)}"
    if event.verified:
        return f"[verified] {what}: finished before its runner died; not run again"
    took = format_duration(outcome.duration)
    if event.state is ItemState.DONE:
        return f"[ok] {what} ({took})"
    if event.state is ItemState.PENDING:
        return f"[retry] {what} attempt {claim.attempt}: {outcome.reason}; will retry"
    return f"[failed] {what} attempt {claim.attempt}: {outcome.reason}"


class PlainView:
    """One line per finished item on stderr."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet

    def handle(self, event: RunEvent) -> None:
        if isinstance(event, Notice):
            err(f"statequeue: {event.text}")
        elif isinstance(event, ItemFinished) and not (self.quiet and event.outcome.ok):
            err(_line(event))

    def close(self) -> None:
        pass


class RichView:
    """A progress bar on a terminal; failures and notices printed above it."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.progress.add_task("running", total=total or None)
        self.progress.start()

    def handle(self, event: RunEvent) -> None:
        console = self.progress.console
        if isinstance(event, Notice):
            console.print(f"statequeue: {event.text}", markup=False, highlight=False)
        elif isinstance(event, ItemStarted):
            self.progress.update(self.task, description=f"#{event.claim.item_id}")
        elif isinstance(event, ItemFinished):
            if event.state is not ItemState.PENDING:
                self.progress.advance(self.task)
            if not event.outcome.ok:
                console.print(_line(event), markup=False, highlight=False)

    def close(self) -> None:
        self.progress.stop()


def make_view(*, tty: bool, live: bool, total: int) -> Any:
    if tty and not live:
        return RichView(total)
    return PlainView()


def live_sink(stream: int, data: bytes) -> None:
    """Copy a child's output to our own stdout or stderr as it arrives."""
    out = sys.stdout if stream == 1 else sys.stderr
    out.buffer.write(data)
    out.flush()
