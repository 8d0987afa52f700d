"""`statequeue db ...`: managing the PostgreSQL store's database."""

from __future__ import annotations

import typer

from statequeue.cli.options import JsonOpt, StoreOpt, store_url
from statequeue.cli.render import emit_json
from statequeue.cli.root import app
from statequeue.core.errors import UsageError

db_app = typer.Typer(
    help=(
        "Manage the PostgreSQL store's database (statequeue help postgres).\n\n"
        "Example: statequeue db migrate --store postgresql://sq@db.example/queues"
    ),
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")


@db_app.command()
def migrate(ctx: typer.Context, json: JsonOpt = False, store: StoreOpt = None) -> None:
    """Create or upgrade the statequeue schema in the database (enqueue creates it too).

    Example: statequeue db migrate --store postgresql://sq@db.example/queues
    """
    url = store_url(ctx)
    if url is None:
        raise UsageError("`db migrate` needs --store URL or STATEQUEUE_STORE")
    from statequeue.store.opening import migrate_postgres  # lazy: start-up time

    before, after = migrate_postgres(url)
    if json:
        emit_json({"schema": 1, "version_before": before, "version": after})
    elif before == after:
        typer.echo(f"schema is up to date (version {after})")
    else:
        typer.echo(f"schema migrated from version {before} to {after}")
