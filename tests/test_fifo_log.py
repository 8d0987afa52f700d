"""A FIFO at an attempt's log path hangs nothing (an attacker's find).

The child can write in the log folder (its $STATEQUEUE_RESULT is there): a
FIFO it put at its own log path, then output on stderr, made the runner's
lazy open of the log wait for a reader forever, and no signal could end the
wait (PEP 475 retries the open). `logs` hung the same way. The log is now
opened without blocking; what is at its name when the run makes the log (the
FIFO) is removed and the log created afresh, so the output is kept; `logs`
reads only a regular file, and refuses a FIFO (exit 9) without waiting on it.
"""

from __future__ import annotations

import subprocess

from tests.conftest import STATEQUEUE

PLANT = 'f="$(dirname "$STATEQUEUE_RESULT")/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT.log"'
PLANT += '; rm -f "$f"; mkfifo "$f"; echo said >&2'


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_fifo_planted_at_the_log_path_neither_hangs_the_run_nor_loses_its_output(
    sq_env: dict[str, str],
) -> None:
    assert _sq(sq_env, "enqueue", "a", "b").returncode == 0
    run = _sq(sq_env, "run", "--no-live", "--", "sh", "-c", PLANT, "sh", "{}")
    assert run.returncode == 0, run.stderr
    assert "2 ok" in run.stderr
    for args in (("logs", "1"), ("logs", "--all"), ("show", "1")):
        shown = _sq(sq_env, *args)  # the 60 s timeout is the hang this guards against
        assert shown.returncode == 0, (args, shown.stderr)
    shown = _sq(sq_env, "logs", "1")
    assert "said" in shown.stdout, shown.stderr
