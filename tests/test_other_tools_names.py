"""A command name another queue tool uses gets statequeue's own name back.

`statequeue watch` said "Did you mean 'path'?" (click's spelling guess), while
the user wanted `status --watch`; the same for pueue's and task-spooler's
`add`, `log`, `restart`, `kill`. Exit 2 either way.
"""

from __future__ import annotations

import subprocess

import pytest

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("watch", "status --watch"), ("add", "enqueue"), ("restart", "retry"), ("log", "logs")],
)
def test_another_tool_s_command_name_is_answered(
    sq_env: dict[str, str], typed: str, meant: str
) -> None:
    done = subprocess.run(
        [STATEQUEUE, typed], env=sq_env, capture_output=True, text=True, check=False
    )
    assert done.returncode == ExitCode.USAGE
    assert f"Did you mean '{meant}'?" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_kill_says_how_to_stop_a_running_item(sq_env: dict[str, str]) -> None:
    done = subprocess.run(
        [STATEQUEUE, "kill"], env=sq_env, capture_output=True, text=True, check=False
    )
    assert done.returncode == ExitCode.USAGE
    assert "Did you mean 'cancel'?" in done.stderr and "kill -TERM PID" in done.stderr
