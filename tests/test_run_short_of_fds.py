"""`run` short of file descriptors before its first child (issue 21, the EMFILE point).

Under `ulimit -n 12` it printed `statequeue: error:: Too many open files` and
exited 6 ("a write or fsync failed"). Running out of fds anywhere in a run
(opening the queue, the runner's own pipes, its lock, a spawn) is one clean
line and exit 10, as for EMFILE at a spawn, and the queue is left as it was.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Sequence

import pytest

from statequeue.cli.errors import run_guarded
from tests.conftest import STATEQUEUE

RESOURCES = 10  # ExitCode.RESOURCES


def sq(env: dict[str, str], *args: str, fds: int | None = None) -> subprocess.CompletedProcess[str]:
    argv = [STATEQUEUE, *args]
    if fds is not None:  # as a user would: the shell's ulimit, then exec
        argv = ["sh", "-c", f'ulimit -n {fds} && exec "$@"', "sh", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_ulimit_12_is_one_line_and_exit_10(sq_env: dict[str, str]) -> None:
    assert sq(sq_env, "enqueue", "a", "b").returncode == 0
    done = sq(sq_env, "run", "--", "true", fds=12)
    assert done.returncode == RESOURCES, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("statequeue: cannot run: Too many open files"), line
    assert "error::" not in line and "ulimit -n" in line


def test_every_low_fd_limit_stops_cleanly_and_leaves_the_items_pending(
    sq_env: dict[str, str],
) -> None:
    """Each limit from where the interpreter starts up to where the run
    works fails at another step (the queue's folders, its journal, the
    runner's pipes and lock, the spawn): every one is exit 10, until a run works."""
    assert sq(sq_env, "enqueue", "a", "b").returncode == 0
    for fds in range(5, 64):
        done = sq(sq_env, "run", "--", "true", fds=fds)
        if done.returncode == 0:
            break
        assert done.returncode == RESOURCES, (fds, done.returncode, done.stderr)
        assert len(done.stderr.splitlines()) == 1, (fds, done.stderr)
        assert "Traceback" not in done.stderr
        status = json.loads(sq(sq_env, "status", "--json").stdout)
        assert status["counts"]["pending"] == 2, (fds, status)
        assert not status["runner_active"], fds
    assert fds > 12, "ulimit -n 12 ran: the test no longer covers the issue's case"
    assert json.loads(sq(sq_env, "status", "--json").stdout)["counts"]["done"] == 2
    assert sq(sq_env, "fsck").returncode == 0


def test_an_os_error_without_a_file_name_is_one_clean_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def call(argv: Sequence[str]) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    assert run_guarded(call, []) == RESOURCES  # any command short of fds: exit 10
    err = capsys.readouterr().err
    assert err.startswith("statequeue: error: Too many open files; stopped")  # not "error::"


def test_the_advice_fits_the_run_and_the_shortage(sq_env: dict[str, str]) -> None:
    """Under `ulimit -n 22` a one-job run said "cannot start any command: ...
    or lower --jobs": a run of one job cannot go lower. The advice offers that
    only with --jobs > 1, and names the limit that ran short (`ulimit -n` is
    no help for processes). Every low limit, up to where the run works."""
    for jobs in ("1", "4"):
        assert sq(sq_env, "enqueue", "-q", f"j{jobs}", "a").returncode == 0
        steps = set()
        for fds in range(10, 64):
            done = sq(sq_env, "run", "-q", f"j{jobs}", "-j", jobs, "--", "true", fds=fds)
            if done.returncode == 0:
                break
            assert done.returncode == RESOURCES, (jobs, fds, done.stderr)
            line = done.stderr.splitlines()[-1]
            assert "Too many open files" in line and "`ulimit -n`" in line, line
            assert ("lower --jobs" in line) == (jobs == "4"), line
            steps.add(line.split(":")[1])
        assert " cannot start any command" in steps, steps  # the spawn itself was reached
    from statequeue.run.resources import short_of  # the remedy per shortage

    eagain = short_of("cannot start any command", OSError(errno.EAGAIN, "No more"), jobs=1)
    assert str(eagain) == (
        "cannot start any command: No more; stopped, the items stay pending "
        "(raise the process limit, e.g. `ulimit -u`)"
    )


def test_a_run_that_starts_nothing_does_not_first_say_it_runs_one(
    sq_env: dict[str, str],
) -> None:
    """Under `ulimit -n 22`, `run -j4` warned "running at most 1 item at
    once" and then stopped with "cannot start any command": the one it
    counted as running had failed to start too. Each limit up to where a
    run works: a run that started nothing gives the one line only."""
    assert sq(sq_env, "enqueue", *[str(n) for n in range(8)]).returncode == 0
    stopped = 0
    for fds in range(16, 64):
        done = sq(sq_env, "run", "-j4", "--", "true", fds=fds)
        if done.returncode == 0:
            break
        assert done.returncode == RESOURCES, (fds, done.stderr)
        started = json.loads(sq(sq_env, "status", "--json").stdout)["counts"]["done"]
        assert started == 0, (fds, started)  # nothing ran: nothing may be said to run
        assert done.stderr.splitlines() == [done.stderr.strip()], (fds, done.stderr)
        stopped += 1
    assert stopped, "no limit stopped the run: the test no longer covers the case"
