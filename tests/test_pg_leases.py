"""Leases, fencing tokens and recovery by lease expiry in the PostgreSQL store
(issue 12, promises 2, 4 and 7), on the real server (tests/pg.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, OnInterrupted, Outcome
from statequeue.core.views import RecoveryReport
from tests.conftest import STATEQUEUE
from tests.pg import PgCluster
from tests.pg import sql as _sql

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)
from tests.pg_proxy import proxy_for  # noqa: E402
from tests.waiting import until  # noqa: E402

OK = Outcome(ok=True)
DEADLINE = 30.0  # generous: the machine is shared


@pytest.fixture
def stores(pg_url: str) -> Iterator[Callable[..., PostgresStore]]:
    opened: list[PostgresStore] = []

    def open_store(**kwargs: object) -> PostgresStore:
        s = PostgresStore(pg_url, "q", **kwargs)  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield open_store
    for s in opened:
        s.close()


def _total(report: RecoveryReport) -> int:
    return len(report.retried) + len(report.failed) + len(report.held)


def _state(url: str, item_id: int) -> str:
    row = _sql(
        url,
        "SELECT coalesce(l.state, i.state) FROM statequeue.items i LEFT JOIN statequeue.live l"
        " ON l.queue = i.queue AND l.id = i.id WHERE i.id = %s",
        item_id,
    )
    return str(row[0][0])


def test_claim_takes_its_lease_end_from_the_database_clock(
    stores: Callable[..., PostgresStore], pg_url: str
) -> None:
    s = stores(lease=20.0)
    s.enqueue(["a"])
    claim = s.claim(new_runner())
    assert claim is not None and claim.token is not None
    ((left,),) = _sql(
        pg_url,
        "SELECT extract(epoch FROM lease_until - clock_timestamp()) FROM statequeue.live"
        " WHERE token = %s",
        claim.token,
    )
    assert 0 < float(str(left)) <= 20.0


def test_renew_reports_exactly_the_tokens_taken_over(
    stores: Callable[..., PostgresStore], pg_url: str
) -> None:
    s = stores(lease=30.0)  # no heartbeat, no fencing deadline in this test's time
    s.enqueue(["a", "b"])
    kept, taken = s.claim(new_runner()), s.claim(new_runner())
    assert kept is not None and taken is not None
    first_end = _sql(pg_url, "SELECT lease_until FROM statequeue.live WHERE id = %s", 1)
    # Another runner took item 2 over (as after a lease expiry and a new claim).
    _sql(
        pg_url,
        "UPDATE statequeue.live SET token = nextval('statequeue.tokens') WHERE id = %s",
        taken.item_id,
    )
    assert s.renew() == {taken.token}
    assert s.lost_claims() == {taken.token}  # reported once, for the runner to fence
    assert s.lost_claims() == set()
    # The kept lease was renewed by the same statement, and is still held.
    renewed = _sql(pg_url, "SELECT lease_until FROM statequeue.live WHERE id = %s", 1)
    assert renewed[0][0] > first_end[0][0]  # type: ignore[operator]
    assert s.finish(kept, OK) is ItemState.DONE


def test_a_live_lease_survives_its_store_closing(
    stores: Callable[..., PostgresStore], pg_url: str
) -> None:
    """Liveness is the lease, not the connection: a runner whose connection
    dropped (while it lives and reconnects) keeps its item (promise 7)."""
    first = stores(lease=30.0)
    first.enqueue(["a"])
    assert first.claim(new_runner()) is not None
    first.close()
    _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")  # a reaper's turn now
    other = stores()
    assert other.recover().retried == []
    assert other.claim(new_runner()) is None
    assert _state(pg_url, 1) == "running"


@pytest.mark.parametrize(
    ("policy", "state"),
    [
        (OnInterrupted.RETRY, ItemState.PENDING),
        (OnInterrupted.FAIL, ItemState.FAILED),
        (OnInterrupted.HOLD, ItemState.HELD),
    ],
)
def test_an_expired_lease_is_recovered_by_the_policy(
    stores: Callable[..., PostgresStore], pg_url: str, policy: OnInterrupted, state: ItemState
) -> None:
    dead = stores(lease=0.5)
    dead.enqueue(["a"])
    assert dead.claim(new_runner()) is not None
    dead.close()  # no more renewals; its pid (ours) lives, so no same-host shortcut
    reaper = stores()
    report = until(
        lambda: _total(reaper.recover(on_interrupted=policy)), "the lease to expire and be reaped"
    )
    assert report == 1
    assert _state(pg_url, 1) == state.value
    if policy is OnInterrupted.RETRY:
        again = reaper.claim(new_runner())
        assert again is not None and (again.attempt, again.interrupted) == (2, True)


def test_poison_after_max_crashes_by_lease_expiry(
    stores: Callable[..., PostgresStore], pg_url: str
) -> None:
    stores().enqueue(["a"])
    for crash in (1, 2):
        dead = stores(lease=0.5)
        assert dead.claim(new_runner(), max_crashes=2) is not None
        dead.close()
        reaper = stores()
        until(
            lambda r=reaper: _total(r.recover(max_crashes=2)),  # type: ignore[misc]
            f"recovery after crash {crash}",
        )
    assert _state(pg_url, 1) == "held"
    ((reason,),) = _sql(pg_url, "SELECT reason FROM statequeue.live WHERE id = 1")
    assert "poison" in str(reason)


def test_only_one_reaper_at_a_time(stores: Callable[..., PostgresStore], pg_url: str) -> None:
    stores().enqueue(["a", "b"])
    for _ in range(2):
        dead = stores(lease=30.0)
        assert dead.claim(new_runner()) is not None
        dead.close()
    _sql(
        pg_url,
        "UPDATE statequeue.live SET lease_until = clock_timestamp() - interval '1s' WHERE id = 1",
    )
    _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")  # the claims reaped
    reapers = [stores() for _ in range(4)]
    barrier = threading.Barrier(len(reapers))
    totals: list[int] = []

    def reap(s: PostgresStore) -> None:
        barrier.wait()
        totals.append(_total(s.recover()))

    threads = [threading.Thread(target=reap, args=(s,)) for s in reapers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert sorted(totals) == [0, 0, 0, 1]
    assert _sql(pg_url, "SELECT crashes FROM statequeue.live WHERE id = 1") == [(1,)]
    # The turn is the queue's: within the interval nobody else reaps, even a
    # lease that has just expired; once the interval passed, the next reaper does.
    _sql(
        pg_url,
        "UPDATE statequeue.live SET lease_until = clock_timestamp() - interval '1s' WHERE id = 2",
    )
    assert _total(reapers[0].recover()) == 0
    _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = last_reap_at - interval '1 hour'")
    assert _total(reapers[1].recover()) == 1


_DIE_HOLDING = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from pathlib import Path
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1], "q", scratch=Path(sys.argv[2]), lease=60.0)
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    # The item's child: it inherits the claim lock, as the keeper passes it.
    child = subprocess.Popen(
        ["sleep", "60"], pass_fds=claim.inherit_fds,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    print(child.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("same_host", [True, False])
def test_dead_runner_on_this_host_is_recovered_at_once(
    stores: Callable[..., PostgresStore], pg_url: str, tmp_path: Path, same_host: bool
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    stores().enqueue(["a"])
    env = dict(os.environ)
    if not same_host:
        env["STATEQUEUE_HOST"] = "elsewhere"
    died = subprocess.run(
        [sys.executable, "-c", _DIE_HOLDING, pg_url, str(scratch)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    child = int(died.stdout.split()[0])
    reaper = stores(scratch=scratch)
    try:
        # Its runner is dead, but a process of the item lives: not yet.
        assert reaper.claim(new_runner()) is None
    finally:
        os.kill(child, signal.SIGKILL)
        until(lambda: _reaped(child), "the item's child to end")
    again = reaper.claim(new_runner())
    if same_host:  # at once, with 60 s of lease left
        assert again is not None and (again.attempt, again.interrupted) == (2, True)
    else:  # another host's pid proves nothing here: wait for the lease
        assert again is None
        assert _state(pg_url, 1) == "running"


def _reaped(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (not ours to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(") ", 1)[-1].startswith("Z")


def test_a_runner_row_deleted_by_hand_does_not_orphan_its_item(
    stores: Callable[..., PostgresStore], pg_url: str
) -> None:
    dead = stores(lease=0.5)
    dead.enqueue(["a"])
    runner = new_runner()
    dead.register_runner(runner)
    assert dead.claim(runner) is not None
    _sql(pg_url, "DELETE FROM statequeue.runners")
    dead.close()
    reaper = stores()
    until(lambda: _total(reaper.recover()), "the orphan's lease to expire")
    assert _state(pg_url, 1) == "pending"


def test_finish_retried_after_a_lost_commit_acknowledgement_is_idempotent(
    pg_cluster: PgCluster, pg_url: str
) -> None:
    """The connection drops right after COMMIT reached the server: the store
    reconnects, retries, finds the result its first try committed, and
    returns that state (one result per token)."""
    with proxy_for(pg_cluster) as proxy:
        s = PostgresStore(proxy.url(pg_url), "q")
        try:
            s.enqueue(["a"])
            runner = new_runner()
            s.register_runner(runner)  # a runner's store reconnects
            claim = s.claim(runner)
            assert claim is not None
            proxy.cut_after(b"statequeue.finish(")  # one statement: its own commit
            assert s.finish(claim, OK) is ItemState.DONE
        finally:
            s.close()
        assert proxy.cuts == 1
    assert _sql(pg_url, "SELECT count(*) FROM statequeue.results") == [(1,)]
    ends = _sql(pg_url, "SELECT count(*) FROM statequeue.events WHERE body->>'t' = 'end'")
    assert ends == [(1,)]
    assert _state(pg_url, 1) == "done"


_TAKE_OVER = textwrap.dedent(
    """
    import os, sys, psycopg
    with psycopg.connect(os.environ["TEST_PG_URL"], autocommit=True) as conn:
        (token,) = conn.execute(
            "SELECT token FROM statequeue.live WHERE id = %s", (os.environ["STATEQUEUE_ID"],)
        ).fetchone()
        print(os.environ["STATEQUEUE_LEASE_TOKEN"], token, file=open(sys.argv[1], "w"))
        conn.execute(
            "UPDATE statequeue.live SET token = nextval('statequeue.tokens') WHERE id = %s",
            (os.environ["STATEQUEUE_ID"],),
        )
    """
)


def test_run_reports_a_stale_finish_and_records_nothing(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    """The child's item is taken over while it runs (here by the child itself,
    before any renew could notice): the runner's finish changes nothing, and
    the runner says so and carries on."""
    seen = tmp_path / "tokens"
    env = dict(sq_env, STATEQUEUE_STORE=pg_url, TEST_PG_URL=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=60)
    run = subprocess.run(
        [STATEQUEUE, "run", "--lease", "30s", "--", sys.executable, "-c", _TAKE_OVER, str(seen)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "item 1 was taken over by another runner; nothing recorded" in run.stderr
    assert "Traceback" not in run.stderr
    given, held = seen.read_text().split()
    assert given == held  # the child got its claim's fencing token
    assert _sql(pg_url, "SELECT count(*) FROM statequeue.results") == [(0,)]
    assert _state(pg_url, 1) == "running"  # the new holder's, untouched


@pytest.mark.parametrize("lease", ["soon", "0.1s", "-1s"])
def test_invalid_lease_is_a_usage_error(sq_env: dict[str, str], lease: str) -> None:
    run = subprocess.run(
        [STATEQUEUE, "run", f"--lease={lease}", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), run.stderr


def test_registering_a_runner_leaves_recovery_to_its_policy(
    stores: Callable[..., PostgresStore], pg_url: str
) -> None:
    dead = stores(lease=0.5)
    dead.enqueue(["a"])
    assert dead.claim(new_runner()) is not None
    dead.close()
    until(
        lambda: _sql(pg_url, "SELECT lease_until < clock_timestamp() FROM statequeue.live")[0][0],
        "the lease to end",
    )
    _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
    runner = stores()
    runner.register_runner(new_runner())
    assert runner.recover(on_interrupted=OnInterrupted.FAIL).failed == [1]
    assert _state(pg_url, 1) == "failed"
