"""Option types shared by every command, and opening the queue they name."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from statequeue.cli.completion import complete_queue

HomeOpt = Annotated[
    str | None,
    typer.Option(
        "--home",
        metavar="DIR",
        # The backslash stops rich from reading the brackets as markup.
        help="Folder holding the queues \\[env: STATEQUEUE_HOME; default: the user data dir].",
        show_default=False,
    ),
]
QueueOpt = Annotated[
    str | None,
    typer.Option(
        "--queue",
        "-q",
        metavar="NAME",
        help="Queue name \\[env: STATEQUEUE_QUEUE; default: default].",
        show_default=False,
        autocompletion=complete_queue,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def open_queue(
    ctx: typer.Context,
    home: str | None,
    queue: str | None,
    *,
    create: bool,
    auto_compact: int | None = None,
) -> Any:
    """Open the queue named on the command line (command options win over global ones)."""
    from statequeue.queue import Queue

    glob = ctx.obj or {}
    q = Queue(
        queue if queue is not None else glob.get("queue"),
        home=home if home is not None else glob.get("home"),
        create=create,
        auto_compact=auto_compact,
    )
    ctx.call_on_close(q.close)
    from statequeue.cli.render import print_notices

    print_notices(q.notices())
    return q
