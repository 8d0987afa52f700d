"""The full `statequeue` command: every command registered, for help,
completion and any invocation cli/command_table.py does not take alone.

Thin: parse, call the library, render, exit. typer and rich are imported in
cli/ and nowhere in the library; rich only when something is drawn on a
terminal (start-up time matters in shell loops).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from statequeue.cli.command_table import full_group, register_all
from statequeue.cli.errors import fail
from statequeue.cli.render import err
from statequeue.cli.root import app, invoke, run_and_exit
from statequeue.core.exitcodes import ExitCode

register_all()


def _invoke(argv: Sequence[str]) -> int:
    return invoke(full_group(), argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    run_and_exit(full_group, list(sys.argv[1:] if argv is None else argv))


__all__ = ["ExitCode", "app", "err", "fail", "main"]
