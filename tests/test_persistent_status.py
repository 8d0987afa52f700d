"""Issue 23, visibility: while a `run --persistent` is active, `status` and
`stats` show its workers (pid, items done, RSS), in text and in --json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker
from tests.waiting import until

RUN_TIMEOUT = 120


def _pid_of(marks: Path, item: str) -> int:
    path = marks / f"{item}.pid"
    found = until(lambda: path.exists() and path.read_text().split(), f"{item} to start")
    return int(found[0])  # type: ignore[index]


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(params=["journal", "postgres"])
def env(request: pytest.FixtureRequest, sq_env: dict[str, str]) -> dict[str, str]:
    if request.param == "postgres":
        return dict(sq_env, STATEQUEUE_STORE=request.getfixturevalue("pg_url"))
    return sq_env


def test_status_and_stats_show_the_workers_of_an_active_persistent_run(
    env: dict[str, str], tmp_path: Path
) -> None:
    sq_env = env
    program, marks = write_worker(tmp_path)
    _cli(sq_env, "enqueue", "ok-1", "ok-2", "ok-3", "slow-a", "slow-b")
    argv = [STATEQUEUE, "run", "--persistent", "-j2", "--lease", "3s", "--"]
    argv += [sys.executable, program, str(marks)]  # PostgreSQL: published with each renew
    with subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        try:
            pids = {_pid_of(marks, "slow-a"), _pid_of(marks, "slow-b")}

            def shown() -> list[dict[str, object]] | None:
                runners = json.loads(_cli(sq_env, "status", "--json"))["runners"]
                workers = runners[0]["workers"] if runners else []
                if {w["pid"] for w in workers} != pids:
                    return None
                # Figures are published at most once a second: wait for the
                # first view after ok-1..3 were answered.
                return workers if sum(int(w["items"]) for w in workers) == 3 else None

            workers = until(shown, "status to show both workers")
            assert isinstance(workers, list)
            assert sorted(w["slot"] for w in workers) == [1, 2]
            assert sum(int(w["items"]) for w in workers) == 3  # ok-1..3 answered
            assert all(int(w["rss"]) > 1 << 20 for w in workers)  # a Python interpreter
            text = _cli(sq_env, "status")
            for pid in pids:
                assert f"pid {pid}, " in text, text
            assert "  worker 1: pid " in text and " done, RSS " in text, text
            stats = _cli(sq_env, "stats")
            assert "persistent workers (live):" in stats
            assert {
                w["pid"] for w in json.loads(_cli(sq_env, "stats", "--json"))["workers"]
            } == pids
        finally:
            os.kill(run.pid, signal.SIGTERM)
            run.communicate(timeout=RUN_TIMEOUT)
    # The run is over: no runner, so no workers.
    assert json.loads(_cli(sq_env, "status", "--json"))["runners"] == []
