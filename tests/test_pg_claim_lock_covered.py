"""Issue 21 point 14: a loop that settles an item and claims the next in one
call (``Queue.work()``, ``finish_and_claim``) renames its settled claim's
lock file to the next token's, still locked, instead of creating a file and
unlinking the old one per item (store/postgres/reaping.py). What must hold,
on a real server (tests/pg.py):

- while an item is held, its ``TOKEN.lock`` exists and is locked, as seen by
  another open of the file (what a reaper on this host does: point 2);
- the first claim's file is the one the next claims hold (renamed, never
  unlinked): the behaviour itself, which fails where a file is made per item;
- nothing is left in the claims folder once the loop has ended;
- a reaper still waits for a process of the attempt that holds the renamed
  file after its runner died and its lease ended.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.identity import new_runner
from tests.pg import sql as _sql
from tests.waiting import gone, until

pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # after the skip: needs psycopg


def _locked(path: Path) -> bool:
    """Whether some open file description holds ``path``'s flock (a reaper's test)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_work_loop_renames_its_lock_file_from_item_to_item(pg_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    claims = home / ".postgres" / "q" / "claims"
    try:
        q.enqueue(["a", "b", "c"])
        first: int | None = None  # an fd of the first claim's file, opened here
        try:
            for item in q.work():
                path = claims / f"{item.claim.token}.lock"
                assert _locked(path), f"item {item.item}'s claim lock is not held"
                if first is None:
                    first = os.open(path, os.O_RDONLY)
                else:
                    now = os.fstat(first)
                    assert now.st_nlink == 1, "the first claim's file was unlinked, not reused"
                    assert now.st_ino == path.stat().st_ino
                item.done()
            assert first is not None
            assert os.fstat(first).st_nlink == 0  # the last settle, with no next claim, removed it
        finally:
            if first is not None:
                os.close(first)
        assert sorted(p.name for p in claims.iterdir()) == []
        assert q.status().counts.get("done") == 3
    finally:
        q.close()


_DIE_HOLDING_NEXT = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from pathlib import Path
    from statequeue.core.identity import new_runner
    from statequeue.core.models import Outcome
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1], "q", scratch=Path(sys.argv[2]), lease=1.0)
    runner = new_runner()
    store.register_runner(runner)
    first = store.claim(runner)
    _, claim = store.finish_and_claim(first, Outcome(ok=True), runner=runner)
    assert claim is not None and claim.inherit_fds == first.inherit_fds  # the same file
    child = subprocess.Popen(
        ["sleep", "60"], pass_fds=claim.inherit_fds,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    print(child.pid, claim.item_id, claim.token, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _lease_over(url: str, item_id: int) -> bool:
    rows = _sql(
        url,
        "SELECT lease_until < clock_timestamp() FROM statequeue.live WHERE id = %s",
        item_id,
    )
    return not rows or bool(rows[0][0])


def _state(url: str, item_id: int) -> str:
    rows = _sql(url, "SELECT state FROM statequeue.live WHERE id = %s", item_id)
    return str(rows[0][0]) if rows else "gone"


def test_a_reaper_waits_for_a_process_holding_a_renamed_claim_lock(
    pg_url: str, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reaper = PostgresStore(pg_url, "q", scratch=scratch)
    try:
        reaper.enqueue(["a", "b"])
        died = subprocess.run(
            [sys.executable, "-c", _DIE_HOLDING_NEXT, pg_url, str(scratch)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert died.returncode == -signal.SIGKILL, died.stderr
        child, item_id, token = (int(v) for v in died.stdout.split())
        try:
            assert _locked(scratch / "claims" / f"{token}.lock")
            until(lambda: _lease_over(pg_url, item_id), "the lease to end")
            _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")  # a reaper's turn
            assert reaper.claim(new_runner()) is None, "handed out while its process holds it"
            assert _state(pg_url, item_id) == "running"
        finally:
            os.kill(child, signal.SIGKILL)
            until(lambda: gone(child), "the item's process to end")
        _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
        again = reaper.claim(new_runner())
        assert again is not None
        assert (again.item_id, again.attempt, again.interrupted) == (item_id, 2, True)
    finally:
        reaper.close()
