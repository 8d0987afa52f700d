"""`statequeue report`: the queue's run as one self-contained HTML page."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Annotated

import typer

from statequeue.cli.options import HomeOpt, QueueOpt, StoreOpt, open_queue
from statequeue.cli.root import app
from statequeue.core.durations import parse_duration
from statequeue.core.output_path import (
    check_writable_place,
    creation_refused,
    open_in_place,
    output_failed,
    output_target,
)


@app.command()
def report(
    ctx: typer.Context,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Write the page to FILE ('-': stdout) \\[default: QUEUE-report.html here].",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DUR",
            help="Only attempts that ended in the last DUR (e.g. 30m, 2h, 1d).",
            show_default=False,
        ),
    ] = None,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Write an HTML report of the queue's runs: one file, no network needed.

    Counts and success rate, throughput over time, a timeline of attempts
    (one lane per runner slot), the duration histogram with p50/p90/p99,
    failures grouped by reason, and the slowest, most retried and
    interrupted items; details on hover. Works while the queue runs.
    Without -o it writes QUEUE-report.html in the current folder and prints
    its path. `statequeue help report` says what each chart answers.

    Example: statequeue report -q crawl -o crawl.html --since 1d
    """
    # lazy: start-up time (the page and its charts; only `report` needs them)
    from statequeue.cli.report_page import render_report

    window = None if since is None else parse_duration(since, limit=None)
    if window is not None and window >= time.time():
        window = None  # reaches back before 1970: every attempt
    q = open_queue(ctx, home, queue, create=False)
    target = Path(output if output is not None else f"{q.name}-report.html")
    if output == "-":
        sys.stdout.write(render_report(q.report(window)))
        return
    replaced, in_place = output_target(target)
    if in_place:  # /dev/null, a FIFO...: written through, never replaced
        page = render_report(q.report(window)).encode()
        try:
            with open(open_in_place(replaced), "wb") as out:
                out.write(page)
        except OSError as exc:
            raise output_failed("writing", replaced, exc) from None
    else:
        with _replacing(replaced) as out:  # fails before the work when FILE cannot be written
            out.write(render_report(q.report(window)).encode())
    print(target)


@contextmanager
def _replacing(target: Path) -> Iterator[IO[bytes]]:
    """A temporary file beside ``target`` (0600: item texts may be private)
    that replaces it when the block succeeds, so a reader sees the old report
    or the new one, never half of one; removed when the block fails. Errors
    name ``target``, not the temporary file."""
    check_writable_place(target)  # a folder, a missing folder: as `export -o` says them
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        refused = creation_refused(target, exc)  # /proc, a read-only folder: not the disk
        if refused is not None:
            raise refused from None
        raise output_failed("creating", target, exc) from None
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(temp, target)
    except OSError as exc:
        os.unlink(temp)
        raise output_failed("writing", target, exc) from None
    except BaseException:
        os.unlink(temp)
        raise
