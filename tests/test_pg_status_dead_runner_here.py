"""PostgreSQL `status` of a runner killed -9 on this host.

Found by an outside tester: `status` showed such a runner as active for
~20 s, until its heartbeat lease ran out, though its pid was gone and a
second run on the same host took its items at once (the same-host
shortcut, store/postgres/reaping.py). A runner whose host and boot id are
this machine's and whose pid is gone is now dead to `status` at once, as
after its lease: not listed, not active, its items interrupted. Elsewhere
(another host name) only the lease tells. On a real server (tests/pg.py).
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


def _status(env: dict[str, str], url: str) -> dict[str, Any]:
    argv = [STATEQUEUE, "--store", url, "status", "--json"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _running(env: dict[str, str], url: str) -> subprocess.Popen[bytes]:
    """A run (its own session) of one enqueued item, once the item runs."""
    enq = [STATEQUEUE, "--store", url, "enqueue", "a"]
    assert subprocess.run(enq, env=env, timeout=60).returncode == 0
    run = subprocess.Popen(
        [STATEQUEUE, "--store", url, "run", "--", "sh", "-c", "sleep 60"],
        env=env,
        start_new_session=True,
    )
    try:
        until(lambda: _status(env, url)["counts"].get("running") == 1, "the item to run", 20)
    except BaseException:
        os.killpg(run.pid, signal.SIGKILL)  # its own session: its keeper, child
        run.wait(timeout=30)
        raise
    return run


def test_a_runner_killed_here_is_not_active(sq_env: dict[str, str], pg_url: str) -> None:
    run = _running(sq_env, pg_url)
    try:
        alive = _status(sq_env, pg_url)
        assert alive["runner_active"] and alive["runners"][0]["pid"] == run.pid, alive
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        here = _status(sq_env, pg_url)
        assert not here["runner_active"] and here["runners"] == [], here
        assert here["interrupted"] == [1], here
        text = subprocess.run(
            [STATEQUEUE, "--store", pg_url, "status"],
            env=sq_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "runner: none active" in text.stdout, text.stdout
        assert "interrupted (runner died; the next run recovers them): 1 item" in text.stdout
        # Another host cannot look at the pid: its lease alone tells there.
        elsewhere = _status({**sq_env, "STATEQUEUE_HOST": "elsewhere"}, pg_url)
        assert elsewhere["runner_active"] and elsewhere["interrupted"] == [], elsewhere
    finally:
        with contextlib.suppress(ProcessLookupError):  # the run's own session: its keeper, child
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def test_a_runner_killed_here_and_not_yet_reaped_is_not_active(
    sq_env: dict[str, str], pg_url: str
) -> None:
    """Its parent (this test) has not waited for it yet: a zombie, whose pid
    still answers kill(pid, 0). Seen by a helper: `status` called such a
    runner active until its parent reaped it."""
    run = _running(sq_env, pg_url)
    try:
        os.kill(run.pid, signal.SIGKILL)
        until(lambda: _zombie(run.pid), "the killed runner to be a zombie", 20)
        here = _status(sq_env, pg_url)
        assert not here["runner_active"] and here["runners"] == [], here
        assert _zombie(run.pid)  # still unreaped while status looked
    finally:
        with contextlib.suppress(ProcessLookupError):  # the run's own session: its keeper, child
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
