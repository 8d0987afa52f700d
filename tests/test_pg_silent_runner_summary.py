"""A run on PostgreSQL that ends while another host's runner, killed -9, still
holds items under a lease that has not ended names them in its summary.

Found by an outside tester: the surviving runner exited 0 with "items: 71
ok, 0 failed" and nothing about the two items the dead runner left, which no
run takes until its lease ends (another host: only the lease tells), while
the journal's run says "not taken: ..." for items it cannot take. Now such a
runner's items (not heard from for over half its lease) are named, with when
their lease ends. A live runner's items are not: it renews every third of its
lease. On a real server (tests/pg.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from statequeue.core.views import ActiveRunner
from statequeue.run.events import RunSummary, silent_items
from tests.conftest import STATEQUEUE

LEASE = 20.0

_HOST_A = textwrap.dedent(
    """
    import os, signal, sys
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore
    store = PostgresStore(sys.argv[1], "default")
    store.use_lease(float(sys.argv[2]))
    runner = new_runner(("worker",))
    store.register_runner(runner)
    claims = [store.claim(runner) for _ in range(2)]
    print(" ".join(str(c.item_id) for c in claims), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _runner(heard_ago: float, running: tuple[int, ...], lease: float = LEASE) -> ActiveRunner:
    return ActiveRunner(
        runner_id="r",
        pid=1,
        host="a",
        started_at=0.0,
        running=running,
        heard_ago=heard_ago,
        lease_ends_at=time.time() + lease - heard_ago,
        lease=lease,
    )


def test_only_runners_unheard_for_half_their_lease_are_named() -> None:
    live, silent = _runner(6.0, (3,)), _runner(11.0, (2, 1))
    assert silent_items([live, silent])[0] == (1, 2)
    assert silent_items([live])[0] == ()
    summary = RunSummary()
    summary.silent, summary.silent_lease_ends = silent_items([silent])
    text = summary.text()
    assert "not taken: 2 items of a runner not heard from for over half its lease: #1, #2" in text
    assert "(in about 9s)" in text or "(in about 10s)" in text


def test_a_run_names_the_items_a_killed_runner_elsewhere_still_holds(
    sq_env: dict[str, str], pg_url: str
) -> None:
    enq = [STATEQUEUE, "--store", pg_url, "enqueue", "a", "b", "c"]
    assert subprocess.run(enq, env=sq_env, timeout=60).returncode == 0
    host_a = {**sq_env, "STATEQUEUE_HOST": "host-a"}
    died = subprocess.run(
        [sys.executable, "-c", _HOST_A, pg_url, str(LEASE)],
        env=host_a,
        capture_output=True,
        text=True,
        timeout=60,
    )
    registered = time.monotonic()
    held = sorted(int(i) for i in died.stdout.split())
    assert len(held) == 2, died.stderr
    # Past half the lease since its registration (its last word), well before its end.
    time.sleep(max(0.0, registered + LEASE * 0.5 + 1.0 - time.monotonic()))
    host_b = {**sq_env, "STATEQUEUE_HOST": "host-b"}
    run = subprocess.run(
        [STATEQUEUE, "--store", pg_url, "run", "--", "true"],
        env=host_b,
        capture_output=True,
        text=True,
        timeout=60,
    )
    again = subprocess.run(  # nothing to do: the same line, and the --json field
        [STATEQUEUE, "--store", pg_url, "run", "--json", "--", "true"],
        env=host_b,
        capture_output=True,
        text=True,
        timeout=60,
    )
    ended = time.monotonic() - registered
    assert run.returncode == 0, run.stderr
    assert ended < LEASE, "the runs ended after the dead runner's lease: nothing to name"
    listed = ", ".join(f"#{i}" for i in held)
    said = f"not taken: 2 items of a runner not heard from for over half its lease: {listed}"
    assert "items: 1 ok, 0 failed; 1 attempt started; " + said in run.stderr
    assert "by the next run, or by `run --follow`" in run.stderr
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["silent_runner_items"] == held
    assert summary["succeeded"] == 0
