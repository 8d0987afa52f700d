"""A PostgreSQL claim whose own lock file was never made is still recovered
at once on its host (store/postgres/reaping.py, ``ClaimLocks.hold_runner``).

A claim's lock file is made after its claim commits (a runner that hands
its claims' locks on: ``run``, a process pool). A kill between the two left
a claim with no file: the same-host shortcut, which wants a free file,
passed it over, and the item waited for its lease (30 s).
Each runner now holds a file of its own from its registration on; a claim
without a file of its own is decided by its runner's. On a real server
(tests/pg.py):

- killed between the commit and the file: the next claim recovers the item
  at once, as interrupted, well inside its lease;
- the same, but the runner frozen instead of dead, with its lease over: the
  item is not handed out while the runner's file is held on this host;
- an ended loop leaves no file behind, and a dead runner's file is removed
  once its claims were looked at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from tests.pg import sql as _sql
from tests.waiting import gone, until

pytest.importorskip("psycopg")
from statequeue.api.queue import Queue  # after the skip: needs psycopg
from statequeue.store.postgres import PostgresStore  # after the skip

_STOP_BEFORE_THE_FILE = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from statequeue.core.identity import new_runner
    from statequeue.core.models import Outcome
    from statequeue.store.postgres import PostgresStore, reaping

    how = getattr(signal, sys.argv[3])
    take = reaping.ClaimLocks.take
    taken = []

    def stop_before_the_file(self, token, runner_id=None):
        taken.append(token)
        if len(taken) == 2:  # the chained claim is committed; its file not yet made
            print(token, flush=True)
            os.kill(os.getpid(), how)
        return take(self, token, runner_id)

    reaping.ClaimLocks.take = stop_before_the_file
    store = PostgresStore(sys.argv[1], "q", scratch=Path(sys.argv[2]), lease=float(sys.argv[4]))
    runner = new_runner()
    store.register_runner(runner)
    first = store.claim(runner)
    store.finish_and_claim(first, Outcome(ok=True), runner=runner)
    """
)


def _start(url: str, scratch: Path, how: str, lease: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _STOP_BEFORE_THE_FILE, url, str(scratch), how, str(lease)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _token_of(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read() if proc.stderr else ""
    return int(line)


def _state(url: str, item_id: int) -> str:
    rows = _sql(url, "SELECT state FROM statequeue.live WHERE id = %s", item_id)
    return str(rows[0][0]) if rows else "gone"


def test_a_claim_killed_before_its_lock_file_was_made_is_recovered_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reaper = PostgresStore(pg_url, "q", scratch=scratch)
    try:
        reaper.enqueue(["a", "b"])
        proc = _start(pg_url, scratch, "SIGKILL", 600.0)
        token = _token_of(proc)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        assert not (scratch / "claims" / f"{token}.lock").exists()  # the case itself
        assert _state(pg_url, 2) == "running"
        again = reaper.claim(new_runner())  # its lease has 10 minutes to run
        assert again is not None, "the dead runner's claim waited for its lease"
        assert (again.item_id, again.attempt, again.interrupted) == (2, 2, True)
        left = sorted(p.name for p in (scratch / "claims").iterdir())
        assert not [n for n in left if n.startswith("runner-")], left  # the dead one's is gone
    finally:
        reaper.close()


def test_a_frozen_runners_claim_without_a_file_waits_after_its_lease(
    pg_url: str, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reaper = PostgresStore(pg_url, "q", scratch=scratch)
    try:
        reaper.enqueue(["a", "b"])
        proc = _start(pg_url, scratch, "SIGSTOP", 1.0)
        try:
            token = _token_of(proc)
            assert not (scratch / "claims" / f"{token}.lock").exists()
            until(
                lambda: bool(
                    _sql(
                        pg_url,
                        "SELECT lease_until < clock_timestamp() FROM statequeue.live WHERE id = 2",
                    )[0][0]
                ),
                "the frozen runner's lease to end",
            )
            _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")  # a reaper's turn
            assert reaper.claim(new_runner()) is None, "handed out while its runner lives here"
            assert _state(pg_url, 2) == "running"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            until(lambda: gone(proc.pid), "the frozen runner to end")
        again = reaper.claim(new_runner())
        assert again is not None and (again.item_id, again.interrupted) == (2, True)
    finally:
        reaper.close()


def test_an_ended_work_loop_leaves_no_runner_file(pg_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    claims = home / ".postgres" / "q" / "claims"
    try:
        q.enqueue(["a", "b"])
        for item in q.work():
            assert any(p.name.startswith("runner-") for p in claims.iterdir())
            item.done()
        assert sorted(p.name for p in claims.iterdir()) == []
    finally:
        q.close()
