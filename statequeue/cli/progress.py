"""What `statequeue run` shows while it works: a rich progress bar on a
terminal, one plain line per item otherwise (both on stderr).

When whatever reads our stderr (or, for live output, stdout) goes away
(`run ... 2>&1 | head`), or a write there fails (`2>>job.log` on a full
disk, an I/O error), the run goes on and stops writing there: progress is a
courtesy (each item's output is in its log, its result in the store), and
losing it is neither a failure nor a reason to stop.
"""

from __future__ import annotations

import os
import sys
from time import monotonic
from typing import Any, Protocol

from statequeue.cli.errors import with_queue
from statequeue.cli.render import escaped, shown
from statequeue.core.durations import format_duration
from statequeue.core.models import ItemState
from statequeue.run.events import ItemFinished, ItemStarted, Notice, RunEvent

DESCRIBE_EVERY = 0.1  # seconds between updates of the bar's "#ID" (a person reads ~10/s)
# A plain line (not on a terminal: a log file, a pipe, cron mail) names the
# whole item, never cut, as GNU parallel and xargs never cut an argument in
# what they log: a line read back by a script must name the very item. Only
# the lines printed above the progress bar on a terminal are cut to fit.
TERMINAL_WIDTH = 60


def _line(event: ItemFinished, width: int | None = None) -> str:
    claim, outcome = event.claim, event.outcome
    text = escaped(claim.item) if width is None else shown(claim.item, width)
    what = f"#{claim.item_id} {text}"
    if event.verified:
        if claim.interrupted:
            return f"[verified] {what}: finished before its runner died; not run again"
        return f"[verified] {what}: done before its first run; not run"
    took = format_duration(outcome.duration)
    attempt = f"attempt {claim.attempt}"
    if event.state is ItemState.DONE:
        return f"[ok] {what} ({took}{', ' + attempt if claim.attempt > 1 else ''})"
    if event.deferred is not None:  # exit 75: not a failure, no retry spent
        return f"[later] {what} {attempt}: try again in {format_duration(event.deferred)}"
    if event.state is ItemState.PENDING:
        retry = f"retry {claim.failures + 1} of {event.retries}"
        return f"[retry] {what} {attempt}: {_reason(outcome.reason)}; {retry} follows"
    return f"[failed] {what} {attempt}: {_reason(outcome.reason)}"


REASON_SHOWN = 2000  # characters of a reason a progress line shows (`show ID` has it whole)


def _reason(text: str) -> str:
    """A failure's reason on one progress line: control characters escaped (a
    worker's reason may hold a NUL or an escape sequence), cut if very long."""
    return shown(text, REASON_SHOWN)


def _silence(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null, so that nothing (not even
    the interpreter's flush at exit) fails on the dead pipe again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


class View(Protocol):
    def handle(self, event: RunEvent) -> None: ...
    def close(self) -> None: ...
    def summary(self, line: str, *, failed: bool) -> None: ...


class PlainView:
    """One line per finished item on stderr; with ``quiet``, only failures
    for good, warnings, and the summary when an item failed for good or was held (cron
    mails any output: a run that went well must leave stderr empty)."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet
        self.gone = False

    def handle(self, event: RunEvent) -> None:
        if isinstance(event, Notice):
            if event.warning or not self.quiet:
                self._err(f"statequeue: {with_queue(event.text)}")
        elif isinstance(event, ItemFinished) and (
            not self.quiet or event.state is ItemState.FAILED
        ):
            self._err(_line(event))

    def summary(self, line: str, *, failed: bool) -> None:
        if failed or not self.quiet:
            self._err(line)

    def _err(self, line: str) -> None:
        if self.gone:
            return
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except OSError:  # its reader gone, or its disk full: the run goes on
            self.gone = True
            _silence(sys.stderr)

    def close(self) -> None:
        pass


class RichView:
    """A progress bar on a terminal; failures and notices printed above it."""

    def __init__(self, total: int) -> None:
        # lazy: start-up time (rich, only on a terminal)
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
            _remaining_column(TimeRemainingColumn),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.progress.add_task("running", total=total or None)
        self.progress.start()
        self.described = 0.0  # when the bar last named the item that started

    def handle(self, event: RunEvent) -> None:
        console = self.progress.console
        if isinstance(event, Notice):
            console.print(f"statequeue: {with_queue(event.text)}", markup=False, highlight=False)
            if event.stopping:  # no item starts any more: an ETA would be a guess at nothing
                self.progress.update(self.task, description="stopping", stopping=True)
        elif isinstance(event, ItemStarted):
            # Per item it cost a locked update for a name nobody can read at
            # a thousand a second; the bar redraws ten times a second anyway.
            now = monotonic()
            if now - self.described >= DESCRIBE_EVERY:
                self.described = now
                self.progress.update(self.task, description=f"#{event.claim.item_id}")
        elif isinstance(event, ItemFinished):
            if event.state is not ItemState.PENDING:
                self.progress.advance(self.task)
            if not event.outcome.ok:
                console.print(_line(event, TERMINAL_WIDTH), markup=False, highlight=False)

    def summary(self, line: str, *, failed: bool) -> None:
        self.progress.console.print(line, markup=False, highlight=False)

    def close(self) -> None:
        self.progress.stop()


def _remaining_column(base: Any) -> Any:
    """rich's ETA column, blank once the run is stopping (the task's
    ``stopping`` field): the items left will not run, so no time remains for them."""

    class Remaining(base):  # type: ignore[misc]
        def __call__(self, task: Any) -> Any:  # before rich's cache of the last ETA shown
            if task.fields.get("stopping"):
                from rich.text import Text  # lazy: start-up time (only on a terminal)

                return Text("")
            return super().__call__(task)

    return Remaining()


def make_view(*, tty: bool, live: bool, quiet: bool = False, total: int) -> View:
    if tty and not live and not quiet:
        return RichView(total)
    return PlainView(quiet=quiet)


class LiveSink:
    """Copies a child's output to our own stdout or stderr as it arrives,
    until the reader of that stream goes away (then that stream gets no more)."""

    def __init__(self) -> None:
        self.gone: set[int] = set()

    def __call__(self, stream: int, data: bytes) -> None:
        if stream in self.gone:
            return
        out = sys.stdout if stream == 1 else sys.stderr
        try:
            out.buffer.write(data)
            out.flush()
        except OSError:  # its reader gone, or its disk full: the item's log has it all
            self.gone.add(stream)
            _silence(out)
