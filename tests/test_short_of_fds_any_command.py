"""Any command short of fds, processes or memory: one line and exit 10.

Found by an outside tester: `(ulimit -n 8; statequeue -q m status)` said
`statequeue: error: .../journal.jsonl: Too many open files` and exited 6,
"a write or fsync failed", though nothing was written: only `run` turned a
shortage into exit 10 (ExitCode.RESOURCES). Now every command does (EMFILE,
ENFILE, EAGAIN of a fork, ENOMEM), with what to raise or free; a write that
would block on a full non-blocking pipe (EAGAIN too) is no shortage.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence

import pytest

from statequeue.cli.errors import run_guarded
from statequeue.core.errors import DurabilityError
from statequeue.core.exitcodes import ExitCode
from statequeue.core.fileio import durability_error
from tests.test_run_short_of_fds import sq

COMMANDS = (("status",), ("status", "--json"), ("list",), ("enqueue", "c"), ("show", "1"))


def test_every_low_fd_limit_is_one_line_and_exit_10(sq_env: dict[str, str]) -> None:
    """Each limit from where the interpreter starts up to where the command
    works fails at another step (the queue's folders, its journal, ...)."""
    assert sq(sq_env, "-q", "m", "enqueue", "a", "b").returncode == 0
    for command in COMMANDS:
        short = 0
        for fds in range(5, 40):
            done = sq(sq_env, "-q", "m", *command, fds=fds)
            if done.returncode == 0:
                break
            assert done.returncode == ExitCode.RESOURCES, (command, fds, done.stderr)
            (line,) = done.stderr.splitlines()
            assert "Too many open files" in line and "`ulimit -n`" in line, (command, line)
            assert "Traceback" not in done.stderr
            short += 1
        else:
            raise AssertionError(f"{command}: no limit up to 40 fds worked")
        assert short >= 3, (command, short)  # the issue's `ulimit -n 8` among them
    status = json.loads(sq(sq_env, "-q", "m", "status", "--json").stdout)
    assert status["counts"]["pending"] == 3  # a, b and the one enqueue that worked


@pytest.mark.parametrize(
    ("err", "remedy"),
    [
        (OSError(errno.EMFILE, os.strerror(errno.EMFILE)), "`ulimit -n`"),
        (OSError(errno.ENFILE, os.strerror(errno.ENFILE)), "open-file table is full"),
        (OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)), "free some memory"),
        (BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)), "`ulimit -u`"),  # a fork
    ],
)
def test_each_shortage_is_exit_10_with_its_remedy(
    capsys: pytest.CaptureFixture[str], err: OSError, remedy: str
) -> None:
    def call(argv: Sequence[str]) -> int:
        raise err

    assert run_guarded(call, []) == ExitCode.RESOURCES
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("statequeue: error: ") and remedy in line, line


def test_a_write_that_would_block_is_no_shortage(capsys: pytest.CaptureFixture[str]) -> None:
    def call(argv: Sequence[str]) -> int:
        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN), 10)

    assert run_guarded(call, []) == ExitCode.IO_ERROR
    assert "ulimit" not in capsys.readouterr().err


def test_a_write_short_of_fds_is_exit_10_not_a_disk_failure() -> None:
    short = durability_error("compacting", "/q", OSError(errno.EMFILE, "Too many open files"))
    assert isinstance(short, DurabilityError) and short.exit_code == ExitCode.RESOURCES
    assert "`ulimit -n`" in short.message
    full = durability_error("appending to", "/q", OSError(errno.ENOSPC, "No space left"))
    assert full.exit_code == ExitCode.IO_ERROR and "disk full" in full.message
