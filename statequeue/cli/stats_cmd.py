"""`statequeue stats`: what a long run did, at a glance."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, StoreOpt, open_queue
from statequeue.cli.render import emit_json, use_color, worker_lines
from statequeue.cli.root import app
from statequeue.cli.stats_names import stats_names
from statequeue.cli.stats_view import plain_text, print_rich
from statequeue.core.durations import parse_duration


@app.command()
def stats(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DUR",
            help="Only attempts that ended in the last DUR (e.g. 30m, 2h, 1d).",
            show_default=False,
        ),
    ] = None,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Show durations, throughput, rate and ETA, failure reasons and the slowest items.

    Durations (p50/p90/p99, histogram), throughput, rate and ETA, failure
    reasons, the slowest items, and runners and hosts, over the live journal
    and the archive. Quantiles are within 1%; memory stays flat on any size.
    A summary is cached (stats.ckpt) where it still matches the files, so a
    later stats, or the first after `compact`, reads only what came since.

    --json prints the same figures under the schema "statequeue.stats/1".

    Example: statequeue stats --since 2h
    """
    window = None if since is None else parse_duration(since, limit=None)
    if window is not None and window >= time.time():
        window = None  # reaches back before 1970: every attempt, said as such
    q = open_queue(ctx, home, queue, create=False)
    figures = q.stats(window)
    runners = [r for r in q.store.active_runners() if r.workers]  # live `run --persistent`
    if json:
        found = figures.to_json()
        if runners:  # only then: otherwise the schema's keys stay as they were
            found["workers"] = [
                dict(w.to_json(), runner=r.runner_id) for r in runners for w in r.workers
            ]
        emit_json(found)
        return
    names = stats_names(q, figures)
    if use_color(sys.stdout):
        print_rich(figures, names)
    else:
        sys.stdout.write(plain_text(figures, names) + "\n")
    if runners:
        lines = ["persistent workers (live):"] + [x for r in runners for x in worker_lines(r)]
        sys.stdout.write("\n".join(lines) + "\n")
