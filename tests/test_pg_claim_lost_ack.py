"""A claim whose acknowledgement was lost (PostgreSQL store).

Found by the cross-host restart test under heavy load: an immediate stop of
the server came after a claim had committed but before its answer reached
the runner. The runner reconnected and ran its claim again, which claimed
the next item; the first stayed running under the runner's name with a
token no process held. Its lease ran out, but on the runner's host recovery
waits while a process holds the claim's lock, and a claim with no lock file
of its own goes by its runner's file, which the live runner holds: with
--follow the item was never recovered (23 of 24 items done, for good).

Now a claim retried after a reconnect first adopts the claim its first try
committed (found by the runner and the time it sent, as the fused
finish-and-claim does since schema version 11), and recovery run by the
runner that holds a claim's runner file treats a claim of that runner it
does not hold as no process's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.core.views import RecoveryReport
from tests.pg import PgCluster
from tests.pg import sql as _sql
from tests.waiting import until

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)
from tests.pg_proxy import proxy_for  # noqa: E402

OK = Outcome(ok=True, duration=0.1, exit_code=0)


def _live(url: str) -> list[tuple[object, ...]]:
    return _sql(url, "SELECT id, state, token FROM statequeue.live ORDER BY id")


def test_a_retried_claim_adopts_the_claim_its_first_try_committed(
    pg_cluster: PgCluster, pg_url: str, tmp_path: Path
) -> None:
    with proxy_for(pg_cluster) as proxy:
        s = PostgresStore(proxy.url(pg_url), "q", scratch=tmp_path / "scratch", lease=60.0)
        try:
            s.enqueue(["a", "b"])
            runner = new_runner()
            s.register_runner(runner)  # a runner's store reconnects
            proxy.cut_after(b"statequeue.claim(")
            claim = s.claim(runner)
            assert proxy.cuts == 1
            assert claim is not None and claim.item_id == 1 and claim.attempt == 1
            assert _live(pg_url) == [(1, "running", claim.token), (2, "pending", None)]
            assert s.finish(claim, OK) is ItemState.DONE
            nxt = s.claim(runner)
            assert nxt is not None and nxt.item_id == 2
            assert s.finish(nxt, OK) is ItemState.DONE
            assert s.status().counts["done"] == 2 and s.status().counts["running"] == 0
        finally:
            s.close()
    starts = _sql(pg_url, "SELECT body->>'id' FROM statequeue.events WHERE body->>'t' = 'start'")
    assert starts == [("1",), ("2",)]


def test_the_runner_recovers_a_claim_of_its_own_that_it_does_not_hold(
    pg_url: str, tmp_path: Path
) -> None:
    """Its answer lost for good (the runner gave up on that call): the claim
    is the runner's by name, no process of it runs. Once its lease ends the
    runner's own recovery takes it back, though the runner's file is held
    (by the runner itself); another store on the host still waits, as it
    cannot tell."""
    s = PostgresStore(pg_url, "q", scratch=tmp_path / "scratch", lease=1.0)
    other = PostgresStore(pg_url, "q", scratch=tmp_path / "scratch", lease=1.0)
    try:
        s.enqueue(["a"])
        runner = new_runner()
        s.register_runner(runner)
        # The claim as the first try committed it; its answer never came.
        _sql(
            pg_url,
            "SELECT * FROM statequeue.claim('q', 0, %s, 0.5, NULL)",
            runner.runner_id,
        )
        assert _live(pg_url)[0][1] == "running"
        time.sleep(1.0)  # the lease (0.5 s) is over
        for _ in range(3):  # one reap a second (REAP_EVERY): each gets its turn
            assert other.recover() == RecoveryReport()  # another process cannot tell: it waits
            time.sleep(0.4)
        assert _live(pg_url)[0][1] == "running"
        until(lambda: s.recover().retried == [1], "the runner to take its claim back")
        assert _live(pg_url) == [(1, "pending", None)]
        again = s.claim(runner)
        assert again is not None and again.item_id == 1 and again.attempt == 2
        assert s.finish(again, OK) is ItemState.DONE
    finally:
        other.close()
        s.close()


def test_a_retried_claim_waits_for_its_first_try_still_running(
    pg_cluster: PgCluster, pg_url: str, tmp_path: Path
) -> None:
    """The cut may come while the first try still runs on the server (CI
    under load: it adopted nothing, and claimed the next item, the first one
    locked). The retry waits for the lost connection's statement to end."""
    import threading

    with proxy_for(pg_cluster) as proxy:
        s = PostgresStore(proxy.url(pg_url), "q", scratch=tmp_path / "scratch", lease=60.0)
        blocker = psycopg.connect(pg_url, autocommit=True)
        try:
            s.enqueue(["a", "b"])
            runner = new_runner()
            s.register_runner(runner)
            # The claim writes a start event: it waits at its start for this
            # lock, until after its connection was cut and the retry began.
            blocker.execute("BEGIN")
            blocker.execute("LOCK TABLE statequeue.events IN SHARE MODE")
            timer = threading.Timer(1.5, blocker.execute, ("COMMIT",))
            timer.start()
            proxy.cut_after(b"statequeue.claim(")
            claim = s.claim(runner)
            timer.join()
            assert proxy.cuts == 1
            assert claim is not None and claim.item_id == 1 and claim.attempt == 1
            assert _live(pg_url) == [(1, "running", claim.token), (2, "pending", None)]
            assert s.finish(claim, OK) is ItemState.DONE
        finally:
            s.close()
            blocker.close()


def test_a_retried_claim_outruns_no_first_try_still_on_its_way(
    pg_cluster: PgCluster, pg_url: str, tmp_path: Path
) -> None:
    """The cut may come before the first try reached the server (its bytes
    still on the way, or unread by its server process). The retry then found
    that process idle, claimed item 1, and the first try, arriving later,
    claimed item 2 for the runner with a token no process held (CI failed so
    once under load). The lost connection's server process is ended before
    the retry, so a first try still on its way never runs."""
    with proxy_for(pg_cluster) as proxy:
        s = PostgresStore(proxy.url(pg_url), "q", scratch=tmp_path / "scratch", lease=60.0)
        try:
            s.enqueue(["a", "b"])
            runner = new_runner()
            s.register_runner(runner)
            proxy.cut_after(b"statequeue.claim(", late=1.0)
            claim = s.claim(runner)
            assert proxy.cuts == 1
            assert claim is not None and claim.item_id == 1 and claim.attempt == 1
            time.sleep(1.5)  # the first try's bytes have reached the server by now
            assert _live(pg_url) == [(1, "running", claim.token), (2, "pending", None)]
            assert s.finish(claim, OK) is ItemState.DONE
        finally:
            s.close()
    starts = _sql(pg_url, "SELECT body->>'id' FROM statequeue.events WHERE body->>'t' = 'start'")
    assert starts == [("1",)]
