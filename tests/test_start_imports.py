"""Issue 27, start-up: `statequeue enqueue`, `run` and the other commands import only what they use.

Shell loops run `statequeue enqueue "$f"` thousands of times, so its start is
most of their cost. Each test runs the real installed command (or the
library) in a subprocess under ``python -X importtime``, which names every
module the process imported, and fails when a heavy one is among them: the
terminal UI (rich), the full CLI (typer, click), PostgreSQL (psycopg),
compaction, the stats cache and figures, the report, the runner. `run` and
the other commands through typer (cli/command_table.py: the invoked command
alone) must not import rich, typer's rich help, PostgreSQL, compaction, the
stats machinery, the report, nor another command's module. The figures
themselves are measured by scripts/bench_start.py, not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]

# Compaction, checking and the stats machinery: no plain command's work
# (background_compaction is imported once a compaction is due).
STORE_EXTRAS = (
    "statequeue.store.journal.online_compaction",
    "statequeue.store.journal.background_compaction",
    "statequeue.store.journal.compaction",
    "statequeue.store.journal.compaction_logs",
    "statequeue.store.journal.fsck",
    "statequeue.store.journal.stats_cache",
    "statequeue.store.journal.attempt_scan",
    "statequeue.store.journal.archive_index",
    "statequeue.stats.figures",
    "statequeue.stats.rates",
    "statequeue.stats.sketch",
    "statequeue.stats.report_model",
    "statequeue.stats.report_fold",
    "statequeue.stats.histogram",
)

# Module names (a name, or a package and everything under it) that `enqueue` must not import.
HEAVY = (
    "rich",
    "typer",
    "click",
    "psycopg",
    "asyncio",
    "subprocess",  # starts compaction children and runs commands: neither is enqueue's
    "statequeue.cli.app",
    "statequeue.cli.report_page",
    "statequeue.cli.report_charts",
    "statequeue.run",
    "statequeue.store.postgres",
    *STORE_EXTRAS,
)


def imported_modules(argv: list[str], env: Env, stdin: bytes = b"") -> tuple[set[str], str]:
    """The modules ``argv`` (a Python script or ``-c CODE``) imported, and its stdout."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        input=stdin,
        env=env,
        cwd=Path(env["STATEQUEUE_HOME"]).parent,  # not the checkout: `-c` imports from the cwd
        capture_output=True,
        timeout=120,
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 0, err[-2000:]
    names = {
        line.rpartition("|")[2].strip()
        for line in err.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return names, done.stdout.decode()


def heavy_among(names: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(f"{h}.") for h in heavy))


@pytest.fixture
def existing_queue(sq_env: Env) -> Env:
    """``sq_env`` with queue ``q`` already holding a few items."""
    first = subprocess.run(
        [STATEQUEUE, "enqueue", "-q", "q", "a", "b"], env=sq_env, capture_output=True, check=False
    )
    assert first.returncode == 0, first.stderr
    return sq_env


@pytest.mark.parametrize(
    ("args", "stdin", "shown"),
    [
        (["enqueue", "-q", "q", "x"], b"", "added 1, skipped 0 already queued"),
        (["enqueue", "-q", "q", "a"], b"", "added 0, skipped 1 already queued"),
        (["-q", "q", "enqueue", "--json", "x"], b"", '{"schema":1,"added":1,"skipped":0}'),
        (["enqueue", "-q", "q"], b"x\ny\na\n", "added 2, skipped 1 already queued"),
        (["enqueue", "-q", "new"], b"x\n", "added 1, skipped 0 already queued"),
    ],
    ids=["one-item", "already-queued", "json", "stdin", "new-queue"],
)
def test_enqueue_imports_nothing_heavy(
    existing_queue: Env, args: list[str], stdin: bytes, shown: str
) -> None:
    names, out = imported_modules([STATEQUEUE, *args], existing_queue, stdin)
    assert out.strip() == shown  # it did its work
    assert "statequeue.store.journal.store" in names  # the check sees the package's modules
    assert heavy_among(names) == []


def test_library_enqueue_imports_nothing_heavy(existing_queue: Env, sq_home: Path) -> None:
    code = "from statequeue import Queue\nwith Queue('q') as q:\n    print(q.enqueue(['x']).added)"
    names, out = imported_modules(["-c", code], existing_queue)
    assert out.strip() == "1"
    assert heavy_among(names) == []


def test_the_check_sees_a_heavy_import(existing_queue: Env) -> None:
    """The check fails when a heavy module is imported: the full CLI's help does import them."""
    names, out = imported_modules([STATEQUEUE, "enqueue", "--help"], existing_queue)
    assert "Usage" in out
    assert "typer" in heavy_among(names)


