"""Issue 27, start-up: a command named on the command line is built alone
(cli/command_table.py), from one table of command -> module.

The table must name every registered command with the module that registers
it (else that command's lean start would import the wrong module and fail);
the group built for one command must parse exactly as the full group does;
which argv take the lean start is checked word by word; and the help lists
the commands in the same order whichever start came first in a process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from statequeue.cli.app import app
from statequeue.cli.command_table import (
    COMMANDS,
    command_in,
    command_name,
    full_group,
    one_command_group,
)

Env = dict[str, str]


def registered() -> Iterator[tuple[str, str]]:
    """(name, module) of every command and command group on the full app."""
    for info in app.registered_commands:
        assert info.callback is not None
        yield command_name(info), info.callback.__module__
    for group in app.registered_groups:
        sub = group.typer_instance
        assert group.name is not None and sub is not None
        callbacks = [c.callback for c in sub.registered_commands if c.callback is not None]
        yield group.name, callbacks[0].__module__


def test_the_table_names_every_command_with_its_module() -> None:
    found = dict(registered())
    assert len(found) == len(list(registered()))  # no name registered twice
    assert found == COMMANDS  # a new command, or one moved to another module, fails here


def test_the_table_is_the_full_groups_command_list_in_order() -> None:
    assert list(full_group().commands) == list(COMMANDS)  # type: ignore[attr-defined]  # a group


def _info(command: click.Command) -> dict[str, object]:
    with click.Context(command, info_name=command.name) as ctx:
        return command.to_info_dict(ctx)


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "help"])
def test_one_commands_group_parses_as_the_full_group(name: str) -> None:
    lean = one_command_group(name)
    full = full_group()
    assert isinstance(lean, click.Group) and isinstance(full, click.Group)
    assert list(lean.commands) == [name]
    assert _info(lean.commands[name]) == _info(full.commands[name])
    # The global options, callback and settings are the full group's.
    lean_top, full_top = _info(lean), _info(full)
    lean_top.pop("commands"), full_top.pop("commands")
    assert lean_top == full_top
    assert lean.callback is not None and full.callback is not None
    assert lean.context_settings == full.context_settings
    assert type(lean) is type(full)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["run", "--", "true"], "run"),
        (["-q", "q", "run", "--no-live", "--", "true"], "run"),
        (["--home", "h", "--store", "s", "--queue", "q", "status", "--watch"], "status"),
        (["--home=h", "--queue=q", "--store=s", "stats"], "stats"),
        (["-qq", "show", "1"], "show"),
        (["run", "--", "grep", "-h", "x", "{}"], "run"),  # the child's -h
        (["db", "migrate"], "db"),
        (["rm", "old", "--yes"], "rm"),
        (["import", "f.jsonl"], "import"),
        ([], None),
        (["help"], None),  # walks every command
        (["help", "commands"], None),
        (["--help"], None),
        (["-h", "run"], None),
        (["run", "--help"], None),
        (["run", "-h", "--", "true"], None),
        (["--version"], None),
        (["--show-completion"], None),
        (["rnu"], None),  # "Did you mean 'run'?" needs every name
        (["-q"], None),
        (["-q", "q"], None),
        (["--bogus", "run"], None),
        (["--", "run"], None),
    ],
)
def test_which_argv_start_one_command(args: list[str], name: str | None) -> None:
    assert command_in(args) == name


def test_shell_completion_takes_the_full_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_STATEQUEUE_COMPLETE", "bash_complete")
    assert command_in(["run", "--", "true"]) is None


def test_the_help_order_does_not_depend_on_which_start_came_first(tmp_path: Path) -> None:
    """A process that built `run` alone first (a test, a library caller) still
    lists the commands in the table's order."""
    code = (
        "from statequeue.cli.command_table import one_command_group, full_group\n"
        "one_command_group('run')\n"
        "print(' '.join(full_group().commands))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == list(COMMANDS)
