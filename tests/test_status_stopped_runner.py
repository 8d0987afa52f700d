"""`status` of a runner stopped by a signal (ctrl-Z, SIGSTOP) on this host.

It said "active" on the local store, though the runner took nothing. On
PostgreSQL, once its lease ran out unrenewed, it said "runner: none
active" and "interrupted (runner died)", and `drop` went ahead, though the
runner lived and took its row back when continued (Leases: REVIVE). Now the
runner is listed as stopped, with the command that continues it, on both
stores; on PostgreSQL past its lease too (its items are taken back, as
before), and `drop` refuses while it lives. Once continued it is active.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from typing import Any

from tests.conftest import STATEQUEUE
from tests.waiting import until


def _sq(env: dict[str, str], url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", url] if url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=env, capture_output=True, text=True, timeout=60
    )


def _status(env: dict[str, str], url: str) -> dict[str, Any]:
    done = _sq(env, url, "status", "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _running(env: dict[str, str], url: str, *run_args: str) -> subprocess.Popen[bytes]:
    """A run (its own session) of one enqueued item, once the item runs."""
    assert _sq(env, url, "enqueue", "a").returncode == 0
    store = ["--store", url] if url else []
    run = subprocess.Popen(
        [STATEQUEUE, *store, "run", *run_args, "--", "sh", "-c", "sleep 60"],
        env=env,
        start_new_session=True,
    )
    try:
        until(lambda: _status(env, url)["counts"].get("running") == 1, "the item to run", 20)
    except BaseException:
        _end(run)
        raise
    return run


def _end(run: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # its own session: keeper, child
        os.killpg(run.pid, signal.SIGCONT)
        os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)


def _stop_runner(env: dict[str, str], url: str) -> int:
    """SIGSTOP the process `status` names as the runner; its pid."""
    pid = int(_status(env, url)["runners"][0]["pid"])
    os.kill(pid, signal.SIGSTOP)
    until(lambda: _state(pid) == "T", "the runner to stop", 10)
    return pid


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return chr(stat[stat.rfind(b")") + 2])


def test_a_stopped_local_runner_is_shown_stopped(sq_env: dict[str, str]) -> None:
    run = _running(sq_env, "")
    try:
        pid = _stop_runner(sq_env, "")
        stopped = _status(sq_env, "")
        assert stopped["runner_active"] and stopped["runners"][0]["stopped"] is True, stopped
        text = _sq(sq_env, "", "status").stdout
        assert f"runner: STOPPED by a signal (ctrl-Z or SIGSTOP; `kill -CONT {pid}`" in text
        os.kill(pid, signal.SIGCONT)
        until(lambda: _state(pid) != "T", "the runner to continue", 10)
        again = _status(sq_env, "")
        assert again["runners"][0]["stopped"] is False, again
        assert "runner: active (pid" in _sq(sq_env, "", "status").stdout
    finally:
        _end(run)


def test_a_postgres_runner_stopped_past_its_lease_is_listed_until_it_continues(
    sq_env: dict[str, str], pg_url: str
) -> None:
    run = _running(sq_env, pg_url, "--lease", "3s")
    try:
        pid = _stop_runner(sq_env, pg_url)
        # Past its lease: its item is interrupted (the next run takes it), the
        # runner still listed, stopped.
        until(lambda: _status(sq_env, pg_url)["interrupted"] == [1], "the lease to lapse", 30)
        lapsed = _status(sq_env, pg_url)
        assert lapsed["runner_active"], lapsed
        (runner,) = lapsed["runners"]
        assert runner["pid"] == pid and runner["stopped"] is True, lapsed
        text = _sq(sq_env, pg_url, "status").stdout
        assert f"`kill -CONT {pid}` continues it); its lease ended at " in text, text
        assert "interrupted (runner stopped or died; the next run recovers them)" in text, text
        refused = _sq(sq_env, pg_url, "drop", "default", "--yes")
        assert refused.returncode == 4, refused.stderr
        assert f"has an active runner (pid {pid}" in refused.stderr
        os.kill(pid, signal.SIGCONT)
        until(
            lambda: [r["stopped"] for r in _status(sq_env, pg_url)["runners"]] == [False],
            "the runner to take its row back",
            30,
        )
        assert "runner: active (pid" in _sq(sq_env, pg_url, "status").stdout
    finally:
        _end(run)
