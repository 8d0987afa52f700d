"""The `statequeue` group itself: the typer app, its global options, and running it.

Every command module registers its commands on ``app`` here. Nothing in this
module imports a command module, so a start that needs one command
(cli/command_table.py) imports that command's module alone, while cli/app.py
imports them all for help, completion and anything unusual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, NoReturn

import click
import typer
from typer.core import TyperGroup

from statequeue.cli import process
from statequeue.cli.errors import Interrupted, ReaderGone, run_guarded
from statequeue.cli.options import HomeOpt, QueueOpt, StoreOpt


class _Group(TyperGroup):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            # click would turn this into exit 1, the code for "an item failed".
            raise ReaderGone from exc
        except KeyboardInterrupt as exc:
            raise Interrupted from exc  # typer's would be a silent exit 130


app = typer.Typer(
    name="statequeue",
    cls=_Group,
    help=(
        "A resumable, crash-safe work queue for the shell.\n\n"
        "Example: find . -name '*.pdf' | statequeue enqueue && "
        "statequeue run -- python worker.py {}"
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    suggest_commands=False,  # click already says "Did you mean ...?"
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version  # lazy: start-up time (only --version)

        print(f"statequeue {version('statequeue')}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    ctx.obj = {"home": home, "queue": queue}


def invoke(command: click.Command, argv: Sequence[str]) -> int:
    """Parse ``argv`` with ``command`` (the group) and run it; its exit code."""
    rv = command.main(args=list(argv), prog_name="statequeue", standalone_mode=False)
    return rv if isinstance(rv, int) else 0


def run_and_exit(build: Callable[[], click.Command], argv: Sequence[str]) -> NoReturn:
    """Build the click group and run it on ``argv`` as the console command:
    errors become one line and an exit code (cli/errors.py), then the process exits."""
    process.end(run_guarded(lambda args: invoke(build(), args), argv))
