"""A retry on PostgreSQL never starts beside a detached leftover of the
failed attempt before it (promise 4, found by an outside tester).

On the local store a retry waits for the item's claim lock, which a detached
leftover of the earlier attempt still holds. On PostgreSQL a claim's lock
file is per token, and another host sees none of ours: the retry (or the
attempt after an exit 75) started at once, and the leftover of the failed
attempt ran beside it until the old lease's fencing killed it, about a
lease later. Now nothing of a failed attempt outlives it there, as for a
stopped or timed-out one.

The worker's first attempt starts a descendant in a new session that holds
a flock on a file of the item and notes its pid, then exits (1, or 75); a
later attempt that finds the flock held writes OVERLAP. Real server
(tests/pg.py), real processes; they are stopped by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

pytest.importorskip("psycopg")

WORKER = textwrap.dedent(
    """\
    d=$1; code=$2
    exec 9>"$d/lock"
    flock -n 9 || echo OVERLAP >> "$d/log"
    if mkdir "$d/first" 2>/dev/null; then
        setsid sh -c 'echo $$ > "$0/leftover.pid"; exec sleep 30' "$d" \
            </dev/null >/dev/null 2>&1 &
        n=0
        while [ ! -s "$d/leftover.pid" ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n+1)); done
        exit "$code"
    fi
    echo SECOND >> "$d/log"
    """
)


@pytest.mark.parametrize("code", ["1", "75"])
def test_a_retry_never_runs_beside_the_failed_attempts_detached_leftover(
    tmp_path: Path, sq_env: dict[str, str], pg_url: str, code: str
) -> None:
    worker = tmp_path / "worker.sh"
    worker.write_text(WORKER)
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=60)
    try:
        run = subprocess.run(
            [
                *(STATEQUEUE, "run", "--no-live", "--lease", "6s", "--retries", "1"),
                *("--retry-delay", "100ms", "--", "sh", str(worker), str(tmp_path), code),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        pid_file = tmp_path / "leftover.pid"
        if pid_file.exists() and pid_file.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
    assert "SECOND" in log, (run.returncode, run.stderr, log)  # the item ran again
    assert "OVERLAP" not in log, (run.stderr, log)
    assert run.returncode == 0, run.stderr
