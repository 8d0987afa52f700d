"""`statequeue logs`: the output an item's attempt wrote (one item, as it
grows with --follow, or as JSON), or every item's last output (--all)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from statequeue.cli.attempt_numbers import latest_attempt, logged_attempt
from statequeue.cli.errors import with_queue
from statequeue.cli.logs_all import attempt_json, write_all_logs
from statequeue.cli.options import (
    HomeOpt,
    ItemIdArg,
    ItemTextOpt,
    QueueOpt,
    StateOpt,
    StoreOpt,
    open_queue,
    parse_state,
)
from statequeue.cli.render import emit_json, shown
from statequeue.cli.root import app
from statequeue.core.errors import ItemNotFound, UsageError
from statequeue.core.models import ItemState

if TYPE_CHECKING:
    from statequeue.api.queue import Queue
    from statequeue.core.views import ItemHistory


@app.command()
def logs(
    ctx: typer.Context,
    item_id: ItemIdArg = None,
    item: ItemTextOpt = None,
    attempt: Annotated[
        int | None, typer.Option(help="Which attempt (default: the latest).", min=1)
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing while the item runs.")
    ] = False,
    every: Annotated[
        bool,
        typer.Option("--all", help="Every item's last-attempt output, in item order (streamed)."),
    ] = False,
    tag: Annotated[
        bool, typer.Option("--tag", help="With --all: prefix each line with its item and a tab.")
    ] = False,
    state: StateOpt = None,
    json: Annotated[
        bool,
        typer.Option(
            "--json", help="One JSON object: the attempt's output (with --all, one per item)."
        ),
    ] = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Print the output (stdout and stderr) an item's attempt wrote.

    Output the runner could not write (a full disk) is not kept: then a line
    on stderr says the log was cut, and why (the exit code stays 0).

    Name the item by id, or by its exact text with --item (exit 7 when no item has it).

    Example: statequeue logs 42 --follow

    Example: statequeue logs --all --tag --state failed
    """
    if item is not None and (item_id is not None or every):
        raise UsageError("give an item id, --item TEXT or --all (one of them)")
    if every:
        _check_all_options(item_id, attempt, follow)
        q = open_queue(ctx, home, queue, create=False)
        write_all_logs(q, sys.stdout.buffer, state=parse_state(state), tag=tag, as_json=json)
        return
    if item_id is None and item is None:
        raise UsageError("logs needs an item id (or --item TEXT), or --all for every item's output")
    if tag or state is not None:
        raise UsageError("--tag and --state go with --all")
    if json and follow:
        raise UsageError("--json prints the output as it is now: not with --follow")
    q = open_queue(ctx, home, queue, create=False)
    wanted_id = item_id if item_id is not None else q.history(item).item_id
    if json:
        _item_log_json(q, wanted_id, attempt)
        return
    _item_logs(q, wanted_id, attempt, follow)


def _check_all_options(item_id: int | None, attempt: int | None, follow: bool) -> None:
    if item_id is not None:
        raise UsageError("logs --all takes no item id")
    if attempt is not None or follow:
        raise UsageError("--attempt and --follow go with one item id, not --all")


def _item_logs(q: Queue, item_id: int, attempt: int | None, follow: bool) -> None:
    if attempt is not None:
        _check_attempt(q.history(item_id), attempt)
    out = sys.stdout.buffer
    shown_path: str | None = None
    offset = 0
    while True:
        h = q.history(item_id)  # state first: output read after it is complete
        # The latest attempt by default, as `logs --all` shows, even when it
        # logged nothing: an older attempt's output would pass for its own.
        wanted = attempt or latest_attempt(h)
        paths = [p for p in h.log_paths if p.endswith(f".{wanted}.log")]
        if paths:
            # The same attempt's log under another name (PostgreSQL: this
            # host's file while it runs, the stored copy once it ends) goes
            # on from the offset: from 0 it was printed twice.
            if shown_path is None or logged_attempt(paths[-1]) != logged_attempt(shown_path):
                offset = 0
            shown_path = paths[-1]
        if shown_path is not None:
            # Read through the store (relative to the queue folder, no link
            # followed); the path only names the attempt: logs/ID.N.log.
            logged = logged_attempt(shown_path)
            data = q.read_log(item_id, logged, offset) or b""
            out.write(data)
            out.flush()
            offset += len(data)
        waiting = h.state in (ItemState.PENDING, ItemState.RUNNING)
        if not follow or not waiting:
            break
        time.sleep(0.25)
    if shown_path is None:
        typer.echo(f"statequeue: {with_queue(_no_output(h, wanted))}", err=True)
    elif cut := h.log_cuts().get(wanted):
        # On stderr, after the output: a script reading stdout gets the log as it is.
        note = f"the output of item {h.item_id} (attempt {wanted}) was cut: {shown(cut, 80)}"
        typer.echo(f"statequeue: {note}; the rest of it was not kept", err=True)


def _item_log_json(q: Queue, item_id: int, attempt: int | None) -> None:
    """`logs ID --json`: the attempt's output as `logs --all --json` gives
    each item's (``cut`` added when its log stops short)."""
    h = q.history(item_id)
    if attempt is not None:
        _check_attempt(h, attempt)
    wanted = attempt or latest_attempt(h)
    logged = any(logged_attempt(p) == wanted for p in h.log_paths)
    data = (q.read_log(item_id, wanted, 0) or b"") if logged else b""
    found = attempt_json(item_id, h.item, h.state, wanted, data)
    if cut := h.log_cuts().get(wanted):
        found["cut"] = cut
    emit_json(found)


def _no_output(h: ItemHistory, wanted: int) -> str:
    """Why attempt ``wanted`` (0: the item has had none) shows no output, and
    which other attempt has some. Compaction removes an archived item's logs
    by age: while an earlier attempt's log is kept, a later one's (newer) was
    not removed, so the attempt recorded none."""
    logged = sorted({logged_attempt(p) for p in h.log_paths})
    which = f"attempt {wanted} of " if wanted else ""
    archived = any(e.get("t") == "arch" for e in h.events)
    if archived and not any(a < wanted for a in logged):
        # Archived by `compact`, which removes logs by age (--keep-logs): this
        # one may be gone, or the attempt wrote nothing (not known any more).
        why = "it wrote none, or its log was removed when compaction archived it (--keep-logs)"
        text = f"no output is kept for {which}item {h.item_id}: {why}"
    elif cut := h.log_cuts().get(wanted):  # no log file could be made (a full disk)
        text = f"no output was kept for {which}item {h.item_id}: {shown(cut, 80)}"
    else:
        text = f"no output was recorded for {which}item {h.item_id}"
    others = [a for a in logged if a != wanted]
    if wanted and others:
        other = max((a for a in others if a < wanted), default=others[-1])
        text += f" (attempt {other} has output: `statequeue logs {h.item_id} --attempt {other}`)"
    return text


def _check_attempt(h: ItemHistory, attempt: int) -> None:
    """ItemNotFound unless the item has had attempt ``attempt``."""
    made = latest_attempt(h)
    if attempt > made:
        raise ItemNotFound(f"item {h.item_id} has no attempt {attempt} (it has {made})")
