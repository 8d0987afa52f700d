"""Option types shared by every command, and opening the queue they name."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from statequeue.cli.completion import complete_queue, complete_state
from statequeue.cli.render import print_notices
from statequeue.core.errors import UsageError
from statequeue.core.models import ItemState, item_state

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
STORE_KEY = "statequeue.store"


def _remember_store(ctx: typer.Context, value: str | None) -> str | None:
    # ctx.meta is shared by the whole command chain: a command's --store
    # (parsed after the global one) wins, as its --home and --queue do.
    if value == "":  # as `--home ''`: an unset variable, most often; never "the default"
        raise UsageError(
            "--store is empty: give a postgresql:// URL, or leave it out for the local journal"
        )
    if value is not None:
        ctx.meta[STORE_KEY] = value
    return value


StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        help="PostgreSQL store: postgresql://USER@HOST/DB or a libpq conninfo "
        "\\[env: STATEQUEUE_STORE; default: the local journal under --home].",
        show_default=False,
        callback=_remember_store,
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
    from statequeue.api.queue import Queue  # lazy: start-up time (the library)

    glob = ctx.obj or {}
    q = Queue(
        queue if queue is not None else glob.get("queue"),
        home=home if home is not None else glob.get("home"),
        create=create,
        auto_compact=auto_compact,
        store=store_url(ctx),
    )
    ctx.call_on_close(q.close)
    print_notices(q.notices())
    return q


def store_url(ctx: typer.Context) -> str | None:
    """The PostgreSQL store chosen by --store or $STATEQUEUE_STORE, or None."""
    from statequeue.store.opening import chosen_url  # lazy: start-up time (the store)

    return chosen_url(given_store(ctx))


def given_store(ctx: typer.Context) -> str | None:
    """--store as given (the command's, else the global one), or None."""
    given = ctx.meta.get(STORE_KEY)
    return given if isinstance(given, str) else None


StateOpt = Annotated[
    str | None,
    typer.Option(
        "--state",
        "-s",
        metavar="STATE",
        help="Only items in STATE: pending, running, done, failed, cancelled or held.",
        autocompletion=complete_state,
    ),
]


ResultStateOpt = Annotated[
    str | None,
    typer.Option(
        "--state",
        "-s",
        metavar="STATE",
        help="Only items in STATE: done or failed (only they have results).",
        autocompletion=complete_state,
    ),
]
"""``results --state``: it refuses the other states (exit 2), so its help names only these."""


def parse_state(value: str | None) -> ItemState | None:
    """``--state``: the library's check (UnknownState, a usage error, exit 2)."""
    return None if value is None else item_state(value)


ItemIdArg = Annotated[
    int | None,
    typer.Argument(help="The item id (see `statequeue list`).", min=1, show_default=False),
]
"""An item named by id (`show`, `logs`), or else by ``ItemTextOpt``."""
ItemTextOpt = Annotated[
    str | None,
    typer.Option("--item", metavar="TEXT", help="The item with exactly this text (not an id)."),
]
