"""`retry ID` of an item whose runner was killed (-9), on both stores.

`retry` recovers a named item that a dead runner left (status: interrupted)
before it applies. An item whose runner died during its `--verify` check is
no crash: recovery made it pending, and `retry` then refused it ("cannot
retry item 1: it is pending", exit 2), on both stores, though it had just
done what the user asked. It now says the item was recovered and is pending
(exit 0). An item whose runner died while its command ran is recovered as
held, then put back as pending, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.waiting import gone, until

# Writes its pid, then waits to be killed: a check, or a command.
_STAY = 'echo $$ >> "$0"; exec sleep 60'


def _sq(env: dict[str, str], store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", store_url] if store_url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=env, capture_output=True, text=True, timeout=120
    )


def _killed(env: dict[str, str], home: Path, store_url: str, queue: str, *run: str) -> None:
    """Enqueue one item in ``queue`` and `run` it with ``run``, whose check or
    command writes its pid to a file; then SIGKILL the runner, and that
    process (a runner killed -9 leaves it behind)."""
    pids = home.parent / f"pids-{queue}"
    assert _sq(env, store_url, "enqueue", "-q", queue, "a").returncode == 0
    store = ["--store", store_url] if store_url else []
    argv = [
        STATEQUEUE,
        *store,
        "run",
        "-q",
        queue,
        *(arg.replace("PIDS", str(pids)) for arg in run),
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: pids.exists() and pids.read_text().strip() != "", "the check or command")
        with Queue(queue, home=home, store=store_url or None, create=False) as q:
            (runner,) = q.status().runners
        os.kill(runner.pid, signal.SIGKILL)
        until(lambda: gone(runner.pid), "the runner's end")
        child = int(pids.read_text().split()[-1])
        if not gone(child):
            with contextlib.suppress(ProcessLookupError):  # it may end meanwhile (reaped)
                os.kill(child, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_retry_of_items_whose_runner_was_killed(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    # Killed during the --verify check (before the command started), and
    # killed while the command ran (no --verify): one queue each.
    check = f"sh -c '{_STAY}' PIDS"
    _killed(
        sq_env, sq_home, store_url, "checked", "--verify-first", "--verify", check, "--", "true"
    )
    _killed(sq_env, sq_home, store_url, "crashed", "--", "sh", "-c", _STAY, "PIDS")
    for queue in ("checked", "crashed"):
        status = json.loads(_sq(sq_env, store_url, "status", "-q", queue, "--json").stdout)
        assert status["counts"]["running"] == 1, status  # interrupted: its runner is gone

    checked = _sq(sq_env, store_url, "retry", "-q", "checked", "1")
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr == ""
    assert checked.stdout == (
        "1 item recovered, pending again (the runner died during the --verify check): #1\n"
    )
    crashed = _sq(sq_env, store_url, "retry", "-q", "crashed", "1", "--json")
    assert crashed.returncode == 0, crashed.stderr
    assert json.loads(crashed.stdout) == {"schema": 1, "changed": [1], "recovered": []}

    # Both stores show the last thing that happened: the retry, which starts
    # the item afresh after the recovery too (test_retry_recovered_afresh.py).
    for queue in ("checked", "crashed"):
        (line,) = _sq(sq_env, store_url, "list", "-q", queue, "--json").stdout.splitlines()
        row = json.loads(line)
        assert (row["state"], row["reason"]) == ("pending", "retry by user"), row
    for queue in ("checked", "crashed"):
        ran = _sq(sq_env, store_url, "run", "-q", queue, "--", "true")
        assert ran.returncode == 0, ran.stderr
        with Queue(queue, home=sq_home, store=store_url or None, create=False) as q:
            assert [v.state.value for v in q.items()] == ["done"], queue


def test_the_library_reports_an_item_recovered_by_retry(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    check = f"sh -c '{_STAY}' PIDS"
    _killed(
        sq_env, sq_home, store_url, "default", "--verify-first", "--verify", check, "--", "true"
    )
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        report = q.retry_report([1])
        assert (report.recovered, report.put_back, report.changed) == ((1,), (), [1])
        # Already pending now: a second retry is refused, as for any pending item.
        refused = _sq(sq_env, store_url, "retry", "1")
        assert refused.returncode == 2 and "it is pending" in refused.stderr, refused
