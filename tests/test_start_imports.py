"""Issue 27, start-up: `statequeue enqueue` imports only what it uses.

Shell loops run `statequeue enqueue "$f"` thousands of times, so its start is
most of their cost. Each test runs the real installed command (or the
library) in a subprocess under ``python -X importtime``, which names every
module the process imported, and fails when a heavy one is among them: the
terminal UI (rich), the full CLI (typer, click), PostgreSQL (psycopg),
compaction, the stats cache and figures, the report, the runner. The figure
itself is measured by scripts/bench_start.py, not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]

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


def heavy_among(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(f"{h}.") for h in HEAVY))


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
        (["-q", "q", "enqueue", "--json", "x"], b"", '{"added":1,"skipped":0}'),
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
