"""Issue 21 point 14: a library work loop (``Queue.work()``, ``work_async``)
runs its items in its own process and hands no claim's lock to another, so
it makes no lock file per claim: its runner's own file, locked as long as
its process lives, stands for each of its claims (store/postgres/reaping.py,
``RunnerInfo.in_process``). A file made and removed per item, in a folder
every loop of the host writes to, slowed the database's WAL flushes on the
same disk. What must still hold, on a real server (tests/pg.py):

- while an item is held, a reaper on this host finds it held (another
  store's ``is_held``), even with its lease over, and does not hand it out;
  and no ``TOKEN.lock`` is made (the behaviour itself);
- the loop's own store, whose own runner's claims without a file are
  otherwise taken for lost answers, leaves a claim it covers alone when its
  lease is over: the item's done() still counts;
- a loop killed holding an item: its item is recovered at once on this host;
- a fork of the loop that keeps the descriptor holds the item until it ends;
- a loop of ``statequeue run``'s kind (it hands claims on) still makes a file.
"""

from __future__ import annotations

import asyncio
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


def _end_lease(url: str, item_id: int) -> None:
    """Over at once, as after a frozen heartbeat, and a reaper's turn due."""
    _sql(
        url,
        "UPDATE statequeue.live SET lease_until = clock_timestamp() - interval '1 s' WHERE id = %s",
        item_id,
    )
    _sql(url, "UPDATE statequeue.queues SET last_reap_at = NULL")


def _state(url: str, item_id: int) -> tuple[str, int | None]:
    rows = _sql(url, "SELECT state, token FROM statequeue.live WHERE id = %s", item_id)
    return (str(rows[0][0]), rows[0][1]) if rows else ("gone", None)


def test_a_work_loops_claims_are_held_by_its_runner_file_alone(pg_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    claims = home / ".postgres" / "q" / "claims"
    reaper = PostgresStore(pg_url, "q", scratch=home / ".postgres" / "q")
    try:
        q.enqueue(["a", "b"])
        seen = []
        for item in q.work():
            token = item.claim.token
            assert token is not None
            names = sorted(p.name for p in claims.iterdir())
            assert names == [f"runner-{item.claim.runner_id}.lock"], names  # no TOKEN.lock
            # What recovery and `status` ask on this host.
            assert reaper._held_here(token, item.claim.runner_id), "not held, as a reaper sees it"
            if item.item == "b":  # the last: nothing else to hand out
                _end_lease(pg_url, item.id)
                assert reaper.claim(new_runner()) is None, "handed out while its loop runs it"
                assert _state(pg_url, item.id) == ("running", token)
            seen.append(item.item)
            item.done()
        assert seen == ["a", "b"]
        assert sorted(p.name for p in claims.iterdir()) == []
        assert q.status().counts.get("done") == 2
    finally:
        reaper.close()
        q.close()


def test_the_loops_own_store_leaves_a_claim_it_covers_alone(pg_url: str, tmp_path: Path) -> None:
    q = Queue("q", store=pg_url, home=tmp_path / "home")
    try:
        q.enqueue(["a", "b"])
        for item in q.work():
            if item.item == "a":
                token = item.claim.token
                _end_lease(pg_url, item.id)
                # The same store's reaper: an expired lease of its own live
                # runner with no file would be a lost answer to it.
                q.store.recover()
                assert _state(pg_url, item.id) == ("running", token), "reaped by its own loop"
            item.done()
        assert q.status().counts.get("done") == 2
        assert _sql(pg_url, "SELECT attempt, state FROM statequeue.results WHERE id = 1") == [
            (1, "done")
        ]
    finally:
        q.close()


_LOOP = textwrap.dedent(
    """
    import os, signal, sys, time
    from statequeue.api.queue import Queue

    q = Queue("q", store=sys.argv[1], home=sys.argv[2])
    for item in q.work():
        child = 0
        if sys.argv[3] == "fork":
            child = os.fork()
            if child == 0:  # keeps every descriptor of the loop, as a fork does
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)  # but not the test's pipes
                os.dup2(null, 2)
                time.sleep(120)
                os._exit(0)
        print(item.id, item.claim.token, child, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _killed_holding(url: str, home: Path, how: str) -> tuple[int, int, int]:
    died = subprocess.run(
        [sys.executable, "-c", _LOOP, url, str(home), how],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    item_id, token, child = (int(v) for v in died.stdout.split())
    return item_id, token, child


def test_a_work_loop_killed_holding_an_item_gives_it_back_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    try:
        q.enqueue(["a", "b"])
        item_id, _, _ = _killed_holding(pg_url, home, "plain")
        again = q.store.claim(new_runner())  # its lease has 30 s to run
        assert again is not None, "the dead loop's claim waited for its lease"
        assert (again.item_id, again.attempt, again.interrupted) == (item_id, 2, True)
    finally:
        q.close()


def test_a_fork_of_a_killed_work_loop_holds_its_item_until_it_ends(
    pg_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    try:
        q.enqueue(["a"])
        item_id, token, child = _killed_holding(pg_url, home, "fork")
        try:
            assert q.store.claim(new_runner()) is None, "handed out while its fork lives"
            _end_lease(pg_url, item_id)
            assert q.store.claim(new_runner()) is None, "handed out at its lease end"
            assert _state(pg_url, item_id) == ("running", token)
        finally:
            os.kill(child, signal.SIGKILL)
            until(lambda: gone(child), "the fork to end")
        _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
        again = q.store.claim(new_runner())
        assert again is not None
        assert (again.item_id, again.attempt, again.interrupted) == (item_id, 2, True)
    finally:
        q.close()


def test_a_runner_that_hands_claims_on_still_locks_each(pg_url: str, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    store = PostgresStore(pg_url, "q", scratch=scratch)
    try:
        store.enqueue(["a"])
        runner = new_runner()  # as `run`'s: its claims' locks go to a keeper and a child
        store.register_runner(runner)
        claim = store.claim(runner)
        assert claim is not None and claim.token is not None
        assert len(claim.inherit_fds) == 1
        assert (scratch / "claims" / f"{claim.token}.lock").exists()
        store.release(claim, "test")
        store.unregister_runner(runner.runner_id)
    finally:
        store.close()


def test_a_work_async_loop_makes_no_file_per_claim(pg_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    claims = home / ".postgres" / "q" / "claims"

    async def drain() -> list[list[str]]:
        seen = []
        async for item in q.work_async(concurrency=2):
            seen.append(sorted(p.name for p in claims.iterdir()))
            await item.done()
        return seen

    try:
        q.enqueue(["a", "b", "c"])
        seen = asyncio.run(drain())
        assert len(seen) == 3
        for names in seen:  # the runner's file alone, whatever is held
            assert len(names) == 1 and names[0].startswith("runner-"), names
        assert q.status().counts.get("done") == 3
    finally:
        q.close()
