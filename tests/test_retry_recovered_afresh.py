"""`retry` of an item that it only recovers starts the item afresh, on both stores.

An item whose runner died mid-attempt goes back to pending marked
interrupted (the next run checks it with --verify first) and with its crash
counted. If the runner of that check dies too, `retry ID` recovers the item
as pending (no crash: the check is no attempt) and reports it recovered.
Found by outside testing: it then kept the mark and the crash count, so
`status` still listed it as "interrupted, back to pending" and the next run
checked it first, unlike any other retried item (transitions.starts_afresh).
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

Env = dict[str, str]
# Writes its pid, then waits to be killed: a check, or a command.
STAY = 'echo $$ >> "$0"; exec sleep 60'


def sq(env: Env, store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", store_url] if store_url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=env, capture_output=True, text=True, timeout=120
    )


def run_and_kill(env: Env, home: Path, store_url: str, pids: Path, *run: str) -> None:
    """`run` ``run`` until its check or command wrote its pid to ``pids``;
    then SIGKILL the runner, and that process (left behind by a kill -9)."""
    store = ["--store", store_url] if store_url else []
    argv = [STATEQUEUE, *store, "run", *(a.replace("PIDS", str(pids)) for a in run)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: pids.exists() and pids.read_text().strip(), "the check or command")
        with Queue(home=home, store=store_url or None, create=False) as q:
            (runner,) = q.status().runners
        os.kill(runner.pid, signal.SIGKILL)
        until(lambda: gone(runner.pid), "the runner's end")
        child = int(pids.read_text().split()[-1])
        with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
            os.kill(child, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_retry_of_an_item_it_only_recovers_starts_it_afresh(
    sq_env: Env, sq_home: Path, store_url: str, tmp_path: Path
) -> None:
    assert sq(sq_env, store_url, "enqueue", "a").returncode == 0
    # Killed while its command runs: recovered (by the next run) as pending, marked.
    run_and_kill(sq_env, sq_home, store_url, tmp_path / "ran", "--", "sh", "-c", STAY, "PIDS")
    # The next run checks it first; killed during that check.
    check = f"sh -c '{STAY}' PIDS"
    run_and_kill(sq_env, sq_home, store_url, tmp_path / "checked", "--verify", check, "--", "true")
    assert json.loads(sq(sq_env, store_url, "status", "--json").stdout)["interrupted"] == [1]

    retried = sq(sq_env, store_url, "retry", "1")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == (
        "1 item recovered, pending again (the runner died during the --verify check): #1\n"
    )
    status = json.loads(sq(sq_env, store_url, "status", "--json").stdout)
    assert (status["interrupted"], status["interrupted_pending"]) == ([], []), status
    assert status["counts"]["pending"] == 1 and status["total"] == 1, status
    assert "interrupted" not in sq(sq_env, store_url, "status").stdout
    assert sq(sq_env, store_url, "list").stdout == "1\tpending\t1\ta\n"
    row = json.loads(sq(sq_env, store_url, "list", "--json").stdout)
    assert (row["interrupted"], row["reason"]) == (False, "retry by user"), row
    shown = sq(sq_env, store_url, "show", "1").stdout
    assert "state: pending\n" in shown, shown
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        (item,) = list(q.store.export_items())
        assert (item.state.value, item.crashes, item.interrupted) == ("pending", 0, False)

    # Afresh: the next run runs its command, with no --verify check first.
    marks = tmp_path / "marks"
    hook = f"echo checked >> {marks}; exit 1"
    ran = sq(sq_env, store_url, "run", "--verify", hook, "--", "sh", "-c", f"echo ran >> {marks}")
    assert ran.returncode == 0, ran.stderr
    assert marks.read_text() == "ran\n"
