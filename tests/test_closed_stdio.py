"""Commands started with stdout or stderr closed (`cmd >&- 2>&-`, as some
cron setups and daemons do): no traceback, the work is done, and no file
the command opens lands on fd 1 to receive what it prints."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE


def _closed(env: dict[str, str], *args: str) -> int:
    # `exec >&- 2>&-` in sh: the command starts with fds 1 and 2 closed.
    script = 'exec >&- 2>&-; exec "$@"'
    return subprocess.run(["sh", "-c", script, "sh", STATEQUEUE, *args], env=env).returncode


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "full-cli"])
def test_commands_with_closed_stdout_and_stderr_work(
    sq_env: dict[str, str], sq_home: Path, fast: bool
) -> None:
    extra = [] if fast else ["--json"]
    assert _closed(sq_env, "enqueue", "a", "b") == 0
    assert _closed(sq_env, "status", *extra) == 0
    assert _closed(sq_env, "run", "--", "true") == 0
    done = subprocess.run(
        [STATEQUEUE, "status", "--json"], env=sq_env, capture_output=True, text=True
    )
    assert '"done":2' in done.stdout.replace(" ", ""), done.stdout
    fsck = subprocess.run([STATEQUEUE, "fsck"], env=sq_env, capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
