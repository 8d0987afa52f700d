"""Which module registers each command, and a start that builds only the one invoked.

Building the click group of every command (typer reads each function's
signature and type hints: 24 commands, over 100 parameters) and importing
every command module cost more than the rest of a short `statequeue run`'s
start. When argv names a command after nothing but the global options, only
its module is imported and the group holds only its command (and the global
options, with the same callback), so parsing, errors and exit codes are the
full CLI's. Help, completion, unknown commands ("Did you mean ...?") and
anything unusual go to the full CLI (cli/app.py), which imports every module
in this table, in this order (the order `statequeue --help` lists them).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

import click
import typer
from typer.models import CommandInfo

from statequeue.cli.root import app

_QUEUE = "statequeue.cli.queue_cmds"
_INSPECT = "statequeue.cli.inspect_cmds"
_MANAGE = "statequeue.cli.manage_cmds"
_TRANSFER = "statequeue.cli.transfer_cmds"

COMMANDS: dict[str, str] = {
    "enqueue": _QUEUE,
    "status": _QUEUE,
    "compact": _QUEUE,
    "help": "statequeue.cli.help_cmd",
    "list": _INSPECT,
    "show": _INSPECT,
    "logs": "statequeue.cli.logs_cmd",
    "results": _INSPECT,
    "queues": _INSPECT,
    "path": _INSPECT,
    "events": _INSPECT,
    "retry": _MANAGE,
    "cancel": _MANAGE,
    "pause": _MANAGE,
    "resume": _MANAGE,
    "fsck": _MANAGE,
    "drop": _MANAGE,
    "rm": _MANAGE,
    "report": "statequeue.cli.report_cmd",
    "run": "statequeue.cli.run_command",
    "stats": "statequeue.cli.stats_cmd",
    "export": _TRANSFER,
    "import": _TRANSFER,
    "db": "statequeue.cli.db_cmds",  # a group of commands (typer's add_typer)
}
"""Each command's name -> the module whose import registers it on cli/root.py's ``app``."""

_FULL_ONLY = frozenset({"help"})  # walks every command's help: needs them all
_GLOBAL_VALUED = frozenset({"--home", "--store", "--queue", "-q"})
_GLOBAL_JOINED = ("--home=", "--store=", "--queue=")
_HELP = frozenset({"-h", "--help"})
_COMPLETION_ENV = "_STATEQUEUE_COMPLETE"  # click's shell completion (`--show-completion`)


def command_in(args: Sequence[str]) -> str | None:
    """The command ``args`` name, if a group holding only it parses them as
    the full CLI would; None for help, completion or anything unusual."""
    if _COMPLETION_ENV in os.environ:
        return None
    if any(arg in _HELP for arg in args[: _end_of_options(args)]):
        return None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _GLOBAL_VALUED:
            i += 2
        elif arg.startswith(_GLOBAL_JOINED) or (arg.startswith("-q") and len(arg) > 2):
            i += 1  # --home=DIR, -qNAME: option and value in one word
        elif arg.startswith("-"):
            return None  # --version, completion options, a typo: the full CLI's
        else:
            return arg if arg in COMMANDS and arg not in _FULL_ONLY else None
    return None


def _end_of_options(args: Sequence[str]) -> int:
    # After `--` no word is an option (`run -- grep -h x {}`): its -h is the child's.
    return args.index("--") if "--" in args else len(args)


def command_name(info: CommandInfo) -> str:
    """The name a registered command is invoked by (typer's own rule)."""
    if info.name:
        return info.name
    assert info.callback is not None  # every command here is a decorated function
    return typer.main.get_command_name(info.callback.__name__)


def import_command_module(module: str) -> None:
    """Import ``module`` (its import registers its commands on ``app``).

    Through ``__import__``, the import statement's own path: importlib's
    ``import_module`` bypasses it, so ``python -X importtime`` (what
    tests/test_start_imports.py reads) would not list the module."""
    __import__(module)


def register_all() -> None:
    """Import every command module (once each, in the table's order): all commands on ``app``."""
    for module in dict.fromkeys(COMMANDS.values()):
        import_command_module(module)
    # The help lists commands in registration order; a process that ran one
    # command alone first (one_command_group) registered that one first.
    order = {name: i for i, name in enumerate(COMMANDS)}  # one not in it (a test fails): last
    app.registered_commands.sort(key=lambda info: order.get(command_name(info), len(order)))


def full_group() -> click.Command:
    """The `statequeue` group with every command."""
    register_all()
    return typer.main.get_command(app)


def one_command_group(name: str) -> click.Command:
    """The `statequeue` group with the global options and command ``name`` only."""
    import_command_module(COMMANDS[name])  # registers its commands on ``app``
    lean = copy.copy(app)  # the same settings, group class and global callback
    lean.registered_commands = [c for c in app.registered_commands if command_name(c) == name]
    lean.registered_groups = [g for g in app.registered_groups if g.name == name]
    return typer.main.get_command(lean)
