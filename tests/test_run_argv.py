"""Issue 27, start-up: a plain `run` is parsed without typer (cli/run_argv.py).

The fast parser must give exactly what typer gives (the same RunArgs and the
same queue), or hand the line to typer. Each command line below is parsed both
ways: by the fast parser and by the click command typer builds for `run`."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest

from statequeue.cli import run_command
from statequeue.cli.command_table import one_command_group
from statequeue.cli.run_argv import parse_run
from statequeue.cli.run_start import RUN_DEFAULTS

WHERE_NAMES = ("home", "queue", "store")


def typer_parse(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What typer passes to `run` for ``argv``, and the queue it opens
    (command options over global ones, as run_command.run takes them)."""
    group = one_command_group("run")
    ctx = group.make_context("statequeue", list(argv))
    with warnings.catch_warnings():  # click 8.2 renames protected_args; both hold the words
        warnings.simplefilter("ignore", DeprecationWarning)
        words = [*ctx.protected_args, *ctx.args]
    name, cmd, rest = group.resolve_command(ctx, words)
    assert name == "run" and cmd is not None
    sub = cmd.make_context("run", rest, parent=ctx)
    params = dict(sub.params)
    mine = {key: params.pop(key) for key in WHERE_NAMES}
    where = {key: ctx.params.get(key) if mine[key] is None else mine[key] for key in WHERE_NAMES}
    params["command"] = list(params["command"]) if params["command"] else None
    return params, where


PLAIN = [
    ["run", "--", "true"],
    ["run", "-q", "x", "--", "python", "w.py", "{}"],
    ["-q", "g", "run", "--", "true"],
    ["-q", "g", "--home", "/h", "run", "-q", "c", "--", "true"],
    ["--store", "postgresql://u@h/db", "run", "--", "true"],
    ["run", "-j", "4", "--", "true"],
    ["run", "-j4", "--quiet", "--", "true"],
    ["run", "--jobs", "16", "--no-live", "--json", "--", "sh", "-c", "sleep 0.02"],
    ["run", "--timeout", "10m", "--retries", "3", "--", "./fetch.sh", "{}"],
    ["run", "--verify", "test -s out/{/.}.json", "--verify-first", "--", "./convert", "{}"],
    ["run", "--single", "--quiet", "--max-time", "50m", "--", "./nightly", "{}"],
    ["run", "--shell", "--", "gzip -c {} > {}.gz"],
    ["run", "-j8", "--rate", "20/s", "--burst", "3", "--", "python", "call_api.py", "{}"],
    ["run", "--persistent", "-j", "4", "--recycle-rss", "2G", "--", "python", "worker.py"],
    ["run", "--recycle-after", "100", "--persistent", "--", "w"],
    ["run", "--limit", "1", "--exit-empty", "255", "--follow", "--", "true"],
    ["run", "--grace", "1s", "--retry-delay", "0", "--on-interrupted", "hold", "--", "t"],
    ["run", "--max-crashes", "2", "--halt-on-failure", "--stdin", "--", "cat"],
    ["run", "--live", "--no-auto-compact", "--log-limit", "0", "--", "t"],
    ["run", "--auto-compact", "--lease", "1m", "--give-up-after", "0", "--", "t"],
    ["run", "--max-deferrals", "9", "--json", "--home", "/h", "--store", "s", "--", "t", "--help"],
    ["run", "--", "-q", "x", "--jobs", "2"],  # after --: the command's words
    ["run", "--timeout", "", "--", "t"],
]


@pytest.mark.parametrize("argv", PLAIN, ids=lambda a: " ".join(a))
def test_the_fast_parser_gives_what_typer_gives(argv: list[str]) -> None:
    fast = parse_run(argv)
    assert fast is not None, "a plain line the fast parser should take"
    args, where = fast
    params, typer_where = typer_parse(argv)
    assert args == params
    assert {key: getattr(where, key) for key in WHERE_NAMES} == typer_where


NOT_PLAIN = [
    ["run", "true"],  # no --: typer's
    ["run", "--"],  # no command: typer's path says so
    ["run", "--help", "--", "t"],
    ["run", "-h", "--", "t"],
    ["run", "--jobs=4", "--", "t"],
    ["run", "-j", "4", "-j", "2", "--", "t"],  # twice
    ["run", "--quiet", "--quiet", "--", "t"],
    ["run", "-q", "a", "-q", "b", "--", "t"],
    ["-q", "a", "-q", "b", "run", "--", "t"],
    ["run", "-j", "+4", "--", "t"],  # click's int() takes it; we leave it to click
    ["run", "-j", "x", "--", "t"],
    ["run", "-j", "-1", "--", "t"],
    ["run", "--limit", "0", "--", "t"],  # typer's min=1 refuses it
    ["run", "--exit-empty", "256", "--", "t"],  # typer's max=255
    ["run", "--timeout", "--", "t"],  # the value looks like an option
    ["run", "--unknown", "--", "t"],
    ["--version", "run", "--", "t"],
    ["status"],
    ["enqueue", "run"],
    ["run", "-j"],
]


@pytest.mark.parametrize("argv", NOT_PLAIN, ids=lambda a: " ".join(a))
def test_anything_else_goes_to_typer(argv: list[str]) -> None:
    assert parse_run(argv) is None


def test_the_defaults_are_typers() -> None:
    sig = inspect.signature(run_command.run)
    declared = {
        name: p.default for name, p in sig.parameters.items() if name not in ("ctx", *WHERE_NAMES)
    }
    assert declared == RUN_DEFAULTS
