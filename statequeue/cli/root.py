"""The `statequeue` group itself: the typer app, its global options, and running it.

Every command module registers its commands on ``app`` here. Nothing in this
module imports a command module, so a start that needs one command
(cli/command_table.py) imports that command's module alone, while cli/app.py
imports them all for help, completion and anything unusual.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, NoReturn

import click
import typer
from typer.core import TyperGroup

from statequeue.cli.errors import ReaderGone, run_guarded
from statequeue.cli.options import HomeOpt, QueueOpt, StoreOpt


class _Group(TyperGroup):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            # click would turn this into exit 1, the code for "an item failed".
            raise ReaderGone from exc


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


OWNS_PROCESS = False
"""True in the console command only (cli/main.py, called with no argv):
`run` may fork (run/guard.py), which a caller's process (a test calling
``main([...])`` or a CliRunner) must never see."""


def invoke(command: click.Command, argv: Sequence[str]) -> int:
    """Parse ``argv`` with ``command`` (the group) and run it; its exit code."""
    rv = command.main(args=list(argv), prog_name="statequeue", standalone_mode=False)
    return rv if isinstance(rv, int) else 0


def run_and_exit(build: Callable[[], click.Command], argv: Sequence[str]) -> NoReturn:
    """Build the click group and run it on ``argv`` as the console command:
    errors become one line and an exit code (cli/errors.py), then the process exits."""
    code = run_guarded(lambda args: invoke(build(), args), argv)
    if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if OWNS_PROCESS:
        exit_without_teardown(code)
    sys.exit(code)


def exit_without_teardown(code: int) -> NoReturn:
    """End the console command's process without the interpreter's teardown,
    which frees every object of every module one by one (~15 ms after `run`,
    a tenth of its start), but with what that teardown does that matters
    here: other non-daemon threads are waited for (a stats refresh writes its
    cache in one), atexit handlers run, the standard streams are flushed.
    Everything statequeue writes is on disk already (written, fsynced and
    closed before a command returns)."""
    threading = sys.modules.get("threading")  # not imported: no thread was started
    if threading is not None:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()  # what the interpreter calls at exit (there is no public name)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                code = code or 120  # as the interpreter exits when it cannot flush
    os._exit(code)
