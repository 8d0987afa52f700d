"""`queues` says which running items are interrupted, as `status` does.

After a runner was killed with -9, `queues` showed ``running 1`` for its
item while `status` said "runner: none active" and "interrupted": nothing
runs it until the next run recovers it. Found by an outside tester; on both
stores (on PostgreSQL the dead pid on this host tells at once).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

from tests.conftest import STATEQUEUE
from tests.waiting import until


def _sq(env: dict[str, str], url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", url] if url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=env, capture_output=True, text=True, timeout=60
    )


def _running_count(env: dict[str, str], url: str) -> int:
    done = _sq(env, url, "status", "--json")
    return int(json.loads(done.stdout)["counts"]["running"]) if done.returncode == 0 else 0


def test_queues_marks_the_items_of_a_dead_runner(sq_env: dict[str, str], store_url: str) -> None:
    assert _sq(sq_env, store_url, "enqueue", "a", "b").returncode == 0
    store = ["--store", store_url] if store_url else []
    run = subprocess.Popen(
        [STATEQUEUE, *store, "run", "--", "sh", "-c", "sleep 60"],
        env=sq_env,
        start_new_session=True,
    )
    try:
        until(lambda: _running_count(sq_env, store_url) == 1, "the item to run", 20)
        os.killpg(run.pid, signal.SIGKILL)  # the runner, its keeper and child
        run.wait(timeout=30)
        listed = _sq(sq_env, store_url, "queues")
        assert listed.returncode == 0, listed.stderr
        assert "\tpending 1  running 1 (1 interrupted)" in listed.stdout, listed.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
