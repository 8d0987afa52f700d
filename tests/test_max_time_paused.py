"""A paused queue's run that --max-time ends is not "nothing to do" (an
outside tester's finding): `run --max-time 2s --exit-empty 3` on a paused
queue with 3 pending items printed "nothing to do: no pending item is due"
and exited 3, so a cron job was told there was nothing to do. It now says
what is true (paused, N pending) and exits 0, as `help exit-codes` says of a
run --max-time stopped."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import STATEQUEUE

DEADLINE = 60.0


def _sq(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, text=True, timeout=DEADLINE
    )


def test_max_time_on_a_paused_queue_says_paused_and_exits_0(sq_env: dict[str, str]) -> None:
    assert _sq(sq_env, "enqueue", stdin="1\n2\n3\n").returncode == 0
    assert _sq(sq_env, "pause").returncode == 0
    run = _sq(sq_env, "run", "--max-time", "0.5s", "--exit-empty", "3", "--", "true")
    assert run.returncode == 0, run.stderr
    assert "nothing to do" not in run.stderr
    last = run.stderr.splitlines()[-1]
    assert "3 items pending" in last and "paused" in last, run.stderr
    as_json = _sq(sq_env, "run", "--max-time", "0.5s", "--exit-empty", "3", "--json", "--", "true")
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)
    assert summary["exit_code"] == 0 and summary["left_pending"] == 3
    # An empty queue is still "nothing to do", with --exit-empty's code.
    assert _sq(sq_env, "resume").returncode == 0
    assert _sq(sq_env, "run", "--", "true").returncode == 0
    empty = _sq(sq_env, "run", "--max-time", "0.5s", "--exit-empty", "3", "--", "true")
    assert empty.returncode == 3, empty.stderr
    assert "nothing to do" in empty.stderr