# What no command through typer imports unless it is the command's own work
# (`stats`, `report`, `compact`, --store, `status --watch`).
OPTIONAL = (
    "rich",
    "typer.rich_utils",  # typer's rich help and errors
    "psycopg",
    "asyncio",
    "statequeue.store.postgres",
    "statequeue.run.persistent",  # --persistent only
    *STORE_EXTRAS,
)
# The cli/ modules every command through typer needs: the group, its global
# options, errors and rendering. Any other cli/ module is another command's.
TYPER_CLI = {
    "statequeue.cli",
    "statequeue.cli.main",
    "statequeue.cli.command_table",
    "statequeue.cli.root",
    "statequeue.cli.errors",
    "statequeue.cli.options",
    "statequeue.cli.completion",
    "statequeue.cli.render",
    "statequeue.cli.clock",
    "statequeue.cli.process",
}


def other_cli(names: set[str], own: set[str]) -> list[str]:
    """The cli/ modules among ``names`` that are neither shared nor ``own``."""
    allowed = TYPER_CLI | own
    return sorted(n for n in names if n.startswith("statequeue.cli.") and n not in allowed)


def sq(env: Env, *args: str) -> None:
    done = subprocess.run([STATEQUEUE, "-q", "q", *args], env=env, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("pending", [0, 1], ids=["nothing-to-do", "one-item"])
def test_a_plain_run_imports_neither_typer_nor_click(existing_queue: Env, pending: int) -> None:
    # cli/run_argv.py parses it: typer and click are ~30 ms of run's start.
    sq(existing_queue, "run", "--no-live", "--", "true")  # a and b done
    if pending:
        sq(existing_queue, "enqueue", "c")
    argv = [STATEQUEUE, "-q", "q", "run", "--no-live", "-j", "2", "--json", "--", "true"]
    names, out = imported_modules(argv, existing_queue)
    assert f'"succeeded":{pending},' in out  # it did its work
    # The runner's own imports, after the guard's fork, are seen too.
    assert {"statequeue.cli.run_start", "statequeue.run.runner"} <= names
    # Nor what only --verify, --shell, a failure or a deferral needs.
    only_some = ("subprocess", "tempfile", "shutil", "statequeue.api.work")
    only_some += ("statequeue.run.worker_process", "statequeue.run.protocol")  # --persistent
    assert (
        heavy_among(names, ("typer", "click", "statequeue.cli.root", *only_some, *OPTIONAL)) == []
    )
    own = {"statequeue.cli.run_argv", "statequeue.cli.run_start", "statequeue.cli.progress"}
    assert other_cli(names, own) == []


def test_run_through_typer_imports_only_what_it_uses(existing_queue: Env) -> None:
    # --jobs=1 is not the fast parser's (cli/run_argv.py): typer parses it.
    argv = [STATEQUEUE, "-q", "q", "run", "--jobs=1", "--json", "--", "true"]
    names, out = imported_modules(argv, existing_queue)
    assert '"succeeded":2,' in out  # it did its work
    assert {"statequeue.cli.run_command", "typer", "statequeue.run.runner"} <= names
    assert heavy_among(names, OPTIONAL) == []
    own = {"statequeue.cli.run_command", "statequeue.cli.run_start", "statequeue.cli.progress"}
    own.add("statequeue.cli.run_argv")
    assert other_cli(names, own) == []


@pytest.mark.parametrize(
    ("args", "shown", "own"),
    [
        (["show", "1"], "item 1: a", {"inspect_cmds", "event_text", "attempt_numbers"}),
        (["list"], "a", {"inspect_cmds", "event_text", "attempt_numbers"}),
        (["logs", "1", "--json"], '"schema"', {"logs_cmd", "logs_all", "attempt_numbers"}),
        (["retry", "--failed"], "", {"manage_cmds"}),
        (["cancel", "2"], "", {"manage_cmds"}),
        (["status", "--json", "--home", "."], '"schema"', {"queue_cmds", "input"}),
    ],
    ids=["show", "list", "logs", "retry", "cancel", "status-not-fast"],
)
def test_a_command_imports_only_its_own_module(
    existing_queue: Env, args: list[str], shown: str, own: set[str]
) -> None:
    env = existing_queue
    if args[0] == "status":  # --home twice: not the fast path's, typer's
        args = ["--home", env["STATEQUEUE_HOME"], *args[:2], "--home", env["STATEQUEUE_HOME"]]
    names, out = imported_modules([STATEQUEUE, "-q", "q", *args], env)
    assert shown in out
    assert "typer" in names  # through typer, not main.py's fast path
    assert heavy_among(names, OPTIONAL) == []
    assert other_cli(names, {f"statequeue.cli.{m}" for m in own}) == []
