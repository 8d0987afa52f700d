"""`statequeue enqueue`, `status` and `compact`: the commands on the queue as a whole."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from statequeue.cli.input import open_to_enqueue, read_input
from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, StoreOpt, open_queue
from statequeue.cli.render import (
    emit_json,
    human_bytes,
    plural,
    running_texts,
    status_text,
)
from statequeue.cli.root import app
from statequeue.core.durations import parse_duration
from statequeue.core.errors import InvalidItem, UsageError

MAX_INTERVAL = 86400.0  # seconds: --interval of `status --watch`, at most a day


@app.command()
def enqueue(
    ctx: typer.Context,
    items: Annotated[
        list[str] | None, typer.Argument(help="Items to add.", show_default=False)
    ] = None,
    null: Annotated[
        bool, typer.Option("--null", "-0", help="Items on stdin or in --file end with NUL.")
    ] = False,
    file: Annotated[
        str | None,
        typer.Option("--file", "-f", metavar="PATH", help="Read items from PATH ('-' for stdin)."),
    ] = None,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Add items to the queue; items already in it (in any state) are skipped.

    With no ITEM arguments, items are read from stdin (or --file), one per line.

    Example: find . -name '*.pdf' -print0 | statequeue enqueue -0
    """
    texts, positions = read_input(items or [], file=file, null=null)
    q = open_to_enqueue(
        lambda create: open_queue(ctx, home, queue, create=create), texts, positions
    )
    try:
        result = q.enqueue(texts)
    except InvalidItem as exc:
        raise positions.locate(exc) from None
    if json:
        emit_json({"schema": 1, "added": result.added, "skipped": result.skipped})
    else:
        print(f"added {result.added}, skipped {result.skipped} already queued")


@app.command()
def status(
    ctx: typer.Context,
    json: JsonOpt = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh every --interval until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.1)] = 1.0,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Show counts per state, progress, rate and ETA, runners and recent failures.

    Example: statequeue status --json | jq .counts
    """
    if not math.isfinite(interval) or interval > MAX_INTERVAL:
        # nan passes click's min=0.1, then time.sleep(nan) raised; 1e10 overflowed time_t
        raise UsageError(
            f"--interval must be a finite number of seconds up to {MAX_INTERVAL:g} (a day),"
            f" not {interval}"
        )
    q = open_queue(ctx, home, queue, create=False)
    if watch:
        from statequeue.cli.watch import watch_status  # lazy: start-up time (stats, rich)

        watch_status(q, interval=interval, json=json)
        return
    st = q.status()
    if json:
        emit_json(st.to_json())
    else:
        print(status_text(st, running_texts(q, st)))


@app.command()
def compact(
    ctx: typer.Context,
    keep_logs: Annotated[
        str,
        typer.Option(
            help="Remove the logs of archived items older than this (0: all of them now).",
            metavar="DUR",
        ),
    ] = "7d",
    json: JsonOpt = False,
    home: HomeOpt = None,
    queue: QueueOpt = None,
    store: StoreOpt = None,
) -> None:
    """Rewrite the journal as a snapshot; finished results move to the archive.

    Safe while runners and enqueuers are active. Dedupe still holds afterwards.
    The queue is locked only briefly at the start and the end, not meanwhile.

    Example: statequeue compact -q crawl --keep-logs 1d
    """
    keep = parse_duration(keep_logs)
    q = open_queue(ctx, home, queue, create=False)
    r = q.compact(keep_logs=keep)
    logs = r.logs_removed
    removed = (
        f"; removed {plural(logs.files, 'log')} of archived items ({human_bytes(logs.bytes)})"
        if logs.files
        else ""
    )
    if json:
        emit_json(
            {
                "schema": 1,  # as every --json object
                "bytes_before": r.bytes_before,
                "bytes_after": r.bytes_after,
                "archived": r.archived,
                "archive_bytes": r.archive_bytes,
                "rows_moved": r.rows_moved,
                "logs_removed": logs.files,
                "log_bytes_removed": logs.bytes,
            }
        )
    elif r.rows_moved is not None:  # a PostgreSQL store: rows, not a journal file
        print(
            f"archived {plural(r.archived, 'finished item')} "
            f"({plural(r.rows_moved, 'row')} moved to the archive tables){removed}"
        )
    else:
        print(
            f"journal {human_bytes(r.bytes_before)} -> {human_bytes(r.bytes_after)}; "
            f"archived {plural(r.archived, 'finished item')} "
            f"(archive {human_bytes(r.archive_bytes)}){removed}"
        )
