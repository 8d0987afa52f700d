"""Issue 21 point 14: the start and the end of a ``Queue.work()`` loop on
PostgreSQL, which every one of sixteen loops pays at the start and in the
tail of a run (scripts/bench_pg.py).

- A recovery that finds another runner's reaper turn within REAP_EVERY (as
  all but one of sixteen loops do, at their start and every second after)
  ends with one look, without opening a transaction for the turn.
- A loop (not exclusive) registers without marking this host's dead runners
  stopped first: its first claim's recovery does that, so it was done twice.
  They are still marked stopped by the time the loop has its first item.

- When the last item's ``done()`` found no next item due (its fused claim),
  the loop looks (paused? a retry coming?) before its one closing claim,
  which recovers orphans and decides: two claims in all for a one-item
  queue, where it made three (a claim, the look, a claim that recovered
  again).
- That closing claim still recovers an orphan that appeared meanwhile: an
  item of a runner of this host that died while the loop worked.
- A loop's end is recorded in one statement: its runner row stopped, and one
  ``stop`` event.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from tests.pg import sql as _sql

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, reaping  # noqa: E402  (needs psycopg)


def test_a_drained_loop_ends_with_one_claim(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims: list[bool] = []
    plain_claim = PostgresStore.claim

    def counted(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
        found = plain_claim(self, *args, **kwargs)
        claims.append(found is not None)
        return found

    monkeypatch.setattr(PostgresStore, "claim", counted)
    q = Queue("q", store=pg_url, home=tmp_path / "home")
    try:
        q.enqueue(["a"])
        assert [item.done() and item.item for item in q.work()] == ["a"]
    finally:
        q.close()
    # The first item's claim, then the one closing claim (done() found no next).
    assert claims == [True, False]


_DIE_HOLDING = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1], "q", scratch=Path(sys.argv[2]))
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    print(claim.item, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_the_closing_claim_still_recovers_an_orphan_of_this_host(
    pg_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    q = Queue("q", store=pg_url, home=home)
    seen: list[tuple[str, bool]] = []
    try:
        q.enqueue(["a", "b"])
        for item in q.work():
            seen.append((item.item, item.interrupted))
            if item.item == "a":
                # Another runner of this host takes "b" and dies holding it.
                died = subprocess.run(
                    [sys.executable, "-c", _DIE_HOLDING, pg_url, str(home / ".postgres" / "q")],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert died.returncode == -signal.SIGKILL, died.stderr
                assert died.stdout.split() == ["b"]
            item.done()
    finally:
        q.close()
    assert seen == [("a", False), ("b", True)]


def test_a_loop_s_end_stops_its_runner_row_with_one_event(pg_url: str, tmp_path: Path) -> None:
    q = Queue("q", store=pg_url, home=tmp_path / "home")
    try:
        q.enqueue(["a"])
        for item in q.work():
            item.done()
    finally:
        q.close()
    rows = _sql(pg_url, "SELECT runner_id, stopped_at IS NOT NULL FROM statequeue.runners")
    assert len(rows) == 1 and rows[0][1] is True
    stops = _sql(
        pg_url,
        "SELECT body->>'runner', body ? 'by' FROM statequeue.events WHERE body->>'t' = 'stop'",
    )
    assert stops == [(rows[0][0], False)]


_DIE_REGISTERED = textwrap.dedent(
    """
    import os, signal, sys
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1], "q")
    runner = new_runner()
    store.register_runner(runner)
    print(runner.runner_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_loop_s_start_marks_dead_runners_of_this_host_once(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    died = subprocess.run(
        [sys.executable, "-c", _DIE_REGISTERED, pg_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    dead = died.stdout.strip()
    looks: list[str] = []
    plain = reaping.stop_dead_runners_here

    def counted(conn: Any, queue: str, *, host: str, boot: str, **kw: Any) -> list[str]:
        looks.append(queue)
        return plain(conn, queue, host=host, boot=boot, **kw)

    monkeypatch.setattr(reaping, "stop_dead_runners_here", counted)
    q = Queue("q", store=pg_url, home=tmp_path / "home")
    try:
        q.enqueue(["a"])
        for item in q.work():
            # By the first item: the dead runner's row is stopped, looked at once.
            assert looks == ["q"]
            stopped = _sql(
                pg_url,
                "SELECT stopped_at IS NOT NULL FROM statequeue.runners WHERE runner_id = %s",
                dead,
            )
            assert stopped == [(True,)]
            item.done()
    finally:
        q.close()


def test_a_reap_within_another_s_turn_opens_no_transaction(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = PostgresStore(pg_url, "q"), PostgresStore(pg_url, "q")
    try:
        first.enqueue(["a"])
        first.recover()  # its turn: the queue's last_reap_at is now
        opened: list[object] = []
        plain = psycopg.Connection.transaction

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            opened.append(self)
            return plain(self, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "transaction", counted)
        second.recover()
        assert opened == []
        monkeypatch.setattr(psycopg.Connection, "transaction", plain)
        _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")  # the turn is due
        before = _sql(pg_url, "SELECT last_reap_at FROM statequeue.queues")
        second.recover()
        assert _sql(pg_url, "SELECT last_reap_at IS NOT NULL FROM statequeue.queues") == [(True,)]
        assert before == [(None,)]
    finally:
        first.close()
        second.close()


def test_a_recovery_looks_up_each_runner_pid_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every loop recovers once a second: a runner's pid is read from /proc
    once per recovery, not again for each of its running items."""
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import queries

    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a", "b", "c"])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claims = [store.claim(runner) for _ in range(3)]
        assert all(c is not None for c in claims)
        looked: list[int] = []
        plain = queries.pid_gone

        def counted(pid: int) -> bool:
            looked.append(pid)
            return plain(pid)

        monkeypatch.setattr(queries, "pid_gone", counted)
        store.recover()
        # One runner of this host (this process) holds three running items.
        assert looked == [runner.pid]
        assert store.status().counts["running"] == 3  # alive: nothing recovered
    finally:
        store.close()
