"""Moving a queue between stores: export and import."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, StoreOpt, open_queue
from statequeue.cli.render import emit_json, plural
from statequeue.cli.root import app
from statequeue.core.errors import NotFound, UsageError


@app.command()
def export(
    ctx: typer.Context,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write to FILE (whole or not at all)."),
    ] = None,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Write the queue (items, states, attempts, results) as NDJSON, for `import`.

    Archived items are included; a running item is written as pending (interrupted).

    Example: statequeue export -q crawl -o crawl.ndjson
    """
    q = open_queue(ctx, home, queue, create=False)
    if output is None or output == "-":
        q.export(sys.stdout.buffer)
        return
    count = q.export(output)
    print(f"exported {plural(count, 'item')} of queue {q.name!r} to {output}", file=sys.stderr)


@app.command(name="import")
def import_(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(metavar="FILE", help="An export ('-' for stdin).")] = "-",
    merge: Annotated[
        bool,
        typer.Option("--merge", help="Add only the items the queue lacks (by exact bytes)."),
    ] = False,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Read an export into the queue (created if missing), keeping ids, states and results.

    A queue holding items the export lacks is refused unless --merge. Running
    the same import again after it was interrupted completes it.

    Example: statequeue export -q crawl | statequeue --store postgresql:///jobs import -q crawl
    """
    from statequeue.api.transfer import read_export  # lazy: start-up time (the library)

    # Checked whole before the queue is opened: bad input creates nothing.
    checked = read_export(_open_input(file))
    q = open_queue(ctx, home, queue, create=True)
    result = q.import_(checked, merge=merge)
    if json:
        emit_json(
            {
                "schema": 1,
                "added": result.added,
                "skipped": result.skipped,
                "paused": result.paused,
            }
        )
    else:
        print(f"imported {result.added}, skipped {result.skipped} already in queue {q.name!r}")


def _open_input(file: str) -> list[bytes]:
    """Every line of FILE (or stdin), read before the queue is opened; a line
    past the import's bound is refused once that much is read, not held."""
    from statequeue.api.transfer import export_file_lines  # lazy: start-up time

    if file == "-":
        return list(export_file_lines(sys.stdin.buffer))
    try:
        with open(file, "rb") as f:
            return list(export_file_lines(f))
    except FileNotFoundError:
        raise NotFound(f"no such file: {file}") from None
    except IsADirectoryError:  # bad input, as `export -o FOLDER` is; not exit 6, a failing disk
        raise UsageError(f"{file} is a folder: name an export file") from None
