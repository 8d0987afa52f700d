"""`statequeue run` with an empty command, as `run --shell -- "$CMD"` gives when
CMD is unset: refused before anything is claimed (exit 2, one line). With
--shell it used to become `sh -c ' "$1"'`, which ran every item as a command
of its own (a file list's scripts executed, say); without it, the message
read "command not found in PATH: ; nothing was run"."""

from __future__ import annotations

import subprocess

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE


@pytest.mark.parametrize(
    "command",
    [["--shell", "--", ""], ["--shell", "--", " ", ""], ["--", ""], ["--", " ", "{}"]],
    ids=["shell-empty", "shell-blank", "empty", "blank-program"],
)
def test_an_empty_command_is_refused_and_runs_nothing(
    sq_env: dict[str, str], command: list[str]
) -> None:
    with Queue(home=sq_env["STATEQUEUE_HOME"]) as q:
        q.enqueue(["true"])  # an item that would run, were it taken for the command
    out = subprocess.run(
        [STATEQUEUE, "run", *command], env=sq_env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert len(out.stderr.splitlines()) == 1 and "the command is empty" in out.stderr, out.stderr
    with Queue(home=sq_env["STATEQUEUE_HOME"], create=False) as q:
        assert [(v.state.value, v.attempts) for v in q.store.items()] == [("pending", 0)]
